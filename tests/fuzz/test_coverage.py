"""The fuzz suite drives everything the server serves and reads: every operation of
``acp_server.ops.openapi.OPERATIONS`` (every REST and LMSP route: a test elsewhere
checks that every mounted route is one) is a route of ``test_rest`` or ``test_lmsp``,
each query parameter it documents is a key of the fuzzed query strings, every request
header the server reads is a fuzzed header, and every ``/acp`` method the dispatcher
handles is a fuzzed method (over Streamable HTTP and the WebSocket). A route, header or
method added without fuzz coverage fails here. Quick: nothing is served."""

from __future__ import annotations

import re
from pathlib import Path

from acp_server.acp_http import dispatch
from acp_server.ops.openapi import OPERATIONS, REQUEST_HEADERS
from tests.fuzz import test_lmsp, test_rest
from tests.fuzz.strategies import ACP_METHODS, HEADER_NAMES, QUERY_KEYS

ROOT = Path(__file__).resolve().parents[2] / "acp_server"
# read by the server and driven by another fuzz test (``test_heads``: Host; every
# test: the Content-Type it sends, the Content-Length of its bodies)
DRIVEN_ELSEWHERE = {"host", "content-type", "content-length"}
# the code reading a request header by name (what ``HEADER_NAMES`` must hold)
READ = re.compile(r"""headers\.(?:get|getlist)\(\s*["']([A-Za-z0-9-]+)["']""")
# the packages that serve (the clients, the connect adapter and the model agent's
# outbound client read their peers' answers, not requests)
SERVING = ("http", "rest", "lmsp", "acp_http", "fleet", "web")


def _pattern(path: str) -> re.Pattern[str]:
    return re.compile("^" + re.sub(r"\\\{[a-z_]+\\\}", "[^/]+", re.escape(path)) + "$")


def _fuzzed_routes() -> list[tuple[str, str]]:
    routes = [*test_rest.ROUTES, *test_lmsp.ROUTES]
    return [(m, re.sub(r"\{[a-z]+\}", "x", path)) for m, path in routes]


def test_every_operation_is_a_fuzzed_route() -> None:
    fuzzed = _fuzzed_routes()
    missing = [f"{op.method} {op.path}" for op in OPERATIONS
               if not any(m == op.method and _pattern(op.path).match(p) for m, p in fuzzed)]
    assert not missing, f"routes with no fuzz coverage (add them to test_rest/test_lmsp " \
                        f"ROUTES): {missing}"


def test_every_documented_query_parameter_is_fuzzed() -> None:
    missing = sorted({q.name for op in OPERATIONS for q in op.query} - set(QUERY_KEYS))
    assert not missing, f"query parameters no fuzzed query string has: {missing}"


def test_every_request_header_read_is_fuzzed() -> None:
    read = {name.lower() for name in REQUEST_HEADERS}
    for package in SERVING:
        for module in (ROOT / package).rglob("*.py"):
            read |= {name.lower() for name in READ.findall(module.read_text())}
    from acp_server.acp_http import streamable
    from acp_server.http import clients
    read |= {streamable.CONNECTION_HEADER, streamable.SESSION_HEADER,
             clients.FORWARDED_BY_HEADER.decode(), clients.FORWARDED_FOR_HEADER.decode(),
             clients.FORWARDED_PROOF_HEADER.decode(), clients.XFF.decode(),
             "origin", "authorization", "access-control-request-method"}   # the guard's
    missing = sorted(read - set(HEADER_NAMES) - DRIVEN_ELSEWHERE)
    assert not missing, f"request headers no fuzz test sends: {missing}"


def test_every_acp_method_is_fuzzed() -> None:
    handled = {"initialize", *dispatch.METHODS, *dispatch.V1_METHODS, *dispatch.FORWARDED,
               *dispatch.SESSION_SCOPED}
    missing = sorted(handled - set(ACP_METHODS))
    assert not missing, f"/acp methods no fuzzed message names: {missing}"


def test_the_check_sees_a_gap() -> None:
    """The checks above fail on what they should: a route, a query parameter, a
    method no fuzz test names."""
    fuzzed = _fuzzed_routes()
    assert not any(m == "GET" and _pattern("/session/{session_id}/nope").match(p)
                   for m, p in fuzzed)
    assert any(m == "GET" and _pattern("/session/{session_id}/status").match(p)
               for m, p in fuzzed)
    assert "nope" not in QUERY_KEYS and "session/nope" not in ACP_METHODS
