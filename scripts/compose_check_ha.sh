#!/usr/bin/env bash
# `make compose-check-ha`: docker-compose.ha.yml (the HA profile) on a real Docker engine, through its
# published ports (scripts/compose_ha_smoke.py does the gRPC side):
#
#   1. build the two images (mqstore, mqstore-etcd) and up --wait every service;
#   2. write: SYNC-replicated appends through the leader, acknowledged by the three nodes, found by both Index
#      instances; then every second instance (index-2, txn-2, compactor-2, gateway-2) and its first: each
#      SERVING (gRPC health), a transaction prepared and committed through the txn pair (one answers, the
#      standby refuses with UNAVAILABLE), a COMPACTION topic's latest values read on both compactors, a
#      message sent through each gateway (QueryRoute, SendMessage) found by both Index instances;
#   2b. kill -9 etcd-1 (the etcd member every node's client starts on) while SYNC appends run for
#      COMPOSE_CHECK_HA_ETCD_DOWN_S (8) seconds: the same leader in the same epoch, no append failed, every
#      acknowledged message there; then start it again and wait until it is healthy (back in the cluster);
#   3. kill -9 the leader's container (docker compose kill -s SIGKILL): another node is elected, takes SYNC
#      appends, holds every acknowledged message byte-identical at its offset, the index follows it;
#   4. start the killed container again: it rejoins as a replica, in sync, serving every message;
#   5. always (also on failure or Ctrl-C): docker compose down -v (project mqstore-ha-check only), and its
#      three images removed unless COMPOSE_CHECK_KEEP_IMAGES=1 (scripts/compose_engine.sh).
#
# Environment as scripts/compose_check.sh: PY, COMPOSE_ENGINE, COMPOSE_CHECK_KEEP_IMAGES,
# COMPOSE_CHECK_HA_PROJECT (mqstore-ha-check), MQSTORE_IMAGE_TAG (dev), COMPOSE_CHECK_HA_PORTS (the published
# host ports of every service it runs: the three nodes, the index, txn, the compactor, the gateway, then the
# second instances index-2, txn-2, compactor-2 and gateway-2, default
# "51161 51162 51163 51152 51153 51154 51181 51155 51157 51156 51182", apart from compose_check.sh's so both
# can run on one engine; a shorter list keeps the defaults of the ports it leaves out).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
ENGINE=${COMPOSE_ENGINE:-}
read -r N1 N2 N3 INDEX_PORT TXN_PORT COMPACTOR_PORT GATEWAY_PORT INDEX_2_PORT TXN_2_PORT COMPACTOR_2_PORT \
    GATEWAY_2_PORT <<< "${COMPOSE_CHECK_HA_PORTS:-}"
export MQSTORE_COMMITLOG_1_HOST_PORT=${N1:-51161} MQSTORE_COMMITLOG_2_HOST_PORT=${N2:-51162}
export MQSTORE_COMMITLOG_3_HOST_PORT=${N3:-51163} MQSTORE_INDEX_HOST_PORT=${INDEX_PORT:-51152}
export MQSTORE_TXN_HOST_PORT=${TXN_PORT:-51153} MQSTORE_COMPACTOR_HOST_PORT=${COMPACTOR_PORT:-51154}
export MQSTORE_GATEWAY_HOST_PORT=${GATEWAY_PORT:-51181} MQSTORE_INDEX_2_HOST_PORT=${INDEX_2_PORT:-51155}
export MQSTORE_TXN_2_HOST_PORT=${TXN_2_PORT:-51157} MQSTORE_COMPACTOR_2_HOST_PORT=${COMPACTOR_2_PORT:-51156}
export MQSTORE_GATEWAY_2_HOST_PORT=${GATEWAY_2_PORT:-51182}
N1=$MQSTORE_COMMITLOG_1_HOST_PORT N2=$MQSTORE_COMMITLOG_2_HOST_PORT N3=$MQSTORE_COMMITLOG_3_HOST_PORT
# every instance of each role, as its clients are given them (host:port,host:port)
INDEXES="127.0.0.1:$MQSTORE_INDEX_HOST_PORT,127.0.0.1:$MQSTORE_INDEX_2_HOST_PORT"
TXNS="127.0.0.1:$MQSTORE_TXN_HOST_PORT,127.0.0.1:$MQSTORE_TXN_2_HOST_PORT"
COMPACTORS="127.0.0.1:$MQSTORE_COMPACTOR_HOST_PORT,127.0.0.1:$MQSTORE_COMPACTOR_2_HOST_PORT"
GATEWAYS="127.0.0.1:$MQSTORE_GATEWAY_HOST_PORT,127.0.0.1:$MQSTORE_GATEWAY_2_HOST_PORT"
PROJECT=${COMPOSE_CHECK_HA_PROJECT:-mqstore-ha-check}
SERVICES=(etcd-1 etcd-2 etcd-3 commitlog-1 commitlog-2 commitlog-3 index index-2 txn txn-2 compactor
          compactor-2 gateway gateway-2)
BUILD_SERVICES=(commitlog-1 etcd-1)  # the images: mqstore, mqstore-etcd
NODES="127.0.0.1:$N1,127.0.0.1:$N2,127.0.0.1:$N3"
WAIT_TIMEOUT_S=300
t0=$SECONDS
say() { printf '[compose-check-ha %3d s] %s\n' $((SECONDS - t0)) "$*"; }
compose() { docker compose -p "$PROJECT" -f docker-compose.ha.yml "$@"; }

. scripts/compose_engine.sh  # DOCKER_HOST, NEAR_PORTS, $state and the teardown on exit

say "docker compose build (mqstore, mqstore-etcd)"
compose build --quiet "${BUILD_SERVICES[@]}"
say "docker compose up --wait (${SERVICES[*]})"
compose up -d --wait --wait-timeout $WAIT_TIMEOUT_S "${SERVICES[@]}"
smoke() { "${NEAR_PORTS[@]}" "$PY" scripts/compose_ha_smoke.py "$@"; }

say "write: SYNC-replicated appends through the leader, found by both Index instances"
out=$(smoke write --nodes "$NODES" --index "$INDEXES" --state "$state/acked.json")
echo "$out"
leader=$(sed -n 's/^leader=\(n[0-9]\).*/\1/p' <<< "$out")
[ -n "$leader" ] || { say "the smoke test named no leader"; exit 1; }
container="commitlog-${leader#n}"

say "every second instance: health, a transaction through the txn pair, reads on both compactors, both gateways"
smoke pairs --nodes "$NODES" --index "$INDEXES" --txn "$TXNS" --compactor "$COMPACTORS" --gateway "$GATEWAYS"

say "kill -9 etcd-1 (every node's client starts on it) while SYNC appends run: nothing may change"
rm -f "$state/steady.started" "$state/steady.stop"
smoke steady --nodes "$NODES" --state "$state/acked.json" --started "$state/steady.started" \
    --stop "$state/steady.stop" &
steady=$!
for _ in $(seq 600); do [ -e "$state/steady.started" ] || ! kill -0 $steady 2>/dev/null && break; sleep 0.1; done
compose kill -s SIGKILL etcd-1 > /dev/null
sleep "${COMPOSE_CHECK_HA_ETCD_DOWN_S:-8}"  # appends go on this long without that member
touch "$state/steady.stop"
wait $steady
say "start etcd-1 again: it rejoins the cluster"
compose up -d --no-deps --no-recreate --wait --wait-timeout 120 etcd-1

say "kill -9 the leader's container ($container, node $leader)"
killed_at=$("$PY" -c "import time; print(time.time())")
compose kill -s SIGKILL "$container" > /dev/null
smoke failover --nodes "$NODES" --index "$INDEXES" --state "$state/acked.json" \
    --killed "$leader" --killed-at "$killed_at"

say "start $container again: it rejoins as a replica"
compose start "$container" > /dev/null
smoke rejoin --nodes "$NODES" --state "$state/acked.json" --node "$leader"
say "passed"
