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

test: $(STAMP) lint typecheck imports pytest ## everything CI runs

lint: $(STAMP) ## ruff
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP) ## mypy --strict
	$(BIN)/mypy

imports: $(STAMP) ## import-linter: pure cores stay pure, services stay independent
	$(BIN)/lint-imports

pytest: $(STAMP) ## the test suite on real NATS and Redis
	$(BIN)/pytest

chaos: $(STAMP) ## 2,000 jobs while services are SIGKILLed 50 times, NATS restarted, Redis flushed, the leader frozen; prints JSON
	$(BIN)/python -m tests.chaos $(CHAOS_ARGS)

fuzz: $(STAMP) ## the fuzz tests with a large budget (1,000 examples each)
	HYPOTHESIS_PROFILE=fuzz $(BIN)/pytest tests/fuzz -q --hypothesis-show-statistics

fmt: $(STAMP) ## format and fix what ruff can
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean: ## remove the virtual environment and caches
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis build *.egg-info chaos-out

.PHONY: help install up test lint typecheck imports pytest chaos fuzz fmt clean
