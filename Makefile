# The two commands of the README are `make demo` and `make test`; both run
# `make setup` first, which installs everything and is safe to repeat.
SHELL := /bin/bash
GRIDFLEET := .venv/bin/gridfleet
PYTEST := .venv/bin/pytest
PYTHON := .venv/bin/python
LINT_IMPORTS := .venv/bin/lint-imports
RUFF := .venv/bin/ruff
MYPY := .venv/bin/mypy
SPHINX_BUILD := .venv/bin/sphinx-build

.PHONY: setup demo test test-fast lint rules docs clean

setup:
	@bash scripts/setup.sh

# A crawl of the 87 demo sites on the embedded default. Some demo sites are
# built to fail, so exit code 3 ("finished, some sites FAILED") is the expected end.
# Each demo is a run of its own (run id demo-<UTC time>), so it can be repeated.
# No fault is injected into the demo, so no attempt may end `lost` or `spot` and no node may be taken for dead:
# the run's own check counts those (false_losses), and the demo fails if there is one.
demo: setup
	@run=demo-$$(date -u +%Y%m%dT%H%M%SZ); rc=0; \
	$(GRIDFLEET) run --local --config examples/demo.yaml --run-id $$run || rc=$$?; \
	if [ $$rc -ne 0 ] && [ $$rc -ne 3 ]; then exit $$rc; fi; \
	$(PYTHON) scripts/demo_losses.py runs/$$run/summary.json || exit 1; \
	if [ $$rc -eq 3 ]; then echo "demo: finished; the sites built to fail are FAILED, as intended (exit 3)"; fi

# The house rules, as configured in pyproject.toml: the layers of the code (import-linter), lint rules and
# formatting (ruff), the types of every package (mypy), the sizes of modules and functions (scripts/sizes.py).
# Every tool runs even when one before it failed, so that one run reports all that is broken.
lint: setup
	@$(MAKE) --no-print-directory rules

# `make lint` without the set-up (`make test` runs it beside the tests, once set up).
rules:
	@rc=0; \
	echo "lint: layers (lint-imports)"; $(LINT_IMPORTS) || rc=1; \
	echo "lint: ruff check"; $(RUFF) check . || rc=1; \
	echo "lint: ruff format --check"; $(RUFF) format --check . || rc=1; \
	echo "lint: mypy"; $(MYPY) || rc=1; \
	echo "lint: sizes (a module over 400 lines is a warning, over 600 an error; a function over 60 an error)"; \
	$(PYTHON) scripts/sizes.py || rc=1; \
	exit $$rc

# The suite runs in one pytest-xdist session: JOBS workers (by default one more than the cores: the browser and
# twin tests spend much of their time waiting on timers, instances and browsers). The EC2 twin's tests run on a
# worker of their own, in the suite's order (the day, the lost hub and the week on one deployed stack); tests that
# must stay together run on one worker each (--dist loadgroup; the groups and why: tests/helpers/parallel.py).
# The house rules (`make rules`, what `make lint` runs) run beside the tests, and their report follows the tests'.
# `make test JOBS=1` runs it all in one process. The end of the output lists the 15 slowest tests.
#
# The suite starts hundreds of Python processes of this code (the CLI, agents, hubs, Lambdas, the pytest workers):
# each compiles every module it imports again unless Python may keep the bytecode (__pycache__, ignored by git),
# and pytest rewrites every test module's asserts again in each worker. Where the environment forbids writing it
# (PYTHONDONTWRITEBYTECODE), that costs `make test-fast` a sixth of its CPU; make's commands are allowed to.
unexport PYTHONDONTWRITEBYTECODE
JOBS ?= $(shell echo $$(( $$(nproc 2>/dev/null || echo 2) + 1 )))
PARALLEL = $(if $(filter-out 0 1,$(JOBS)),-n $(JOBS) --dist loadgroup)

# The whole suite: the house rules, then unit, adapter (moto), faults, infra, e2e (Selenium Grid + Chromium) and
# the twin's tests (the EC2 twin: namespaces, a deployed stack's day and week).
test: setup
	@lint_log=$$(mktemp); ( $(MAKE) --no-print-directory rules > "$$lint_log" 2>&1; echo $$? >> "$$lint_log.rc" ) & \
	rc=0; $(PYTEST) $(PARALLEL) --durations=15 $(PYTEST_ARGS) || rc=$$?; wait; \
	cat "$$lint_log"; lint_rc=$$(cat "$$lint_log.rc"); rm -f "$$lint_log" "$$lint_log.rc"; \
	if [ "$$lint_rc" != 0 ]; then echo "make test: the house rules failed (make lint, above)"; exit 1; fi; exit $$rc

# Everything but the browser tests, the EC2 twin's and the slow ones (a whole build, run or scan of their own): the
# loop while working, in under 2 minutes. `make test` runs them all.
test-fast: setup
	@$(PYTEST) $(PARALLEL) --durations=15 -m "not e2e and not twin and not slow" $(PYTEST_ARGS)

# The docs site (docs/, Sphinx with Markdown pages) into docs/_build/html. The reference pages are written from
# the code first, by scripts/docs_reference.py; every warning is an error, so a broken link fails the build.
docs: setup
	@if [ -f scripts/docs_reference.py ]; then $(PYTHON) scripts/docs_reference.py; fi
	@$(SPHINX_BUILD) -W --keep-going -b html docs docs/_build/html

clean:
	rm -rf .venv vendor runs .pytest_cache .mypy_cache .ruff_cache .import_linter_cache
