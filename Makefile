# The two commands a newcomer runs: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run run-cluster test setup lint bench clean

# Set-up: system packages when missing, then the virtual environment with pinned packages.
$(STAMP): pyproject.toml scripts/setup-system.sh
	bash scripts/setup-system.sh
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

## make run: set up, then start a standalone node and run the scripted demo against it.
run: $(STAMP)
	$(BIN)/python -m litecdc demo

## make test: set up, then run the whole suite (lint and type checks included).
test: $(STAMP)
	$(BIN)/ruff check litecdc tests bench
	$(BIN)/mypy
	$(BIN)/python -m pytest -q --durations=25

lint: $(STAMP)
	$(BIN)/ruff check litecdc tests bench
	$(BIN)/mypy

## make bench: the benchmarks whose figures are in the README.
bench: $(STAMP)
	$(BIN)/python bench/bench_engine.py
	$(BIN)/python bench/bench_http.py
	$(BIN)/python bench/bench_cdc.py
	$(BIN)/python bench/bench_cluster.py
	$(BIN)/python bench/bench_pipeline.py
	$(BIN)/python bench/bench_message_sinks.py

## make run-cluster: set up, then a local 3-node cluster with its own etcd, and a failover.
run-cluster: $(STAMP)
	$(BIN)/python -m litecdc demo --cluster

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
