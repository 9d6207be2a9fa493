# acp-server — developer commands. Every target installs what it needs first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.installed-bench
ARGS   ?=

.PHONY: install test serve schemas bench clean

install: $(STAMP)

# Set-up says one line; pip speaks only on an error.
PIP := $(PY) -m pip --quiet --quiet --disable-pip-version-check

$(STAMP): pyproject.toml
	@echo "setting up $(VENV) (first run only: the package, editable, with its test extras)"
	@$(PYTHON) -m venv $(VENV)
	@$(PIP) install --upgrade pip
	@$(PIP) install -e '.[test]'
	@touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest $(ARGS)

serve: $(STAMP)
	$(VENV)/bin/acp-server serve $(ARGS)

schemas: $(STAMP)
	$(PY) -m acp_server.ops.schemas schemas
	$(PY) -m acp_server.ops.openapi openapi.json

$(BENCH_STAMP): $(STAMP)
	@$(PIP) install -e '.[test,bench]'
	@touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(PY) -m bench $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
