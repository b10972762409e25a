# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
# Pins live in constraints.txt; torch is installed first from its CPU build so that no
# dependency can pull a multi-GB CUDA build by accident.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TORCH ?= torch==2.13.0
EXTRAS ?= transfer,demo,test

.PHONY: install demo test test-engine lint docs bench bench-hosts soak fuzz fuzz-properties mutate report screenshot clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip>=24"
	$(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet -c constraints.txt -e ".[$(EXTRAS)]"
	# An editable install leaves kvpolicy's bytecode to the first import; where bytecode writing is
	# off (PYTHONDONTWRITEBYTECODE) every cold `kvpolicy resolve` would compile its modules again.
	$(PY) -m compileall -q engine transports
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/kvpolicy lint policies/
	$(VENV)/bin/kvpolicy demo

# Two workers: the transfer and demo tests (one group, one worker, real timeouts kept) beside the
# CPU-bound read, evaluate, analyse, serving, lint, cli and report tests. PYTEST_WORKERS=0 runs everything in one process.
PYTEST_WORKERS ?= 2

test: $(STAMP)
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup

# The policy gate CI runs (lint, fmt --check and test --coverage --threshold 100, one exit code),
# then ruff (lint and format) and mypy over the package and the transfer layer, and ruff's lint over tests/
# ([tool.ruff], [tool.mypy] in pyproject.toml).
lint: $(STAMP)
	$(VENV)/bin/kvpolicy check policies/
	$(VENV)/bin/ruff check engine transports
	$(VENV)/bin/ruff check tests
	$(VENV)/bin/ruff format --check engine transports
	$(VENV)/bin/mypy engine transports

# The HTML report of the last upstream flip, and the README's screenshot of it (needs chromium).
report: $(STAMP)
	mkdir -p build
	$(VENV)/bin/kvpolicy report --from 2026.08.11 --to 2026.08.24 --configs examples/configs \
		--arch-map examples/configs/arch-map.yaml -o build/report.html

screenshot: report
	$(PY) -m tests.report.browser build/report.html docs/report.png --width 1400 --height 1100

# The policy engine's tests alone (reading, resolving, the API, the commands that print
# resolutions), in one process: tests/ mirrors engine/, so these are the folders of kvpolicy.read,
# kvpolicy.evaluate, the top-level API and kvpolicy.cli.
ENGINE_TESTS ?= tests/read tests/evaluate tests/api tests/cli

test-engine: $(STAMP)
	$(PY) -m pytest -q $(ENGINE_TESTS)

# The documentation site (mkdocs-material, strict: a broken link or a missing page fails), into
# build/docs/. The CLI reference and one page per lint rule are generated first (docs/generate.py).
docs: $(STAMP)
	$(PY) -m pip install --quiet -c constraints.txt mkdocs-material mkdocstrings-python
	$(PY) docs/generate.py
	$(VENV)/bin/mkdocs build --strict --quiet

bench: $(STAMP)
	$(PY) bench/resolve.py
	$(PY) bench/lint.py
	$(PY) bench/diff.py
	$(PY) bench/transfer.py
	$(PY) bench/probe.py
	$(PY) bench/flood.py

fuzz: $(STAMP)
	$(PY) -m pip install --quiet atheris==3.0.0
	$(PY) bench/fuzz.py load --seconds 60
	$(PY) bench/fuzz.py resolve --seconds 60

# The property tests with fresh random draws, a new printed seed each round, for PROPERTY_MINUTES.
# The gate (make test, CI) draws derandomised examples: the same commit always gets the same answer.
PROPERTY_MINUTES ?= 30

fuzz-properties: $(STAMP)
	$(PY) -m tests.property_soak --minutes $(PROPERTY_MINUTES)

# Mutation testing (cosmic-ray) of the decision core and the transfer layer's checks: each module's
# mutants against its own few tests (tests/mutation/modules.toml). Hours in all, so never part of
# `make test`; CI runs it weekly (.github/workflows/mutate.yml). It fails on a surviving mutant not
# yet reviewed into tests/mutation/survivors.md. It changes source files while it runs: never in a
# tree someone is editing. MUTATE_ARGS: modules and options, e.g.
#   make mutate MUTATE_ARGS="engine/evaluate/index.py engine/evaluate/compiler.py --minutes 20"
MUTATE_ARGS ?=

mutate: $(STAMP)
	$(PY) -m pip install --quiet -c constraints.txt -e ".[mutate]"
	$(PY) -m tests.mutation.run $(MUTATE_ARGS)

soak: $(STAMP)
	KVPOLICY_SOAK_REQUESTS=1000 $(PY) -m pytest -q -s tests/transports/test_hosts.py -k soak

bench-hosts: $(STAMP)
	$(PY) bench/transfer.py --quick --hosts netns

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
