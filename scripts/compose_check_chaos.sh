#!/usr/bin/env bash
# `make compose-check-chaos`: chaos on docker-compose.ha.yml (the HA profile, every role twice or more) on a
# real Docker engine, driven by scripts/compose_chaos.py through the published ports:
#
#   1. build the two images (mqstore, mqstore-etcd) and up --wait every service (3 etcd
#      members, 3 commit log nodes, index and index-2, txn and txn-2, compactor and compactor-2,
#      gateway and gateway-2);
#   2. for COMPOSE_CHECK_CHAOS_DURATION_S (180) seconds, SIGKILL one container at random every
#      COMPOSE_CHECK_CHAOS_KILL_EVERY_S (5) seconds (docker kill; any role, never two of one role at once),
#      started again COMPOSE_CHECK_CHAOS_DOWN_S (6) seconds after its kill, while producers (SYNC, ASYNC,
#      through the gateways, transactional through the txn pair), pop consumers, a consumer committing
#      offsets and compaction readers run;
#   3. everything back, it checks: acknowledged messages lost (0), transactions committed twice or lost (0),
#      consumer offsets that went back (0), and prints per role the longest time its API was unavailable
#      (compose_chaos.py's docstring has the details); exit status non-zero when any of them fails;
#   4. always (also on failure or Ctrl-C): docker compose down -v (project mqstore-chaos only), and its three
#      images removed unless COMPOSE_CHECK_KEEP_IMAGES=1 (scripts/compose_engine.sh).
#
# Environment as scripts/compose_check_ha.sh: PY, COMPOSE_ENGINE, COMPOSE_CHECK_KEEP_IMAGES, MQSTORE_IMAGE_TAG
# (dev), COMPOSE_CHECK_CHAOS_PROJECT (mqstore-chaos), COMPOSE_CHECK_CHAOS_PORTS (the published host ports, in
# compose_check_ha.sh's order: nodes 1-3, index, txn, compactor, gateway, index-2, txn-2, compactor-2,
# gateway-2; default "53161 53162 53163 53152 53153 53154 53181 53155 53157 53156 53182", apart from the
# other checks'), COMPOSE_CHECK_CHAOS_SEED (the random choices; default the time), COMPOSE_CHECK_CHAOS_ROLES
# (the roles killed, default every one: etcd,commitlog,index,txn,compactor,gateway) and
# COMPOSE_CHECK_CHAOS_REPORT (a file for the JSON report; default none).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
ENGINE=${COMPOSE_ENGINE:-}
read -r N1 N2 N3 INDEX_PORT TXN_PORT COMPACTOR_PORT GATEWAY_PORT INDEX_2_PORT TXN_2_PORT COMPACTOR_2_PORT \
    GATEWAY_2_PORT <<< "${COMPOSE_CHECK_CHAOS_PORTS:-}"
export MQSTORE_COMMITLOG_1_HOST_PORT=${N1:-53161} MQSTORE_COMMITLOG_2_HOST_PORT=${N2:-53162}
export MQSTORE_COMMITLOG_3_HOST_PORT=${N3:-53163} MQSTORE_INDEX_HOST_PORT=${INDEX_PORT:-53152}
export MQSTORE_TXN_HOST_PORT=${TXN_PORT:-53153} MQSTORE_COMPACTOR_HOST_PORT=${COMPACTOR_PORT:-53154}
export MQSTORE_GATEWAY_HOST_PORT=${GATEWAY_PORT:-53181} MQSTORE_INDEX_2_HOST_PORT=${INDEX_2_PORT:-53155}
export MQSTORE_TXN_2_HOST_PORT=${TXN_2_PORT:-53157} MQSTORE_COMPACTOR_2_HOST_PORT=${COMPACTOR_2_PORT:-53156}
export MQSTORE_GATEWAY_2_HOST_PORT=${GATEWAY_2_PORT:-53182}
NODES="127.0.0.1:$MQSTORE_COMMITLOG_1_HOST_PORT,127.0.0.1:$MQSTORE_COMMITLOG_2_HOST_PORT"
NODES="$NODES,127.0.0.1:$MQSTORE_COMMITLOG_3_HOST_PORT"
INDEXES="127.0.0.1:$MQSTORE_INDEX_HOST_PORT,127.0.0.1:$MQSTORE_INDEX_2_HOST_PORT"
TXNS="127.0.0.1:$MQSTORE_TXN_HOST_PORT,127.0.0.1:$MQSTORE_TXN_2_HOST_PORT"
COMPACTORS="127.0.0.1:$MQSTORE_COMPACTOR_HOST_PORT,127.0.0.1:$MQSTORE_COMPACTOR_2_HOST_PORT"
GATEWAYS="127.0.0.1:$MQSTORE_GATEWAY_HOST_PORT,127.0.0.1:$MQSTORE_GATEWAY_2_HOST_PORT"
PROJECT=${COMPOSE_CHECK_CHAOS_PROJECT:-mqstore-chaos}
SERVICES=(etcd-1 etcd-2 etcd-3 commitlog-1 commitlog-2 commitlog-3 index index-2 txn txn-2 compactor
          compactor-2 gateway gateway-2)
BUILD_SERVICES=(commitlog-1 etcd-1)  # the images: mqstore, mqstore-etcd
WAIT_TIMEOUT_S=300
t0=$SECONDS
say() { printf '[compose-check-chaos %3d s] %s\n' $((SECONDS - t0)) "$*"; }
compose() { docker compose -p "$PROJECT" -f docker-compose.ha.yml "$@"; }

. scripts/compose_engine.sh  # DOCKER_HOST, NEAR_PORTS, $state and the teardown on exit

say "docker compose build (mqstore, mqstore-etcd)"
compose build --quiet "${BUILD_SERVICES[@]}"
say "docker compose up --wait (${SERVICES[*]})"
compose up -d --wait --wait-timeout $WAIT_TIMEOUT_S "${SERVICES[@]}"

say "chaos: ${COMPOSE_CHECK_CHAOS_DURATION_S:-180} s, a container killed every ${COMPOSE_CHECK_CHAOS_KILL_EVERY_S:-5} s"
report=${COMPOSE_CHECK_CHAOS_REPORT:-$state/report.json}
"${NEAR_PORTS[@]}" "$PY" scripts/compose_chaos.py --project "$PROJECT" --nodes "$NODES" --index "$INDEXES" \
    --txn "$TXNS" --compactor "$COMPACTORS" --gateway "$GATEWAYS" \
    --duration-s "${COMPOSE_CHECK_CHAOS_DURATION_S:-180}" --kill-every-s "${COMPOSE_CHECK_CHAOS_KILL_EVERY_S:-5}" \
    --down-s "${COMPOSE_CHECK_CHAOS_DOWN_S:-6}" ${COMPOSE_CHECK_CHAOS_SEED:+--seed "$COMPOSE_CHECK_CHAOS_SEED"} \
    --roles "${COMPOSE_CHECK_CHAOS_ROLES:-etcd,commitlog,index,txn,compactor,gateway}" --report "$report"
say "passed"
