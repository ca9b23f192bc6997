"""The compose files and the `make compose-check*` scripts, without an engine: every published port is
`127.0.0.1:${VARIABLE:-default}`, a variable README.md names; each check's port list moves every port it
publishes, and by default ports apart from every other check's; each check is a make target and brings up
every service of its compose file it checks (the HA ones every second instance too); each check removes the
images it built unless COMPOSE_CHECK_KEEP_IMAGES=1; the chaos driver kills every service of the HA profile.

The scripts run against a stand-in `docker` (first on PATH; COMPOSE_ENGINE empty) that records each call
with the MQSTORE_* environment it saw and fails `docker compose up`: what a check publishes is decided by
then, and its teardown (the images removed or kept) runs after that failure as after any other."""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
PUBLISHED = re.compile(r'^\s+- "127\.0\.0\.1:\$\{(MQSTORE_\w+_HOST_PORT):-(\d+)\}:(\d+)"')

# script, its port list variable, how many ports the list holds, its compose files, its built images
CHECKS = [
    ("compose_check.sh", "COMPOSE_CHECK_PORTS", 4, ["docker-compose.yml"], {"mqstore"}),
    ("compose_check_ha.sh", "COMPOSE_CHECK_HA_PORTS", 11, ["docker-compose.ha.yml"],
     {"mqstore", "mqstore-etcd"}),
    ("compose_check_ops.sh", "COMPOSE_CHECK_OPS_PORTS", 5, ["docker-compose.yml", "docker-compose.secure.yml"],
     {"mqstore", "mqstore-prometheus"}),
    ("compose_check_spark.sh", "COMPOSE_CHECK_SPARK_PORTS", 2, ["docker-compose.yml"], {"mqstore", "mqstore-spark"}),
    ("compose_check_chaos.sh", "COMPOSE_CHECK_CHAOS_PORTS", 11, ["docker-compose.ha.yml"],
     {"mqstore", "mqstore-etcd"}),
]

# The stand-in docker. Each image `compose config --images` names (mqstore-<kind>:<tag>, the kind from the
# service's name before any "-": etcd-1 is etcd's) names an older
# image until `docker compose build`, which moves the tag to a new one and leaves the older untagged;
# `docker images --filter dangling=true` answers those, one image untagged before the check and, once
# built, one stage image; `docker image rm` removes.
FAKE_DOCKER = r'''
import json, os, sys
log, state_file = os.environ["FAKE_DOCKER_LOG"], os.environ["FAKE_DOCKER_LOG"] + ".state"
args = sys.argv[1:]
with open(log, "a") as f:
    f.write(json.dumps({"argv": args, "env": {k: v for k, v in os.environ.items() if k.startswith("MQSTORE_")}}) + "\n")
state = json.load(open(state_file)) if os.path.exists(state_file) else {"built": False, "removed": [], "tags": []}
def save():
    json.dump(state, open(state_file, "w"))
KINDS = {"compactor": "mqstore-spark", "etcd": "mqstore-etcd", "postgres": "mqstore-postgres",
         "prometheus": "mqstore-prometheus"}
def previous(tag):
    return "sha256:previous-" + tag.split(":")[0]
if args[0] == "compose":
    i = 1
    while args[i] in ("-p", "-f"):
        i += 2
    command = args[i]
    if command == "build":
        state["built"] = True
    elif command == "config" and "--images" in args:
        tag = os.environ.get("MQSTORE_IMAGE_TAG", "dev")
        names = sorted({KINDS.get(s.split("-")[0], "mqstore") + ":" + tag for s in args[args.index("--images") + 1:]})
        state["tags"] = sorted(set(state["tags"]) | set(names))
        print("\n".join(names))
    elif command == "up":
        sys.exit(1)
elif args[0] == "images":
    untagged = ["sha256:before"] + (["sha256:stage"] + [previous(t) for t in state["tags"]] if state["built"] else [])
    print("\n".join(i for i in untagged if i not in state["removed"]))
elif args[:2] == ["image", "inspect"]:
    image, form = args[2], args[args.index("--format") + 1] if "--format" in args else ""
    if image in state["removed"]:
        sys.exit(1)
    if form == "{{.Id}}":
        print(("sha256:new-" + image.split(":")[0]) if state["built"] else previous(image))
    elif form == "{{len .RepoTags}}":
        print(0 if image.startswith(("sha256:previous-", "sha256:stage", "sha256:before")) and state["built"] else 1)
    else:
        print(300000000)
elif args[:2] == ["image", "rm"]:
    state["removed"] += args[2:]
save()
'''


def published_ports(compose_file: str) -> dict[str, list[str]]:
    """service -> the host port variables of its published ports (every ports entry must be one)."""
    ports: dict[str, list[str]] = {}
    service, in_services, in_ports = None, False, False
    for line in (ROOT / compose_file).read_text().splitlines():
        if re.match(r"^\S", line):
            in_services = line.startswith("services:")
            service = None
        elif in_services and (m := re.match(r"^  ([a-z0-9-]+):\s*$", line)):
            service, in_ports = m.group(1), False
        elif service and re.match(r"^    ports:", line):
            in_ports = True
        elif service and in_ports and re.match(r"^      - ", line):
            m = PUBLISHED.match(line)
            assert m, f"{compose_file}, {service}: {line.strip()} is not 127.0.0.1:${{VARIABLE:-default}}:port"
            ports.setdefault(service, []).append(m.group(1))
        elif re.match(r"^    \S", line):
            in_ports = False
    return ports


def run_check(tmp_path: pathlib.Path, script: str, env: dict[str, str]) -> tuple[subprocess.CompletedProcess, list]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    docker = bin_dir / "docker"
    docker.write_text(f"#!{sys.executable}\n{FAKE_DOCKER}")
    docker.chmod(0o755)
    log = tmp_path / "docker.log"
    full_env = {k: v for k, v in os.environ.items()
                if not k.startswith(("MQSTORE_", "COMPOSE_", "DOCKER_"))}
    full_env.update(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", COMPOSE_ENGINE="", PY=sys.executable,
                    FAKE_DOCKER_LOG=str(log), **env)
    done = subprocess.run(["bash", str(ROOT / "scripts" / script)], env=full_env, capture_output=True, text=True,
                          timeout=120)
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return done, calls


def test_every_published_port_is_a_variable_the_readme_names():
    names = set()
    for compose_file in sorted(p.name for p in ROOT.glob("docker-compose*.yml")):
        for variables in published_ports(compose_file).values():
            names.update(variables)
    assert {"MQSTORE_COMMITLOG_HOST_PORT", "MQSTORE_COMMITLOG_1_HOST_PORT", "MQSTORE_PROMETHEUS_HOST_PORT"} <= names
    assert sorted(n for n in names if n not in README) == [], "host port variables README.md does not name"
    for _, ports_variable, _, _, _ in CHECKS:
        assert ports_variable in README
    assert "COMPOSE_CHECK_KEEP_IMAGES" in README


@pytest.mark.parametrize("script, ports_variable, count, compose_files, _images", CHECKS)
def test_a_checks_port_list_moves_every_port_it_publishes(tmp_path, script, ports_variable, count,
                                                          compose_files, _images):
    ports = [str(61001 + i) for i in range(count)]
    done, calls = run_check(tmp_path, script, {ports_variable: " ".join(ports)})
    assert done.returncode != 0
    up = [c for c in calls if c["argv"][0] == "compose" and "up" in c["argv"]]
    assert up, done.stdout + done.stderr
    services = up[0]["argv"][up[0]["argv"].index("--wait-timeout") + 2:]
    published: dict[str, list[str]] = {}
    for compose_file in compose_files:
        for service, variables in published_ports(compose_file).items():
            published.setdefault(service, []).extend(variables)
    variables = [v for s in services for v in published.get(s, [])]
    assert variables, services
    # each port of the list once, and nothing else (no fixed port, no compose file default)
    seen = {v: up[0]["env"].get(v) for v in variables}
    assert sorted(seen.values(), key=str) == ports, seen


@pytest.mark.parametrize("keep", [False, True])
@pytest.mark.parametrize("script, _ports_variable, _count, _compose_files, images", CHECKS)
def test_a_check_removes_the_images_it_built_unless_asked_to_keep_them(tmp_path, script, _ports_variable, _count,
                                                                      _compose_files, images, keep):
    done, calls = run_check(tmp_path, script, {"COMPOSE_CHECK_KEEP_IMAGES": "1"} if keep else {})
    assert done.returncode != 0
    assert any(c["argv"][0] == "compose" and "down" in c["argv"] for c in calls), done.stdout + done.stderr
    removed = [image for c in calls if c["argv"][:2] == ["image", "rm"] for image in c["argv"][2:]]
    # the images its tags named before the build moved them, always; not the one untagged before it
    untagged_by_rebuild = {f"sha256:previous-{image}" for image in images}
    if keep:
        assert sorted(removed) == sorted(untagged_by_rebuild), done.stdout
        assert f"removed {len(images)} images a rebuild untagged; kept the images it built " \
               "(COMPOSE_CHECK_KEEP_IMAGES=1)" in done.stdout
    else:
        tag = "spark-check" if script == "compose_check_spark.sh" else "dev"
        # and its tags, and the stage image its build left
        expected = untagged_by_rebuild | {f"{image}:{tag}" for image in images} | {"sha256:stage"}
        assert sorted(removed) == sorted(expected), done.stdout
        assert f"removed {len(expected)} images" in done.stdout


def services_of(compose_file: str) -> list[str]:
    services, in_services = [], False
    for line in (ROOT / compose_file).read_text().splitlines():
        if re.match(r"^\S", line):
            in_services = line.startswith("services:")
        elif in_services and (m := re.match(r"^  ([a-z0-9-]+):\s*$", line)):
            services.append(m.group(1))
    return services


def services_brought_up(tmp_path: pathlib.Path, script: str, env: dict[str, str] | None = None):
    done, calls = run_check(tmp_path, script, env or {})
    up = [c for c in calls if c["argv"][0] == "compose" and "up" in c["argv"]]
    assert up, done.stdout + done.stderr
    return up[0]["argv"][up[0]["argv"].index("--wait-timeout") + 2:], up[0]["env"]


@pytest.mark.parametrize("script", ["compose_check_ha.sh", "compose_check_chaos.sh"])
def test_the_ha_checks_bring_up_every_service_of_the_ha_profile(tmp_path, script):
    """Every role twice (issue 34): the second instances are started and checked, not only in the file."""
    services, _ = services_brought_up(tmp_path, script)
    assert sorted(services) == sorted(services_of("docker-compose.ha.yml"))
    assert {"index-2", "txn-2", "compactor-2", "gateway-2"} <= set(services)


def test_every_check_is_a_make_target():
    makefile = (ROOT / "Makefile").read_text()
    for script, *_ in CHECKS:
        target = "compose-check" + script.removeprefix("compose_check").removesuffix(".sh").replace("_", "-")
        assert re.search(rf"^{target}: setup\n\t.*scripts/{script}$", makefile, re.M), target
        assert target in README


def test_the_checks_default_ports_are_apart(tmp_path):
    """compose-check-chaos and compose-check-ha (and the others) can run on one engine side by side."""
    used: dict[str, str] = {}
    for i, (script, *_rest) in enumerate(CHECKS):
        run_dir = tmp_path / str(i)
        run_dir.mkdir()
        _, env = services_brought_up(run_dir, script)
        ports = {v for k, v in env.items() if k.endswith("_HOST_PORT")}
        clash = {p: used[p] for p in ports if p in used}
        assert not clash, f"{script} publishes ports of {clash}"
        used.update(dict.fromkeys(ports, script))


def test_the_chaos_driver_kills_every_service_of_the_ha_profile():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import compose_chaos
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    assert sorted(s for services in compose_chaos.ROLES.values() for s in services) == \
        sorted(services_of("docker-compose.ha.yml"))
    check = (ROOT / "scripts" / "compose_check_chaos.sh").read_text()
    assert f'COMPOSE_CHECK_CHAOS_ROLES:-{",".join(compose_chaos.ROLES)}' in check


class FakeContainers:
    """The chaos loop's Docker, in memory: a killed container is down until started; healthy 0.2 s after."""

    def __init__(self, roles: dict[str, list[str]]):
        self.role_of = {service: role for role, services in roles.items() for service in services}
        self.down: set[str] = set()
        self.started_at: dict[str, float] = {}
        self.kills: list[str] = []
        self.overlaps: list[str] = []

    def kill(self, service: str) -> None:
        role = self.role_of[service]
        if any(self.role_of[other] == role for other in self.down):
            self.overlaps.append(service)
        self.down.add(service)
        self.kills.append(service)

    def start(self, service: str) -> None:
        self.down.discard(service)
        self.started_at[service] = time.monotonic()

    def healthy(self, service: str) -> bool:
        return service not in self.down and time.monotonic() - self.started_at.get(service, 0) > 0.2

    def ip(self, service: str) -> str:
        return "" if service in self.down else "10.0.0.1"


def test_the_chaos_loop_kills_one_container_of_a_role_at_a_time_and_starts_every_one_again(monkeypatch):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import compose_chaos
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    monkeypatch.setattr(compose_chaos, "in_sync_count", lambda log: 3)  # a restarted node is in sync at once
    containers = FakeContainers(compose_chaos.ROLES)
    args = argparse.Namespace(duration_s=4.0, kill_every_s=0.25, down_s=0.5, seed=7)
    chaos = compose_chaos.Chaos(containers, "127.0.0.1:9,127.0.0.1:9", list(compose_chaos.ROLES), {}, args)
    chaos.run()
    assert chaos.crash is None
    assert len(containers.kills) >= 5, containers.kills
    assert containers.overlaps == []                        # never two of one role down at once
    assert containers.down == set() and chaos.down == {}    # every killed container started again, and back
    assert all(e["killed_s"] < e["started_s"] <= e["back_s"] for e in chaos.events), chaos.events
    # times are rounded to 10 ms: their difference is compared as such (1.01 - 0.51 is 0.4999... in floats)
    assert all(round(e["started_s"] - e["killed_s"], 2) >= args.down_s for e in chaos.events), chaos.events


def test_a_check_without_a_docker_engine_says_so_and_touches_nothing(tmp_path):
    """Before: with no engine answering, the first docker call inside $(...) ended the check, exit 1 and no word."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text("#!/bin/sh\nexit 1\n")  # a docker command with no engine behind it
    (bin_dir / "docker").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MQSTORE_", "COMPOSE_", "DOCKER_"))}
    env.update(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", COMPOSE_ENGINE="", PY=sys.executable)
    done = subprocess.run(["bash", str(ROOT / "scripts" / "compose_check_chaos.sh")], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2, done
    assert "no Docker engine answers" in done.stdout and "COMPOSE_ENGINE" in done.stdout


def test_the_spark_executors_do_not_mount_the_compactors_data():
    """Issue 36 item 4: compose's Spark workers reach a round's segments through the compactor's tier
    (MQSTORE_SPARK_TIER_URL, file:// on a volume of its own), never the compactor's data volume."""
    import yaml
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    volume_of = {}
    for name, spec in services.items():
        volume_of[name] = {v.split(":")[1]: v.split(":")[0] for v in spec.get("volumes", [])}
    compactor_data = volume_of["compactor"]["/data"]
    workers = [name for name, spec in services.items()
               if "org.apache.spark.deploy.worker.Worker" in spec.get("command", [])]
    assert len(workers) == 2
    url = services["compactor"]["environment"]["MQSTORE_SPARK_TIER_URL"]
    assert url.startswith("file:///")
    tier_dir = url[len("file://"):]
    tier_volume = volume_of["compactor"][tier_dir]
    assert tier_volume != compactor_data
    for name in workers + ["spark-master"]:
        assert compactor_data not in volume_of[name].values(), f"{name} mounts the compactor's data"
    for name in workers:
        assert volume_of[name].get(tier_dir) == tier_volume, f"{name} does not reach the rounds' tier at {tier_dir}"
