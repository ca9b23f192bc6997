# Two commands on a fresh machine: `make run` and `make test`. Everything else is set up by them.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PROTOS := $(shell find protos -name '*.proto')
GEN_STAMP := services/common/mqstore_rpc/gen/.stamp

.PHONY: setup gen run test bench clean lint

setup: $(VENV)/.stamp $(GEN_STAMP)

$(VENV)/.stamp: pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip "setuptools>=68" wheel
	$(PY) -m pip install -q -r requirements.lock
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $@

$(GEN_STAMP): $(VENV)/.stamp $(PROTOS) scripts/gen_protos.py
	$(PY) scripts/gen_protos.py
	touch $@

gen: $(GEN_STAMP)

# Starts every service on 127.0.0.1 with data under ./data and SQLite metadata; Ctrl-C stops them.
run: setup
	$(PY) -m mqstore_rpc.launcher --data-dir ./data

test: setup
	$(PY) -m pytest -q $(PYTEST_ARGS)

bench: setup
	$(PY) bench/run.py $(BENCH_ARGS)
	$(PY) bench/index_bench.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) services/common/mqstore_rpc/gen build *.egg-info
