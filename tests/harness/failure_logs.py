"""A pytest plugin (``tests/conftest.py`` loads it for the whole suite): a failed test's
report carries the tails of its servers' logs, every ``ServeProcess`` among its
fixtures' values (into tuples and lists), so a failure under load in CI is read from
the servers' own words, not guessed at. A server writes its log every 50 ms
(``request_log.AccessWriter``): each live one is asked ``GET /health`` first and its
log read once that request's line is in it (at most ``FLUSH_WAIT_S``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

TAIL_CHARS = 6000
FLUSH_WAIT_S = 3.0
_PROBE = "GET /health "


def _servers(values: Any) -> Iterator[Any]:
    for value in values:
        if hasattr(value, "stderr_text"):
            yield value
        elif isinstance(value, (tuple, list)):
            yield from _servers(value)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    for n, server in enumerate(_servers(getattr(item, "funcargs", {}).values())):
        text = _flushed(server)
        report.sections.append((f"server {n} ({getattr(server, 'base_url', '?')}): "
                                "its log's tail", text[-TAIL_CHARS:]))


def _flushed(server: Any) -> str:
    """Its log once a ``GET /health`` made now is in it (or as it is, when the server
    is gone or the line does not come in ``FLUSH_WAIT_S``)."""
    seen = server.stderr_text().count(_PROBE)
    try:
        server.http.get("/health", timeout=FLUSH_WAIT_S)
    except Exception:   # noqa: BLE001 - killed, paused or broken: its log as it is
        return server.stderr_text()
    deadline = time.monotonic() + FLUSH_WAIT_S
    while (text := server.stderr_text()).count(_PROBE) <= seen \
            and time.monotonic() < deadline:
        time.sleep(0.02)
    return text
