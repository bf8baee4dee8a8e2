# Cairn's one entry point for developers and CI (.ci/run calls these targets verbatim).
# Every tool runs from the project's own virtualenv, so a fresh clone needs only Python 3.11+,
# Java 17+ and Maven. Override the interpreter with `make install PYTHON=python3.12`.

SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
KAFKA_LOCAL := $(BIN)/python deploy/local-kafka/kafka_local.py
# e.g. KAFKA_ARGS="--port 19092 --controller-port 19093 --data-dir /tmp/k"
KAFKA_ARGS ?=
PYTEST_ARGS ?=

.PHONY: help install kafka-jars lint test test-unit test-rest kafka-up kafka-down kafka-status \
	bench-engine clean distclean

help:
	@echo "make install       create $(VENV) and install cairn with its dev extras (from the lock)"
	@echo "make lock          regenerate requirements.lock and requirements-dev.lock from pyproject"
	@echo "make lint          ruff check, ruff format --check, mypy (strict)"
	@echo "make test          unit tests first, then contract/integration/fault tests (real Kafka)"
	@echo "make test-unit     only the fast tests that need no broker"
	@echo "make run           start the broker, create the topics, serve the demo agent"
	@echo "make contracts     regenerate contracts/ from service/wire (contracts-check: drift only)"
	@echo "make kafka-up      start the local Kafka broker on 127.0.0.1:9092 (data in .kafka/)"
	@echo "make kafka-down    stop it;  make kafka-status: is it serving?"
	@echo "make bench-engine  engine alone vs the reference SDK (ENGINE_BENCH_ARGS=--check ...)"
	@echo "make bench         runtime: steps/s, e2e latency, takeover (RUNTIME_BENCH_ARGS=...)"
	@echo "make bench-txn     what one partition commit costs: CPU and round trips (TXN_BENCH_ARGS=...)"
	@echo "make bench-state   session state: bytes/CPU per step, restore MB/s, RSS (STATE_BENCH_ARGS=...)"
	@echo "make bench-store   the local store's write: CPU per step, per commit or batched (STORE_BENCH_ARGS=...)"
	@echo "make bench-compare Cairn vs LangGraph+SQLite vs LangGraph+Postgres (COMPARE_BENCH_ARGS=...)"
	@echo "make bench-soak    memory of an instance as sessions come and go (SOAK_BENCH_ARGS=...)"
	@echo "make clean         remove caches;  make distclean: also $(VENV), jars and .kafka/"

# ---- setup ------------------------------------------------------------------------------------

install: $(INSTALLED)

# Every dependency comes from requirements-dev.lock (pinned, hash-checked); the second step only
# links Cairn itself and, with no index to fall back on, fails if the lock misses a requirement.
$(INSTALLED): pyproject.toml requirements-dev.lock
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { \
		echo "install: $(PYTHON) is older than Python 3.11; try make install PYTHON=python3.11" >&2; \
		exit 1; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --require-hashes \
		-r requirements-dev.lock
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-index \
		--no-build-isolation -e '.[dev]'
	@touch $@

# The lock files, from pyproject.toml: requirements-dev.lock (runtime and the dev extra: what
# make install and CI install), then requirements.lock (runtime and the image's extras: what the
# image installs), constrained by the first, so the image gets exactly the versions CI tested.
# Run after changing a dependency; versions already locked are kept unless
# LOCK_ARGS=--upgrade (or --upgrade-package NAME). uv, at the version pinned here, runs from its
# own scratch venv.
UV_VERSION := 0.13.9
UV_VENV := .cache/uv-$(UV_VERSION)
LOCK_ARGS ?=
LOCK := $(UV_VENV)/bin/uv pip compile pyproject.toml --quiet --generate-hashes --universal \
	--python-version 3.11 --custom-compile-command 'make lock' $(LOCK_ARGS)

.PHONY: lock
lock:
	@test -x $(UV_VENV)/bin/uv || { $(PYTHON) -m venv $(UV_VENV) && \
		$(UV_VENV)/bin/pip install --quiet --disable-pip-version-check 'uv==$(UV_VERSION)'; }
	$(LOCK) --extra dev -o requirements-dev.lock
	$(LOCK) --extra openai --extra anthropic --extra bedrock --extra otel -c requirements-dev.lock -o requirements.lock

kafka-jars: $(INSTALLED)
	$(KAFKA_LOCAL) jars

# ---- quality ----------------------------------------------------------------------------------

lint: $(INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/mypy deploy/local-kafka/*.py

# ---- contracts --------------------------------------------------------------------------------

# contracts/ is generated from service/wire/ and committed; tests/contract fails when it drifts.
.PHONY: contracts contracts-check bench-wire
contracts: $(INSTALLED)
	$(BIN)/python -m service.wire.export --out contracts

contracts-check: $(INSTALLED)
	$(BIN)/python -m service.wire.export --out contracts --check

bench-wire: $(INSTALLED)
	$(BIN)/python -m bench.wire_codec

# ---- tests ------------------------------------------------------------------------------------

# Both tiers run on TEST_WORKERS pytest-xdist workers (0: in this one process).
TEST_WORKERS ?= 2

# Unit tests run first and alone: a failure there stops before any broker starts.
# pytest exits 5 when it collects nothing; only the unit tier may legitimately be empty.
test: $(INSTALLED)
	@$(MAKE) --no-print-directory test-unit
	@$(MAKE) --no-print-directory test-rest

test-unit: $(INSTALLED)
	@if [ ! -d tests/unit ]; then echo "test-unit: no tests/unit directory"; exit 0; fi; \
	rc=0; $(BIN)/pytest tests/unit -q -n $(TEST_WORKERS) $(PYTEST_ARGS) || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "test-unit: no unit tests collected"; rc=0; fi; exit $$rc

# The broker tier runs on TEST_WORKERS pytest-xdist workers, each with a broker of its own and
# whole test files (their module fixtures start services once). Its tests mostly wait on the
# broker and on service processes, so two workers take half the time on two cores. ALONE runs
# after the rest, with the machine to itself, as it always ran: on two workers its four broker
# restarts take longer, and once met a defect since repaired (docs/runtime.md, "Across broker
# restarts").
ALONE := tests/faults/test_broker_restart.py
test-rest: $(INSTALLED)
	$(BIN)/pytest tests --ignore=tests/unit --ignore=$(ALONE) -q -n $(TEST_WORKERS) --dist loadfile \
		$(PYTEST_ARGS)
	$(BIN)/pytest $(ALONE) -q $(PYTEST_ARGS)

# ---- local kafka ------------------------------------------------------------------------------

kafka-up: $(INSTALLED)
	$(KAFKA_LOCAL) up $(KAFKA_ARGS)

kafka-down: $(INSTALLED)
	$(KAFKA_LOCAL) down $(KAFKA_ARGS)

kafka-status: $(INSTALLED)
	$(KAFKA_LOCAL) status $(KAFKA_ARGS)

# ---- run --------------------------------------------------------------------------------------

# The broker stays up after Ctrl-C (make kafka-down stops it); KAFKA_ARGS passes through.
.PHONY: run
run: $(INSTALLED)
	@CAIRN_PYTHON=$(BIN)/python KAFKA_ARGS="$(KAFKA_ARGS)" deploy/run-local.sh

# ---- bench ------------------------------------------------------------------------------------

# The reference SDK runs from its own scratch venv (.cache/bench-ref-venv), created on first use.
ENGINE_BENCH_ARGS ?=
bench-engine: $(INSTALLED)
	$(BIN)/python -m bench.engine_bench $(ENGINE_BENCH_ARGS)

# One service process beside a local broker (started for the run unless CAIRN_TEST_BOOTSTRAP
# names one): committed steps/s, e2e latency at half load, takeover after kill -9.
RUNTIME_BENCH_ARGS ?=
.PHONY: bench
bench: $(INSTALLED)
	$(BIN)/python bench/runtime_bench.py $(RUNTIME_BENCH_ARGS)

# What one commit of a partition costs (client CPU, broker CPU, round trips), without the service.
TXN_BENCH_ARGS ?=
.PHONY: bench-txn
bench-txn: $(INSTALLED)
	$(BIN)/python bench/txn_cost.py $(TXN_BENCH_ARGS)

# One transactional producer per partition (today) against one per instance, on the same work.
STREAMS_BENCH_ARGS ?=
.PHONY: bench-streams
bench-streams: $(INSTALLED)
	$(BIN)/python bench/txn_streams.py $(STREAMS_BENCH_ARGS)

# Session state as head + history records: bytes and CPU per step by history length, restore
# MB/s cold and warm (needs a broker: make kafka-up or CAIRN_TEST_BOOTSTRAP; skipped when none
# listens), RSS by session count. Opt-in: --restore-mb 100,1000 --sessions 200000 --runtime.
STATE_BENCH_ARGS ?=
.PHONY: bench-state
bench-state: $(INSTALLED)
	$(BIN)/python -m bench.state_bench $(STATE_BENCH_ARGS)

# The local store's write (SQLite) after every commit against batched over commits: CPU per
# step at half load and at saturation. No broker needed.
STORE_BENCH_ARGS ?=
.PHONY: bench-store
bench-store: $(INSTALLED)
	$(BIN)/python -m bench.store_write $(STORE_BENCH_ARGS)

# Cairn (as make bench) against LangGraph with its SQLite and its Postgres checkpointer on the
# same turns: steps/s at saturation, latency per step at half load, CPU per step by process.
# LangGraph runs from its own scratch venv (.cache/bench-langgraph-venv, created on first use);
# PostgreSQL from Debian's binaries (apt-get install postgresql), started for the run.
COMPARE_BENCH_ARGS ?=
.PHONY: bench-compare
bench-compare: $(INSTALLED)
	$(BIN)/python -m bench.compare_bench $(COMPARE_BENCH_ARGS)

# An instance serving sessions that come and go (invoke, cancels, a refusal, a delete) with idle
# expiry on and a small cache: resident memory after warm-up and at the end, growth per session.
SOAK_BENCH_ARGS ?=
.PHONY: bench-soak
bench-soak: $(INSTALLED)
	$(BIN)/python bench/soak.py $(SOAK_BENCH_ARGS)

# ---- housekeeping -----------------------------------------------------------------------------

clean:
	@if [ -x $(BIN)/python ]; then $(KAFKA_LOCAL) down; fi
	rm -rf .pytest_cache .mypy_cache .ruff_cache build dist *.egg-info deploy/local-kafka/target .cache
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) deploy/local-kafka/lib .kafka
