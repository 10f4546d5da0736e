# The interpreter the virtual environment is made from: `make install PYTHON=/usr/bin/python3.11`.
PYTHON ?= python3
PY := .venv/bin/python
BIN := .venv/bin
# Two installs, each stamped: the demo's (what it runs, with the retail desk's data) and the
# development tools' (tests, lint, the examples' SDKs), which include the demo's. `make test` or
# `make lint` after `make demo` still installs the tools.
DEMO_STAMP := .venv/.installed-demo
DEV_STAMP := .venv/.installed-dev

.PHONY: install lint format test demo bench clean

install: $(DEV_STAMP)

# Not compiled to bytecode at install: the demo's first run compiles the modules it imports, a
# fraction of what it installs.
$(DEMO_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv .venv
	$(BIN)/pip install -q --no-compile -e '.[retail]'
	touch $@

$(DEV_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv .venv
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(DEMO_STAMP) $@

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy .
	$(BIN)/lint-imports

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# The real-worker tests run in a process of their own: Celery's app state is the process's. So do
# the fault tests (processes killed, connections terminated, Redis stopped), each under a time
# limit, their figures printed (-s).
test: install
	$(BIN)/pytest -m "not worker and not faults"
	$(BIN)/pytest -m "worker and not faults"
	$(BIN)/pytest -m faults -s --timeout 240

# `make demo PORT=8080` serves on another port. seed_demo migrates in its own process, and without
# the autoreloader the server starts in one process rather than two: each loads the whole project.
PORT ?= 8000

demo: $(DEMO_STAMP)
	$(PY) manage.py seed_demo --migrate --base-url http://127.0.0.1:$(PORT)
	$(PY) manage.py runserver --noreload 127.0.0.1:$(PORT)

bench: install
	$(PY) bench/run.py

clean:
	rm -rf .venv staticfiles .pytest_cache .mypy_cache .ruff_cache .import_linter_cache *.egg-info build
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
