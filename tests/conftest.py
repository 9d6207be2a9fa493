"""Suite-wide fixtures and hooks.

    make test                      # in parallel: pytest -n 3 --dist loadgroup
    make test ARGS="-n 0"          # serially, in one process

Parallel runs (pytest-xdist) are safe by construction: every worker is a process with
its own tmp dirs, ports (bound to 0), PostgreSQL schemas (``tests/lmsp/stores.py``) and
npm install lock (``tests/npm.py``). Tests that must not share a worker's CPU with a
heavy neighbour, or that share a resource between them, are put into one
group here (``SERIAL_GROUPS``: ``--dist loadgroup`` runs a group on one worker, in order).
"""

import sys

import httpx
import httpx._api
import pytest
from hypothesis import HealthCheck, settings

# No property test is timed: Hypothesis's per-example deadline (200 ms) and its
# too-slow health check fail a correct test on a loaded machine ("Unreliable test
# timings"). Loaded before any test module, so their own ``settings(...)`` inherit it.
# A failed test's report carries the log tails of its ``acp-server serve`` children;
# an error the asyncio loop only logs fails the test it was logged in.
pytest_plugins = ["tests.harness.failure_logs", "tests.harness.loop_errors"]

settings.register_profile("acp-server", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("acp-server")

# httpx's default timeout (5 s) on the suite's own clients that name none, a 30 s hang
# bound instead: a loaded machine may not run a child server for seconds, and a test
# waiting on a condition must not fail on the client's clock. (The project's code
# names its clients' timeouts; this changes none of them.)
_HANG_BOUND = httpx.Timeout(30.0)
for _made in (httpx.Client.__init__, httpx.AsyncClient.__init__,
              *(getattr(httpx._api, name) for name in (
                  "request", "get", "options", "head", "post", "put", "patch", "delete"))):
    if (_made.__kwdefaults__ or {}).get("timeout") == httpx.Timeout(5.0):
        _made.__kwdefaults__["timeout"] = _HANG_BOUND


@pytest.fixture(params=[pytest.param("asyncio", id="asyncio"), pytest.param("trio", id="trio")])
def anyio_backend(request):
    return request.param


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Drops the PostgreSQL schemas this process created (each xdist worker its own)."""
    stores = sys.modules.get("tests.lmsp.stores")
    if stores is not None:
        stores.drop_schemas()


# Tests that run one at a time, on one worker, in a parallel run (``--dist loadgroup``):
# node id prefix -> xdist group.
#  - tests/instances: each starts several servers behind HAProxy, whose health checks mark
#    a server down on one missed 200 ms check; two such set-ups at once on 2 cores make
#    each other's checks miss. (The folder is the "instances" room's; grouped from here.)
SERIAL_GROUPS = {
    "tests/instances/": "instances",
}


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):  # type: ignore[no-untyped-def]
    """``--dist loadgroup`` that also groups by ``SERIAL_GROUPS``. (xdist 3.8 groups
    ``xdist_group`` marks by rewriting ``item._nodeid``, which pytest 9.2 no longer reads:
    the marks alone group nothing. The scheduler sees node ids, so it groups here.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class SerialGroups(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            for prefix, group in SERIAL_GROUPS.items():
                if nodeid.startswith(prefix):
                    return f"group:{group}"
            return super()._split_scope(nodeid)

    return SerialGroups(config, log)
