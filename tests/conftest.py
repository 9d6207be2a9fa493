"""Suite-wide fixtures and hooks.

    make test                      # in parallel: pytest -n 3 --dist loadgroup
    make test ARGS="-n 0"          # serially, in one process

Parallel runs (pytest-xdist) are safe by construction: every worker is a process with
its own tmp dirs, ports (bound to 0), PostgreSQL schemas (``tests/lmsp/stores.py``) and
npm install lock (``tests/npm.py``). Tests that must not share a worker's CPU with a
heavy neighbour, or that share a resource between them, are put into one
``xdist_group`` here (``--dist loadgroup`` runs a group on one worker, in order).
"""

import sys

import pytest


@pytest.fixture(params=[pytest.param("asyncio", id="asyncio"), pytest.param("trio", id="trio")])
def anyio_backend(request):
    return request.param


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Drops the PostgreSQL schemas this process created (each xdist worker its own)."""
    stores = sys.modules.get("tests.lmsp.stores")
    if stores is not None:
        stores.drop_schemas()
