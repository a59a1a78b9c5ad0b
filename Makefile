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
BROWSER := $(VENV)/.browser

.PHONY: run test lint bench

run: $(INSTALLED)
	$(BIN)/horizon run examples/cartpole_dqn.toml --overwrite

test: $(INSTALLED) $(BROWSER)
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

# The report tests open pages in a real headless Chromium (tests/browser.py), which comes from the
# system's packages, not from pip. When the harness finds no browser (its own search, so
# $HORIZON_CHROMIUM counts), root with apt-get installs one, refreshing the package lists and
# trying once more if the first install fails (stale lists name versions no longer served).
# Without a browser those tests skip, so a failure here prints why and the build carries on.
# The stamp records that this ran, not that it succeeded: delete it to try again.
APT_INSTALL_CHROMIUM := DEBIAN_FRONTEND=noninteractive \
	apt-get install -y --no-install-recommends chromium
$(BROWSER): | $(INSTALLED)
	@if (cd tests && ../$(BIN)/python -c \
		'import browser, sys; sys.exit(not browser.find_chromium())'); then :; \
	elif [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then \
		echo "no Chromium, and installing one needs root and apt-get: browser tests will skip"; \
	elif ! $(APT_INSTALL_CHROMIUM) && ! { apt-get update && $(APT_INSTALL_CHROMIUM); }; then \
		echo "apt-get could not install chromium (see above): browser tests will skip"; \
	fi
	touch $(BROWSER)
