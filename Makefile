# acp-server — developer commands. Every target installs what it needs first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.installed-bench
ARGS   ?=

.PHONY: install test serve schemas bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest $(ARGS)

serve: $(STAMP)
	$(VENV)/bin/acp-server serve $(ARGS)

schemas: $(STAMP)
	$(PY) -m acp_server.ops.schemas schemas
	$(PY) -m acp_server.ops.openapi openapi.json

$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[test,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(PY) -m bench $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
