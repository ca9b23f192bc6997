# Sourced by every scripts/compose_check*.sh, after they define `say` and `compose` (and, if they want the
# failure logs of some services only, LOG_SERVICES). The Docker engine the check runs on. ENGINE (their COMPOSE_ENGINE) is a script with `up [--base IMAGE]`
# and `exec CMD...`, such as the private engine's engine.sh: it is started if needed (on the Dockerfile's
# base image), DOCKER_HOST points at it, and NEAR_PORTS is the prefix that runs a command where the
# published ports are. With ENGINE empty, the ambient DOCKER_HOST is used and the ports are reached directly.
NEAR_PORTS=()
if [ -n "$ENGINE" ]; then
    base=$(sed -n 's/^ARG PYTHON_IMAGE=//p' Dockerfile)
    say "engine: $ENGINE up --base $base"
    host=$("$ENGINE" up --base "$base" | sed -n 's/^export DOCKER_HOST=//p')
    [ -n "$host" ] || { say "the engine printed no DOCKER_HOST"; exit 1; }
    export DOCKER_HOST=$host
    NEAR_PORTS=("$ENGINE" exec)
fi

# $state: a scratch directory for the check. On any exit the project is torn down with its volumes (after
# the services' last logs when the check failed) and $state removed: a check never leaves containers behind.
state=$(mktemp -d)
cleanup() {
    status=$?
    trap - EXIT INT TERM
    if [ $status -ne 0 ]; then
        say "FAILED (exit $status); the services' last logs:"
        compose logs --no-color --tail 30 ${LOG_SERVICES[@]+"${LOG_SERVICES[@]}"} 2>&1 || true
    fi
    say "tearing down (docker compose down -v)"
    compose down -v --timeout 30 > /dev/null 2>&1 || say "docker compose down failed"
    rm -rf "$state"
    exit $status
}
trap cleanup EXIT
trap 'exit 130' INT TERM
