# The two commands of the README's quick start. Both create the environment when it is missing
# and reinstall only when pyproject.toml changed since the last install.

PYTHON ?= python3
# Test processes (pytest-xdist): the suite's learning tests train on one thread each, so two
# workers use a two-core machine's second core (6 minutes with two on a quiet machine). Spark's
# tests are left spread over both: grouping them on one worker (--dist loadgroup) measured
# 450 s against 358 s, its worker the last to finish.
TEST_WORKERS ?= 2
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed

.PHONY: run test lint bench

run: $(INSTALLED)
	$(BIN)/horizon run examples/cartpole_dqn.toml --overwrite

test: $(INSTALLED)
	$(BIN)/python -m pytest -n $(TEST_WORKERS)

bench: $(INSTALLED)
	$(BIN)/python benchmarks/run_all.py

lint: $(INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

$(INSTALLED): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(INSTALLED)
