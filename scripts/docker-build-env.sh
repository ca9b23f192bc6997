# Sourced (`. ./docker-build-env.sh`) by the Dockerfile's steps that download packages: applies the
# build arguments. Nothing it sets outlives the RUN step that sources it.
#   PIP_INDEX_URL   a private package index; empty = pip's default (or the base image's pip.conf)
#   EXTRA_CA_CERTS  PEM text of CA certificates to trust for these downloads (a TLS-inspecting proxy,
#                   the private index's CA). Kept in /tmp for the step: not added to the image's trust store.
if [ -z "${PIP_INDEX_URL:-}" ]; then
    unset PIP_INDEX_URL   # an empty value would mean "no index" to pip
fi
APT_CA_OPTION=""
if [ -n "${EXTRA_CA_CERTS:-}" ]; then
    cat /etc/ssl/certs/ca-certificates.crt > /tmp/build-ca-bundle.pem
    printf '%s\n' "$EXTRA_CA_CERTS" >> /tmp/build-ca-bundle.pem
    export PIP_CERT=/tmp/build-ca-bundle.pem
    APT_CA_OPTION="-o Acquire::https::CAInfo=/tmp/build-ca-bundle.pem"
fi
