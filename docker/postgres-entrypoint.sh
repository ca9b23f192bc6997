#!/bin/sh
# The postgres image of Dockerfile.ha: on the first start (no $PGDATA/PG_VERSION) initdb with a superuser
# `mqstore` whose password is POSTGRES_PASSWORD and a database `mqstore`; every start then runs postgres
# in the foreground, listening on the container's network (password logins only from there).
set -eu
: "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    pwfile=$(mktemp)
    printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
    initdb -D "$PGDATA" --username=mqstore --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 \
        --encoding=UTF8 > /dev/null
    rm -f "$pwfile"
    echo "host all all 0.0.0.0/0 scram-sha-256" >> "$PGDATA/pg_hba.conf"
    pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start > /dev/null
    createdb -U mqstore mqstore
    pg_ctl -D "$PGDATA" -m fast -w stop > /dev/null
fi
exec postgres -D "$PGDATA" -c listen_addresses='*'
