# acp-server — developer commands. Every target installs what it needs first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.installed-bench
ARGS   ?=
# pytest-xdist workers for `make test` (measured on 2 cores: docs/testing.md). WORKERS=0,
# or ARGS="-n 0" / ARGS="-p no:xdist", runs the suite serially in one process.
WORKERS ?= 3
XDIST   := $(if $(findstring no:xdist,$(ARGS)),,-n $(WORKERS) --dist loadgroup)

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

# The package's bytecode, written here: the suite starts hundreds of server processes,
# and where PYTHONDONTWRITEBYTECODE is set (as on our machines) each would compile every module
# again (~1 s a start; docs/testing.md). Only changed files are compiled again.
BYTECODE := $(PY) -m compileall -q -j 0 acp_server bridge tests

test: $(STAMP)
	@$(BYTECODE)
	$(PY) -m pytest $(XDIST) $(ARGS)

serve: $(STAMP)
	@$(BYTECODE)
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
