# Two commands on a fresh machine: `make run` and `make test`. Everything else is set up by them.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PROTOS := $(shell find protos -name '*.proto')
GEN_STAMP := services/common/mqstore_rpc/gen/.stamp

.PHONY: setup setup-run setup-ha gen run run-ha run-tls node-example test test-suite test-loaded bench clean lint compose-check compose-check-spark compose-check-ops compose-check-ha compose-check-chaos rmq-clients

# Stamps per group of lock files, so that `make run` installs only what running needs and `make test`
# adds the rest. Each step says what it does: the first `make run` takes a few minutes, most of it here.
#   run:  requirements.lock (runtime), requirements-build.lock (the codec's Cython, the stub generator,
#         pip itself) and requirements-tools.lock (grpcurl, for the examples)
#   dev:  requirements-test.lock and requirements-spark.lock on top (make test, make bench, CI)
RUN_LOCKS := requirements.lock requirements-build.lock requirements-tools.lock
DEV_LOCKS := requirements-test.lock requirements-spark.lock
VENV_STAMP := $(VENV)/.stamp-venv
RUN_STAMP := $(VENV)/.stamp-run
DEV_STAMP := $(VENV)/.stamp-dev

# The compiled codec (mqstore.codec, Cython) is built by the package's own build (setup.py), here
# with `pip install -e .`; its sources changing rebuilds it.
CODEC_SOURCES := setup.py $(wildcard core/mqstore/codec/*.pyx core/mqstore/codec/*.pxd)
CODEC_STAMP := $(VENV)/.stamp-codec

# The Node.js example (examples/node): its pinned packages, for its test; skipped without npm.
NODE_EXAMPLE := examples/node
NODE_STAMP := $(NODE_EXAMPLE)/node_modules/.stamp

# What `make run` needs; `make setup` is everything (tests, Spark, the Node.js example).
setup-run: $(RUN_STAMP) $(CODEC_STAMP) $(GEN_STAMP)
setup: setup-run $(DEV_STAMP) $(NODE_STAMP)

$(VENV_STAMP):
	@echo "make: creating the virtual environment $(VENV)"
	$(PYTHON) -m venv $(VENV)
	touch $@

$(RUN_STAMP): $(VENV_STAMP) pyproject.toml $(RUN_LOCKS)
	@echo "make: installing the runtime and build dependencies ($(RUN_LOCKS); ~1 min)"
	$(PY) -m pip install -q $(addprefix -r ,$(RUN_LOCKS))
	touch $@

$(DEV_STAMP): $(RUN_STAMP) $(DEV_LOCKS)
	@echo "make: installing the test and Spark dependencies ($(DEV_LOCKS); ~1-2 min)"
	$(PY) -m pip install -q $(addprefix -r ,$(DEV_LOCKS))
	touch $@

$(CODEC_STAMP): $(RUN_STAMP) $(CODEC_SOURCES)
	@echo "make: compiling the codec (Cython to C, then gcc; ~30-60 s) and installing the package"
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $@

$(GEN_STAMP): $(RUN_STAMP) $(PROTOS) scripts/gen_protos.py
	@echo "make: generating the gRPC stubs from protos/"
	$(PY) scripts/gen_protos.py
	touch $@

gen: $(GEN_STAMP)

# The official RocketMQ 5 clients the gateway's tests and bench drive, pinned: the Python client in a venv
# of its own (its generated protobuf modules clash with our stubs of the same protos in one process),
# the Node client by npm ci from tests/clients/node/package-lock.json (needs node >= 16.19 and npm).
RMQ_VENV := .venv-rmq
RMQ_PY_STAMP := $(RMQ_VENV)/.stamp
NODE_CLIENT := tests/clients/node
NODE_CLIENT_STAMP := $(NODE_CLIENT)/node_modules/.stamp

rmq-clients: $(RMQ_PY_STAMP) $(NODE_CLIENT_STAMP)

$(RMQ_PY_STAMP): requirements-rmq-client.lock
	@echo "make: installing the official RocketMQ 5 Python client into $(RMQ_VENV) (requirements-rmq-client.lock)"
	$(PYTHON) -m venv $(RMQ_VENV)
	$(RMQ_VENV)/bin/python -m pip install -q -r requirements-rmq-client.lock
	touch $@

$(NODE_CLIENT_STAMP): $(NODE_CLIENT)/package.json $(NODE_CLIENT)/package-lock.json
	@echo "make: installing the official RocketMQ 5 Node.js client (npm ci in $(NODE_CLIENT))"
	cd $(NODE_CLIENT) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

$(NODE_STAMP): $(NODE_EXAMPLE)/package.json $(NODE_EXAMPLE)/package-lock.json
	@if command -v npm >/dev/null 2>&1; then \
	  echo "make: installing the Node.js example's packages (npm ci in $(NODE_EXAMPLE))"; \
	  (cd $(NODE_EXAMPLE) && npm ci --no-audit --no-fund --loglevel=error) && touch $@; \
	else \
	  echo "make: npm not found: the Node.js example's test will be skipped"; \
	fi

# The Node.js example's packages, for `node examples/node/example.js` (README, "Other languages"): as
# above, but without npm it fails saying so instead of skipping.
node-example:
	@command -v npm >/dev/null 2>&1 || { echo "make: npm not found: install Node.js (>= 16) with npm, then make node-example again"; exit 1; }
	@$(MAKE) --no-print-directory $(NODE_STAMP)

# Starts every service on 127.0.0.1 with data under ./data and SQLite metadata; Ctrl-C stops them.
# It installs only what running needs (setup-run). RUN_ARGS go to the launcher, for example
# RUN_ARGS="--commitlog-port 61051 --index-port 61052 --txn-port 61053 --compactor-port 61054"
# (python -m mqstore_launcher --help lists them).
run: setup-run
	$(PY) -m mqstore_launcher --data-dir ./data $(RUN_ARGS)

# etcd for the replication tests and `make run-ha`: Debian's etcd-server (3.4.23 in bookworm) when no etcd
# is on PATH. Needs root (CI and the dev machines are); without it the HA tests skip and say why.
setup-ha:
	@command -v etcd >/dev/null 2>&1 || { DEBIAN_FRONTEND=noninteractive apt-get update -qq </dev/null && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server </dev/null >/dev/null; } || \
	  echo "setup-ha: could not install etcd-server (apt-get as root); the replication failover tests will skip" >&2

# Three CommitLog replicas (automatic failover through an etcd cluster of three members e1 e2 e3, every node
# given every member) and the other services on 127.0.0.1. RUN_ARGS move the ports as for `make run`: n1 is
# on --commitlog-port, n2 and n3 10 and 20 above it unless --commitlog-n2-port / --commitlog-n3-port say
# otherwise; etcd's e1 on --etcd-port (2379) and --etcd-peer-port (2380), e2 and e3 10 and 20 above them
# unless --etcd-e2-port, --etcd-e2-peer-port, ... say otherwise.
run-ha: setup-run setup-ha
	$(PY) -m mqstore_launcher --data-dir ./data-ha --ha $(RUN_ARGS)

# The same with TLS everywhere: a throwaway CA and certificates in ./data/tls (openssl); clients trust
# data/tls/ca.pem (grpcurl -cacert, mqstore --tls-ca / MQSTORE_TLS_CA). MQSTORE_AUTH=on adds authentication.
run-tls: setup-run
	$(PY) -m mqstore_launcher --data-dir ./data --tls $(RUN_ARGS)

# The linter first (seconds): a finding fails the run before the suite starts.
# The whole suite on the codec the build gave (compiled, where a C compiler is), then the codec tests
# again on the pure-Python reference. The suite runs as TEST_SHARDS pytest processes side by side
# (scripts/run_suite.py: most of its time is spent waiting for processes, leases and restarts, which the
# other shard fills); TEST_SHARDS=1 runs it as one.
TEST_SHARDS ?= 2
test: setup setup-ha lint rmq-clients
	$(MAKE) --no-print-directory test-suite

test-suite: setup rmq-clients
	$(PY) scripts/run_suite.py --shards $(TEST_SHARDS) -- -q $(PYTEST_ARGS)
	MQSTORE_PURE_PYTHON=1 $(PY) -m pytest -q -m codec $(PYTEST_ARGS) || [ $$? -eq 5 ]  # 5: PYTEST_ARGS chose no codec test

# The same suite while a CPU hog keeps every core busy (scripts/cpu_hog.py: one busy process per core,
# each bounded in time and ended with its parent): the suite must pass on a loaded machine the first
# time. RUNS=3 runs it three times in a row and stops at the first failure.
RUNS ?= 1
test-loaded: setup setup-ha lint rmq-clients
	@for run in $$(seq $(RUNS)); do \
	  echo "make: test-loaded: run $$run of $(RUNS) under a CPU hog"; \
	  $(PY) scripts/cpu_hog.py -- $(MAKE) --no-print-directory test-suite || exit $$?; \
	done

lint: $(DEV_STAMP)
	$(VENV)/bin/ruff check .

# docker-compose.yml on a real Docker engine (not part of `make test`; minutes, see README.md "Docker"):
# build once, up, a smoke test through the published ports, restart, data kept, always torn down. Every
# compose-check* removes the images it built at its end unless COMPOSE_CHECK_KEEP_IMAGES=1.
# COMPOSE_ENGINE: the private engine's script (used when present); empty = the ambient DOCKER_HOST.
COMPOSE_ENGINE ?= $(wildcard /work/shared/tools/docker/engine.sh)
compose-check: setup
	COMPOSE_ENGINE="$(COMPOSE_ENGINE)" PY=$(PY) scripts/compose_check.sh

# The compactor's round with engine=SPARK on compose's standalone Spark master and workers (not part of
# `make test`; ~14 min, see README.md "Docker"): build, up, the rounds, GetLatest, a generated round larger
# than an executor on the cluster and locally (identical files), always torn down.
compose-check-spark: setup
	COMPOSE_ENGINE="$(COMPOSE_ENGINE)" PY=$(PY) scripts/compose_check_spark.sh

# docker-compose.secure.yml (TLS and authentication) with Prometheus on a real engine (not part of `make
# test`; a few minutes, see README.md "Docker"): build, up, smoke test over TLS, Prometheus checked, torn down.
compose-check-ops: setup
	COMPOSE_ENGINE="$(COMPOSE_ENGINE)" PY=$(PY) scripts/compose_check_ops.sh

# docker-compose.ha.yml (the HA profile: etcd, PostgreSQL, three commit log nodes, the other services) on a
# real engine (not part of `make test`; minutes, see README.md "Docker"): build, up, kill -9 the leader's
# container, appends go on through the new leader with every acknowledged message kept, the old leader
# rejoins; always torn down.
compose-check-ha: setup
	COMPOSE_ENGINE="$(COMPOSE_ENGINE)" PY=$(PY) scripts/compose_check_ha.sh

# Chaos on docker-compose.ha.yml (every role twice or more) on a real engine (not part of `make test`; ~3 min
# of chaos plus the build and up, see README.md "Docker"): for COMPOSE_CHECK_CHAOS_DURATION_S (180) seconds a
# container of any role killed with SIGKILL every few seconds and started again, under producers (SYNC,
# ASYNC, through the gateways, transactional), pop consumers, offset commits and compaction readers; then no
# acknowledged message lost, no transaction committed twice or lost, no consumer offset gone back, and per
# role its longest unavailability; always torn down.
compose-check-chaos: setup
	COMPOSE_ENGINE="$(COMPOSE_ENGINE)" PY=$(PY) scripts/compose_check_chaos.sh

# Every script runs even when one before it failed (each writes what it measured); the exit status says
# whether any failed. Disk: bench/README.md ("What it needs").
BENCH_SCRIPTS := run.py index_bench.py compactor.py txn.py txn_nagle.py pop.py filters.py gateway.py replication.py failover.py security.py auth_flood.py concurrency.py offsets.py timer.py tier_reads.py tier_upload.py tier_local_disk.py
bench: setup rmq-clients
	@failed=""; for script in $(BENCH_SCRIPTS); do \
	  args="$(BENCH_ARGS)"; case $$script in txn.py|txn_nagle.py|pop.py|filters.py|gateway.py|replication.py|failover.py|auth_flood.py|concurrency.py|tier_upload.py|tier_local_disk.py) args="$(filter --quick,$(BENCH_ARGS))";; esac; \
	  echo "make bench: bench/$$script $$args"; \
	  $(PY) bench/$$script $$args || failed="$$failed $$script"; \
	done; \
	if [ -n "$$failed" ]; then echo "make bench: failed:$$failed (the others ran; see above)" >&2; exit 1; fi

clean:
	rm -rf $(VENV) $(RMQ_VENV) $(NODE_CLIENT)/node_modules $(NODE_EXAMPLE)/node_modules services/common/mqstore_rpc/gen build *.egg-info core/*.egg-info
	rm -f core/mqstore/codec/*.c core/mqstore/codec/*.so
