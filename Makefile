# The two commands of the README's quick start. Both create the environment when it is missing
# and reinstall only when pyproject.toml changed since the last install.

PYTHON ?= python3
# Test processes (pytest-xdist): the suite's learning tests train on one thread each, so two
# workers use a two-core machine's second core: 6 to 15 minutes, as the machine's speed drifts.
# Measured on one tree: 358 s with two workers against 450 s with Spark's tests grouped on one
# of them (--dist loadgroup; its worker finished last); three workers took longer still (1,127 s
# against 1,005 s on a slower day). Two matmul-bound tests side by side slow each other by a
# quarter here, so the learning tests are left spread through the files' order.
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
