# Two commands on a fresh machine: `make run` and `make test`. Everything else is set up by them.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PROTOS := $(shell find protos -name '*.proto')
GEN_STAMP := services/common/mqstore_rpc/gen/.stamp

.PHONY: setup setup-ha gen run run-ha test bench clean lint compose-check compose-check-spark rmq-clients

# The compiled codec (mqstore.codec, Cython) is built by the package's own build (setup.py), here
# with `pip install -e .`; its sources changing rebuilds it.
CODEC_SOURCES := setup.py $(wildcard core/mqstore/codec/*.pyx core/mqstore/codec/*.pxd)
CODEC_STAMP := $(VENV)/.stamp-codec

setup: $(VENV)/.stamp $(CODEC_STAMP) $(GEN_STAMP)

# Every lock file (runtime, build tools, tests, Spark), exact pins; pip itself is pinned in the build lock.
LOCKS := requirements.lock requirements-build.lock requirements-test.lock requirements-spark.lock

$(VENV)/.stamp: pyproject.toml $(LOCKS)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(addprefix -r ,$(LOCKS))
	touch $@

$(CODEC_STAMP): $(VENV)/.stamp $(CODEC_SOURCES)
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $@

$(GEN_STAMP): $(VENV)/.stamp $(PROTOS) scripts/gen_protos.py
	$(PY) scripts/gen_protos.py
	touch $@

gen: $(GEN_STAMP)

# The official RocketMQ 5 clients the gateway's tests and bench drive, pinned: the Python client in a venv
# of its own (its generated protobuf modules clash with our stubs of the same protos in one process),
# the Node client by npm ci from tests/clients/node/package-lock.json (needs node >= 16.19 and npm).
RMQ_VENV := .venv-rmq
RMQ_PY_STAMP := $(RMQ_VENV)/.stamp
NODE_CLIENT := tests/clients/node
NODE_STAMP := $(NODE_CLIENT)/node_modules/.stamp

rmq-clients: $(RMQ_PY_STAMP) $(NODE_STAMP)

$(RMQ_PY_STAMP): requirements-rmq-client.lock
	$(PYTHON) -m venv $(RMQ_VENV)
	$(RMQ_VENV)/bin/python -m pip install -q -r requirements-rmq-client.lock
	touch $@

$(NODE_STAMP): $(NODE_CLIENT)/package.json $(NODE_CLIENT)/package-lock.json
	cd $(NODE_CLIENT) && npm ci --no-audit --no-fund
	touch $@

# Starts every service on 127.0.0.1 with data under ./data and SQLite metadata; Ctrl-C stops them.
run: setup
	$(PY) -m mqstore_rpc.launcher --data-dir ./data

# etcd for the replication tests and `make run-ha`: Debian's etcd-server (3.4.23 in bookworm) when no etcd
# is on PATH. Needs root (CI and the dev machines are); without it the HA tests skip and say why.
setup-ha:
	@command -v etcd >/dev/null 2>&1 || { DEBIAN_FRONTEND=noninteractive apt-get update -qq </dev/null && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server </dev/null >/dev/null; } || \
	  echo "setup-ha: could not install etcd-server (apt-get as root); the replication failover tests will skip" >&2

# Three CommitLog replicas (automatic failover through a throwaway etcd) and the other services on 127.0.0.1.
run-ha: setup setup-ha
	$(PY) -m mqstore_rpc.launcher --data-dir ./data-ha --ha

# The linter first (seconds): a finding fails the run before the suite starts.
# The whole suite on the codec the build gave (compiled, where a C compiler is), then the codec tests
# again on the pure-Python reference.
test: setup setup-ha lint rmq-clients
	$(PY) -m pytest -q $(PYTEST_ARGS)
	MQSTORE_PURE_PYTHON=1 $(PY) -m pytest -q -m codec $(PYTEST_ARGS) || [ $$? -eq 5 ]  # 5: PYTEST_ARGS chose no codec test

lint: setup
	$(VENV)/bin/ruff check .

# docker-compose.yml on a real Docker engine (not part of `make test`; ~1 minute, see README.md "Docker"):
# build once, up, a smoke test through the published ports, restart, data kept, always torn down.
# COMPOSE_ENGINE: the private engine's script (used when present); empty = the ambient DOCKER_HOST.
COMPOSE_ENGINE ?= $(wildcard /work/shared/tools/docker/engine.sh)
compose-check: setup
	COMPOSE_ENGINE="$(COMPOSE_ENGINE)" PY=$(PY) scripts/compose_check.sh

# The compactor's round with engine=SPARK on compose's standalone Spark master and worker (not part of
# `make test`; a few minutes, see README.md "Docker"): build, up, the round, GetLatest, always torn down.
compose-check-spark: setup
	COMPOSE_ENGINE="$(COMPOSE_ENGINE)" PY=$(PY) scripts/compose_check_spark.sh

# Every script runs even when one before it failed (each writes what it measured); the exit status says
# whether any failed. Disk: bench/README.md ("What it needs").
BENCH_SCRIPTS := run.py index_bench.py compactor.py txn.py pop.py gateway.py replication.py
bench: setup rmq-clients
	@failed=""; for script in $(BENCH_SCRIPTS); do \
	  args="$(BENCH_ARGS)"; case $$script in txn.py|pop.py|gateway.py|replication.py) args="$(filter --quick,$(BENCH_ARGS))";; esac; \
	  echo "make bench: bench/$$script $$args"; \
	  $(PY) bench/$$script $$args || failed="$$failed $$script"; \
	done; \
	if [ -n "$$failed" ]; then echo "make bench: failed:$$failed (the others ran; see above)" >&2; exit 1; fi

clean:
	rm -rf $(VENV) $(RMQ_VENV) $(NODE_CLIENT)/node_modules services/common/mqstore_rpc/gen build *.egg-info core/*.egg-info
	rm -f core/mqstore/codec/*.c core/mqstore/codec/*.so
