#!/usr/bin/env bash
# `make compose-check-ops`: docker-compose.yml + docker-compose.secure.yml on a real Docker engine: TLS and
# authentication on the lean services (commitlog, index, txn, gateway), Prometheus scraping them.
#
#   1. a throwaway CA (python -m mqstore_rpc.tls_certs --readable-keys) in a temporary directory;
#   2. build the mqstore image and the Prometheus image (Debian's package; deploy/prometheus/Dockerfile);
#   3. up --wait (the health checks speak TLS); scripts/compose_ops_smoke.py through the published ports:
#      plaintext and missing credentials refused, a user and a rule made as `service`, the user's calls
#      allowed and denied as its rule says, the index following over TLS, an SDK key made on the commit log
#      signing a RocketMQ call the gateway accepts (a wrong one refused), Prometheus' targets up, its
#      alert rules loaded and the appends counted;
#   4. always: docker compose down -v, and the images removed unless COMPOSE_CHECK_KEEP_IMAGES=1.
#
# Environment as scripts/compose_check.sh: PY, COMPOSE_ENGINE, MQSTORE_IMAGE_TAG, COMPOSE_CHECK_KEEP_IMAGES;
# COMPOSE_CHECK_OPS_PROJECT (default mqstore-ops), COMPOSE_CHECK_OPS_PORTS (the published host ports of the
# commit log, the index, txn, the gateway and Prometheus, default "53051 53052 53053 53081 59090"; a
# shorter list keeps the defaults of the ports it leaves out).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
ENGINE=${COMPOSE_ENGINE:-}
PROJECT=${COMPOSE_CHECK_OPS_PROJECT:-mqstore-ops}
read -r LOG_PORT INDEX_PORT TXN_PORT GATEWAY_PORT PROMETHEUS_PORT <<< "${COMPOSE_CHECK_OPS_PORTS:-}"
export MQSTORE_COMMITLOG_HOST_PORT=${LOG_PORT:-53051} MQSTORE_INDEX_HOST_PORT=${INDEX_PORT:-53052}
export MQSTORE_TXN_HOST_PORT=${TXN_PORT:-53053} MQSTORE_GATEWAY_HOST_PORT=${GATEWAY_PORT:-53081}
export MQSTORE_PROMETHEUS_HOST_PORT=${PROMETHEUS_PORT:-59090}
export MQSTORE_INTERNAL_TOKEN=${MQSTORE_INTERNAL_TOKEN:-ops-check-$RANDOM$RANDOM$RANDOM}
SERVICES=(commitlog index txn gateway prometheus)
BUILD_SERVICES=(commitlog prometheus)  # the images: mqstore and mqstore-prometheus
WAIT_TIMEOUT_S=300
t0=$SECONDS
say() { printf '[compose-check-ops %3d s] %s\n' $((SECONDS - t0)) "$*"; }
compose() { docker compose -p "$PROJECT" -f docker-compose.yml -f docker-compose.secure.yml "$@"; }

. scripts/compose_engine.sh  # DOCKER_HOST, NEAR_PORTS, $state and the teardown on exit

"$PY" -m mqstore_rpc.tls_certs "$state/tls" --readable-keys
chmod 755 "$state" "$state/tls"
export MQSTORE_TLS_DIR=$state/tls

say "docker compose build (mqstore and Prometheus images)"
compose build --quiet "${BUILD_SERVICES[@]}"
say "docker compose up --wait ${SERVICES[*]} (TLS and authentication on)"
compose up -d --wait --wait-timeout $WAIT_TIMEOUT_S "${SERVICES[@]}"
say "services healthy over TLS; smoke test"
"${NEAR_PORTS[@]}" "$PY" scripts/compose_ops_smoke.py --commitlog "localhost:$MQSTORE_COMMITLOG_HOST_PORT" \
    --index "localhost:$MQSTORE_INDEX_HOST_PORT" --gateway "localhost:$MQSTORE_GATEWAY_HOST_PORT" --prometheus "127.0.0.1:$MQSTORE_PROMETHEUS_HOST_PORT" \
    --ca "$state/tls/ca.pem" --token "$MQSTORE_INTERNAL_TOKEN"
say "passed"
