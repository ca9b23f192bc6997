#!/usr/bin/env bash
# `make compose-check-spark`: the compactor's heavy round on docker-compose.yml's standalone Spark cluster,
# on a real Docker engine, through the published ports.
#
#   1. build the two images once (docker compose build commitlog compactor: mqstore and mqstore-spark,
#      tagged MQSTORE_IMAGE_TAG, default spark-check, so that a concurrent `make compose-check` keeps
#      its mqstore:dev) and print their sizes;
#   2. docker compose up --wait commitlog, compactor, spark-master, spark-worker-1, spark-worker-2; wait
#      until the master lists both workers ALIVE;
#   3. scripts/compose_smoke.py spark: a COMPACTION topic with overwritten keys and a tombstone,
#      Compact(engine=SPARK) on every queue, GetLatest answers the latest values;
#   4. the round ran on the cluster: the compactor logged compaction.spark_job with master
#      spark://spark-master:7077 and an application id per round, and the master lists each of those
#      applications as FINISHED; and no JVM of those rounds is left <defunct> in the compactor's container
#      (docker-compose.yml gives it an init process);
#   5. a round larger than an executor (python -m mqstore_spark.cluster_round in the compactor's container,
#      the driver): COMPOSE_CHECK_SPARK_ROUND="<records> <keys> [<key bytes>]" (default "3000000 2600000 256":
#      to find the latest offset per key by itself one executor would hold 2.6M keys of 256 bytes and an
#      8-byte offset each, 686 MB, 1.28x an executor's whole 512m heap) generated under the compactor's
#      volume (~1.1 GB a copy), run on the cluster through the compactor's tier (MQSTORE_SPARK_TIER_URL,
#      file:///tier: the workers do not mount the compactor's volume) and by the local engine, every file
#      compared byte for byte;
#      its JSON line is printed. Measured at 38b9d8d (2 cores, load average 7-12 from other work): make
#      compose-check-spark passed in 811 s (build 219 s, up 22 s, smoke rounds 207 s, this round 353 s);
#      3,000,000 records (1.11 GB) over 2,600,000 keys of 256 B, generated in 60 s, local engine 50.9 s,
#      Spark 221.6 s on both workers, identical files, keys_and_offsets_over_executor_memory 1.279;
#   6. always (also on failure or Ctrl-C): docker compose down -v (project mqspark: containers, network
#      and volumes of this check only), and its two images removed unless COMPOSE_CHECK_KEEP_IMAGES=1.
#
# Environment: PY, COMPOSE_ENGINE, COMPOSE_CHECK_KEEP_IMAGES as for scripts/compose_check.sh;
# COMPOSE_CHECK_SPARK_PORTS (published host ports of commitlog and compactor, default "52051 52054"; a
# shorter list keeps the default of the port it leaves out).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
ENGINE=${COMPOSE_ENGINE:-}
read -r LOG_PORT COMPACTOR_PORT <<< "${COMPOSE_CHECK_SPARK_PORTS:-}"
LOG_PORT=${LOG_PORT:-52051} COMPACTOR_PORT=${COMPACTOR_PORT:-52054}
read -r ROUND_RECORDS ROUND_KEYS ROUND_KEY_BYTES <<< "${COMPOSE_CHECK_SPARK_ROUND:-3000000 2600000 256}"
export MQSTORE_COMMITLOG_HOST_PORT=$LOG_PORT MQSTORE_COMPACTOR_HOST_PORT=$COMPACTOR_PORT
export MQSTORE_IMAGE_TAG=${MQSTORE_IMAGE_TAG:-spark-check}
PROJECT=mqspark
SERVICES=(commitlog compactor spark-master spark-worker-1 spark-worker-2)
BUILD_SERVICES=(commitlog compactor)  # the images: mqstore and mqstore-spark
LOG_SERVICES=("${SERVICES[@]}")
MASTER=spark://spark-master:7077
WAIT_TIMEOUT_S=300
t0=$SECONDS
say() { printf '[compose-check-spark %3d s] %s\n' $((SECONDS - t0)) "$*"; }
compose() { docker compose -p "$PROJECT" "$@"; }

. scripts/compose_engine.sh  # DOCKER_HOST, NEAR_PORTS, $state and the teardown on exit

# The master's state (its web UI's JSON, inside its container: the UI is not published).
master_json() {
    compose exec -T spark-master python -c "import sys, urllib.request as u
sys.stdout.write(u.urlopen('http://127.0.0.1:8080/json/', timeout=5).read().decode())"
}

say "docker compose build commitlog compactor (mqstore:$MQSTORE_IMAGE_TAG, mqstore-spark:$MQSTORE_IMAGE_TAG)"
compose build --quiet "${BUILD_SERVICES[@]}"
for image in "mqstore:$MQSTORE_IMAGE_TAG" "mqstore-spark:$MQSTORE_IMAGE_TAG"; do
    say "image $image: $(( $(docker image inspect "$image" --format '{{.Size}}') / 1000000 )) MB"
done

say "docker compose up --wait ${SERVICES[*]}"
compose up -d --wait --wait-timeout $WAIT_TIMEOUT_S "${SERVICES[@]}"
for _ in $(seq 1 120); do
    alive=$(master_json 2>/dev/null | "$PY" -c "import json, sys; print(json.load(sys.stdin)['aliveworkers'])" \
            2>/dev/null || true)
    [ "${alive:-0}" -ge 2 ] && break
    sleep 0.5
done
[ "${alive:-0}" -ge 2 ] || { say "the master lists ${alive:-0} of 2 workers after 60 s"; exit 1; }
say "healthy; the master lists $alive worker(s); smoke test (spark)"
"${NEAR_PORTS[@]}" "$PY" scripts/compose_smoke.py spark --commitlog "127.0.0.1:$LOG_PORT" \
    --compactor "127.0.0.1:$COMPACTOR_PORT"

jobs=$(compose logs --no-color compactor | grep '"compaction.spark_job"' || true)
apps=$(printf '%s\n' "$jobs" | grep -F "\"master\": \"$MASTER\"" | grep -o 'app-[0-9]*-[0-9]*' | sort -u || true)
[ -n "$apps" ] || { say "the compactor logged no Spark job on $MASTER:"; printf '%s\n' "$jobs"; exit 1; }
master_json | "$PY" -c "import json, sys
finished = {a['id'] for a in json.load(sys.stdin)['completedapps'] if a['state'] == 'FINISHED'}
missing = set(sys.argv[1:]) - finished
sys.exit(f'the master has not finished {sorted(missing)} (finished: {sorted(finished)})' if missing else 0)" $apps
say "the rounds ran on $MASTER as applications $(echo $apps), all FINISHED there"
# No JVM of a finished round is left <defunct> in the compactor's container (its init reaps them).
zombies=$(compose exec -T compactor python -c "import os
print(sum(1 for p in os.listdir('/proc') if p.isdigit() and open(f'/proc/{p}/stat').read().rsplit(') ', 1)[1][0] == 'Z'))")
[ "$zombies" = 0 ] || { say "the compactor's container holds $zombies defunct process(es) after the rounds"; exit 1; }
say "no defunct process left in the compactor's container"
say "a round of $ROUND_RECORDS records over $ROUND_KEYS keys of ${ROUND_KEY_BYTES:-14} bytes on $MASTER" \
    "(executors of 512m) and locally"
compose exec -T compactor python -m mqstore_spark.cluster_round --dir /data/cluster-round \
    --records "$ROUND_RECORDS" --keys "$ROUND_KEYS" ${ROUND_KEY_BYTES:+--key-bytes "$ROUND_KEY_BYTES"} \
    --master "$MASTER" --executor-memory 512m
say "passed"
