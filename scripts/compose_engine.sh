# Sourced by scripts/compose_check.sh and scripts/compose_check_spark.sh, after they define `say`: the
# Docker engine the check runs on. ENGINE (their COMPOSE_ENGINE) is a script with `up [--base IMAGE]`
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
