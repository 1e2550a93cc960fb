# Chamber's task runner. `make help` lists the targets.
PY ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The source roots of the `chamber` namespace (see setup.py). On the path, they make new modules importable
# without reinstalling, and let import-linter and mypy see the real files behind the editable install.
ROOTS := libs/common:libs/cli:libs/sim:services/collector:services/scheduler:services/health:services/quota:services/gateway
export PYTHONPATH := $(ROOTS)$(if $(PYTHONPATH),:$(PYTHONPATH))

.DEFAULT_GOAL := help

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml setup.py
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP) ## create .venv and install Chamber with its dev tools

up: $(STAMP) ## run the whole system (embedded NATS and Redis when none answer); dev admin token in .chamber/
	CHAMBER_ADMIN_TOKEN_FILE=$${CHAMBER_ADMIN_TOKEN_FILE:-.chamber/dev-admin-token} $(BIN)/chamber up

test: $(STAMP) lint typecheck imports pytest pytest-compiled ## everything CI runs

lint: $(STAMP) ## ruff
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP) ## mypy --strict
	$(BIN)/mypy

imports: $(STAMP) ## import-linter: pure cores stay pure, services stay independent
	$(BIN)/lint-imports

pytest: $(STAMP) ## the test suite on real NATS and Redis
	$(BIN)/pytest

# The compiled core, as a wheel installs it (setup.py): built from this checkout into build/compiled/site, which
# holds all of Chamber, ahead of the source roots on the path. Without a C compiler there is nothing to test.
COMPILED := build/compiled
CORE_TESTS := tests/unit/scheduler tests/unit/quota tests/unit/test_simulator.py tests/unit/test_sim_policies.py \
	tests/unit/test_bench_smoke.py tests/integration/test_scheduling_service.py tests/integration/test_scheduler_recovery.py \
	tests/integration/test_sim_service_agree.py tests/fuzz

compiled: $(STAMP) ## build the wheel's mypyc-compiled scheduling core into build/compiled
	rm -rf $(COMPILED) build/lib.* build/bdist.*  # no module of an earlier build rides along
	CHAMBER_COMPILE=require $(BIN)/python -m pip wheel -q --no-deps --no-build-isolation -w $(COMPILED)/wheel .
	$(BIN)/python -m pip install -q --no-deps --target $(COMPILED)/site $(COMPILED)/wheel/chamber-*.whl

# pytest's own `pythonpath` (the source roots, put first) is emptied, so `chamber` is the compiled build's; the
# session checks that it is (tests/conftest.py, CHAMBER_EXPECT_CORE).
pytest-compiled: $(STAMP) ## the scheduling core's tests on its compiled build (skipped without a C compiler)
	@if ! command -v cc >/dev/null && ! command -v gcc >/dev/null; then \
		echo "pytest-compiled: no C compiler here, so no compiled core to test"; exit 0; fi; \
	$(MAKE) --no-print-directory compiled && \
	CHAMBER_EXPECT_CORE=compiled PYTHONPATH=$(COMPILED)/site:. \
	$(BIN)/pytest -q -p no:cacheprovider -o pythonpath= $(CORE_TESTS)

chaos: $(STAMP) ## 2,000 jobs while services are SIGKILLed 50 times, NATS restarted, Redis flushed, the leader frozen; prints JSON
	$(BIN)/python -m tests.chaos $(CHAOS_ARGS)

fuzz: $(STAMP) ## the fuzz tests with a large budget (1,000 examples each)
	HYPOTHESIS_PROFILE=fuzz $(BIN)/pytest tests/fuzz -q --hypothesis-show-statistics

fmt: $(STAMP) ## format and fix what ruff can
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean: ## remove the virtual environment and caches
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis build *.egg-info chaos-out

.PHONY: help install up test lint typecheck imports pytest compiled pytest-compiled chaos fuzz fmt clean
