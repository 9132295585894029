# Warren developer tasks (GNU make).
#
#   make install   create $(VENV) and install Warren editable with test + fast extras
#   make run       run the broker (extra flags: make run ARGS='--amqp-port 5673')
#   make test      run pytest (extra args: make test PYTEST_ARGS='-k config')
#   make lint      ruff + mypy
#   make spec      regenerate src/warren/amqp/spec.py
#   make clean     remove build and cache artefacts (keeps $(VENV) and ./data)

PYTHON ?= python3
VENV ?= .venv
PY = $(VENV)/bin/python
STAMP = $(VENV)/.installed

# When set, `make test` writes pytest's own exit status (a number) to this
# file. make itself turns every failing recipe into exit status 2, which
# hides pytest's distinctions (1 = tests failed, 5 = nothing collected, ...);
# .ci/run needs them. Empty by default, so interactive runs leave no file.
PYTEST_STATUS_FILE ?=

.PHONY: install run test lint spec clean

# Reinstall whenever pyproject.toml changes (dependencies, entry points).
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,fast]'
	touch $@

install: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/warren --data-dir ./data $(ARGS)

test: $(STAMP)
	@status=0; $(PY) -m pytest -q $(PYTEST_ARGS) || status=$$?; \
	if [ -n "$(PYTEST_STATUS_FILE)" ]; then echo "$$status" > "$(PYTEST_STATUS_FILE)"; fi; \
	exit $$status

lint: $(STAMP)
	$(PY) -m ruff check src tests tools
	$(PY) -m mypy

spec: $(STAMP)
	$(PY) tools/gen_amqp_spec.py

clean:
	rm -rf build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
	find src tests tools -name __pycache__ -type d -prune -exec rm -rf {} +
