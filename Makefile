# foreshock — the two commands: `make demo` and `make test`. Both set themselves up.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export NUMBA_CACHE_DIR := $(CURDIR)/.venv/numba-cache

.PHONY: demo test test-fast venv bench services-up services-down clean typecheck

# The editable install is in setuptools' strict mode (a tree of links) so that mypy resolves the
# mapped names (see DESIGN.md); a new module needs the links redone, so the list of package files
# is kept in $(VENV)/.modules and the cheap --no-deps reinstall runs whenever it changes.
PKG_DIRS := core cli simulator streams detectors exporters dashboards
MODULES = $(shell find $(PKG_DIRS) -type f \( -name '*.py' -o -name '*.csv' -o -name '*.yaml' -o -name '*.json' -o -name py.typed \) -not -path '*/__pycache__/*' | sort)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	flock $(VENV)/.lock $(PY) -m pip install -q -e ".[dev,nvml]" --config-settings editable_mode=strict
	@touch $(STAMP)

venv: $(STAMP)
	@echo "$(MODULES)" | cmp -s - $(VENV)/.modules || { \
	  flock $(VENV)/.lock $(PY) -m pip install -q --no-deps -e . --config-settings editable_mode=strict \
	  && echo "$(MODULES)" > $(VENV)/.modules; }

demo: venv
	$(VENV)/bin/foreshock demo $(DEMO_ARGS)

# Service fragments: each part that needs a real server owns a .mk file with its own
# up/down targets, and adds them to SERVICES_UP / SERVICES_DOWN.
SERVICES_UP :=
SERVICES_DOWN :=
-include deploy/kafka/kafka.mk
-include deploy/prometheus/prometheus.mk

services-up: $(SERVICES_UP)
services-down: $(SERVICES_DOWN)

# `make test` installs everything, starts the real services, runs the whole suite (twice for the
# kernels: once compiled, once with NUMBA_DISABLE_JIT=1 so their bodies run as Python), type-checks,
# and stops the services whatever the outcome. The rerun as Python ignores RuntimeWarning: there
# numpy scalars warn on the overflow and NaN arithmetic the compiled kernels do silently (the same
# values: the references compare them), from the hypothesis inputs that reach it in a given run.
# The suite runs in TEST_WORKERS processes (pytest-xdist), a test file to a process: many tests
# wait on brokers, servers and worker subprocesses, so two processes on two cores take ~40 % off
# the wall time; a whole file stays on one process so its module fixtures are built once.
# A third process gained nothing on a fresh clone (suite 497 s against 502 s, 2026-12-03; 397 s on
# a second run of the same clone), and handing out the long files first ran the CPU-heavy ones
# together (592 s). TEST_WORKERS=0 runs everything in one process.
# What the warm-up leaves to the tests costs little: on a fresh clone after it, the suite (no
# broker) took 486 s, and 493 s run again with every kernel cached (2026-12-03). 47 signatures were
# compiled inside the tests, mostly helpers that unit tests call with scalars: the files that call
# them ran ~25 s longer in all (test_univariate 11 s), while other files moved by ±10 s run to run.
# While the services start (downloads, a JVM: little CPU), tests/warm_numba_cache.py fills the
# Numba cache on both cores, so that kernels are not compiled inside the tests (by several
# processes at once), and mypy runs: its verdict is printed then and counts at the end.
TEST_WORKERS ?= 2
# Through a variable, not $(MAKE) written in the recipe: make runs a recipe line naming $(MAKE)
# even under `make -n`, and this line is the whole suite.
SERVICES = $(MAKE) --no-print-directory
XDIST = $(if $(filter 0,$(TEST_WORKERS)),-p no:xdist,-n $(TEST_WORKERS) --dist loadfile)
test: venv
	@set -o pipefail; status=0; \
	  $(PY) tests/warm_numba_cache.py > $(VENV)/warm-numba.log 2>&1 & warm=$$!; \
	  $(VENV)/bin/mypy > $(VENV)/mypy.log 2>&1 & typecheck=$$!; \
	  $(SERVICES) services-up || status=$$?; \
	  if wait $$warm; then tail -n 1 $(VENV)/warm-numba.log; \
	  else echo "Numba warm-up failed (the tests compile what they need): see $(VENV)/warm-numba.log"; fi; \
	  wait $$typecheck; typed=$$?; echo "mypy: $$(tail -n 1 $(VENV)/mypy.log)"; \
	  if [ $$status -eq 0 ]; then $(VENV)/bin/pytest $(XDIST) $(PYTEST_ARGS) || status=$$?; fi; \
	  if [ $$status -eq 0 ]; then NUMBA_DISABLE_JIT=1 $(VENV)/bin/pytest $(XDIST) -q -m kernel -p no:cacheprovider \
	    -W ignore::RuntimeWarning || status=$$?; fi; \
	  if [ $$typed -ne 0 ]; then cat $(VENV)/mypy.log; echo "mypy failed (above)"; [ $$status -ne 0 ] || status=$$typed; fi; \
	  $(SERVICES) services-down; exit $$status

test-fast: venv
	$(VENV)/bin/pytest $(XDIST) -q -m "not kafka and not prometheus and not slow" $(PYTEST_ARGS)

typecheck: venv
	$(VENV)/bin/mypy

bench: venv
	$(PY) bench/run_all.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache
