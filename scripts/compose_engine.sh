# Sourced by every scripts/compose_check*.sh, after they define `say`, `compose` and BUILD_SERVICES (the
# services whose images the check builds; and, if they want the failure logs of some services only,
# LOG_SERVICES). The Docker engine the check runs on. ENGINE (their COMPOSE_ENGINE) is a script with `up [--base IMAGE]`
# and `exec CMD...`, such as the private engine's engine.sh: it is started if needed (on the Dockerfile's
# base image), DOCKER_HOST points at it, and NEAR_PORTS is the prefix that runs a command where the
# published ports are. With ENGINE empty, the ambient DOCKER_HOST is used and the ports are reached directly.
# COMPOSE_CHECK_LOGS_DIR (any check): every service's whole log written there (<service>.log) before the teardown.
NEAR_PORTS=()
if [ -n "$ENGINE" ]; then
    base=$(sed -n 's/^ARG PYTHON_IMAGE=//p' Dockerfile)
    say "engine: $ENGINE up --base $base"
    host=$("$ENGINE" up --base "$base" | sed -n 's/^export DOCKER_HOST=//p')
    [ -n "$host" ] || { say "the engine printed no DOCKER_HOST"; exit 1; }
    export DOCKER_HOST=$host
    NEAR_PORTS=("$ENGINE" exec)
fi
# Without a Docker engine every later docker call would fail inside a $(...) and `set -e` would end the check
# without a word: say what is missing instead.
if ! command -v docker > /dev/null 2>&1; then
    say "no docker command on PATH: set COMPOSE_ENGINE to an engine script (make sets it to" \
        "/work/shared/tools/docker/engine.sh when that exists) or install Docker with Compose v2"
    exit 2
fi
if ! docker info > /dev/null 2>&1; then
    say "no Docker engine answers at ${DOCKER_HOST:-the default socket}: start one, or set COMPOSE_ENGINE"
    exit 2
fi

# The images. At its end (also on failure or Ctrl-C) a check removes the images its build untagged: the
# image one of its tags named before, when the build moved the tag to a new image (a rebuild after a
# change). Unless COMPOSE_CHECK_KEEP_IMAGES=1 (then the next check finds them; with the classic builder
# they are its build cache), it also removes the images it built: the tags of BUILD_SERVICES (`compose
# config --images`) and every image untagged since it began (the classic builder's stage images). An
# image a running container uses stays, named; images untagged before the check are left alone.
KEEP_IMAGES=${COMPOSE_CHECK_KEEP_IMAGES:-0}
untagged() { docker images --quiet --no-trunc --filter dangling=true 2> /dev/null | sort -u; }
check_images() { compose config --images "${BUILD_SERVICES[@]}" 2> /dev/null | sort -u; }
untagged_before=$(untagged)
tagged_before=$(for image in $(check_images); do docker image inspect "$image" --format '{{.Id}}' 2> /dev/null || true; done)
remove_images() {
    local image removed=0 kept=()
    remove_image() {
        [[ " ${kept[*]} " == *" $1 "* ]] && return 0  # in use: named once
        if docker image inspect "$1" > /dev/null 2>&1; then
            if docker image rm "$1" > /dev/null 2>&1; then removed=$((removed + 1)); else kept+=("$1"); fi
        fi
    }
    for image in $tagged_before; do
        if [ "$(docker image inspect "$image" --format '{{len .RepoTags}}' 2> /dev/null)" = 0 ]; then remove_image "$image"; fi
    done
    if [ "$KEEP_IMAGES" = 1 ]; then
        say "removed $removed images a rebuild untagged; kept the images it built (COMPOSE_CHECK_KEEP_IMAGES=1)${kept[*]:+; in use, kept: ${kept[*]}}"
        return 0
    fi
    for image in $(check_images) $(comm -13 <(echo "$untagged_before") <(untagged)); do
        remove_image "$image"
    done
    # Removing a tag can leave its former stage images untagged: once more for those.
    for image in $(comm -13 <(echo "$untagged_before") <(untagged)); do
        remove_image "$image"
    done
    say "removed $removed images (COMPOSE_CHECK_KEEP_IMAGES=1 keeps those it built)${kept[*]:+; in use, kept: ${kept[*]}}"
    return 0
}

# $state: a scratch directory for the check. On any exit the project is torn down with its volumes (after
# the services' last logs when the check failed), the images removed as above and $state removed: a check
# never leaves containers behind.
state=$(mktemp -d)
cleanup() {
    status=$?
    trap - EXIT INT TERM
    if [ $status -ne 0 ]; then
        say "FAILED (exit $status); the services' last logs:"
        compose logs --no-color --tail 30 ${LOG_SERVICES[@]+"${LOG_SERVICES[@]}"} 2>&1 || true
    fi
    if [ -n "${COMPOSE_CHECK_LOGS_DIR:-}" ]; then  # every service's whole log, kept for a later look
        mkdir -p "$COMPOSE_CHECK_LOGS_DIR"
        for service in $(compose ps -a --services 2>/dev/null); do
            compose logs --no-color --timestamps "$service" > "$COMPOSE_CHECK_LOGS_DIR/$service.log" 2>&1 || true
        done
        say "the services' logs: $COMPOSE_CHECK_LOGS_DIR"
    fi
    say "tearing down (docker compose down -v)"
    compose down -v --timeout 30 > /dev/null 2>&1 || say "docker compose down failed"
    remove_images
    rm -rf "$state"
    exit $status
}
trap cleanup EXIT
trap 'exit 130' INT TERM
