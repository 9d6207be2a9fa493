"""Access is decided on the path the router matches: for every route of the server and
every variant of its path (a ``//`` prefix, a doubled inner slash, a trailing slash,
``%2F``, ``/./``, ``/../``), the access the front layer applies is the access of the
route the router dispatches to, or the request is answered 404 before any route.

The route table is the one ``open_server`` composes (REST, ``/acp``, LMSP, ``/tokens``,
``/audit``, ``/metrics``, ``/openapi.json``, the console), with the real doors
(``acp_server.app.DOORS``), the real hot route, the real front layer and the indexed
router; only the endpoints and the policy are recorders.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import unquote

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from acp_server.app import DOORS, rest_config
from acp_server.http.front import FrontLayer, HotRoute, canonical_path
from acp_server.principals import CALLER_KEY, Access
from acp_server.rest import fast_routes
from acp_server.routing import IndexedRouter
from acp_server.server import open_server
from acp_server.settings import Settings

RouteRow = tuple[str, frozenset[str]]


async def _route_table(workspace: Path) -> tuple[list[RouteRow], list[str]]:
    settings = Settings(workspace=str(workspace), port=0, state_dir=str(workspace / "state"),
                        max_running_tasks=0)
    async with open_server(settings) as server:
        rows = [(r.path, frozenset(r.methods or ())) for r in server.app.router.routes
                if type(r) is Route]
        hot = list(fast_routes(server.bridge, rest_config(settings)))
    return rows, hot


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[RouteRow], list[str]]:
    return anyio.run(_route_table, tmp_path_factory.mktemp("paths"))


def test_the_table_has_every_door(table: tuple[list[RouteRow], list[str]]) -> None:
    paths = {path for path, _ in table[0]}
    for expected in ("/session/{session_id}/prompt", "/acp", "/lmsp/v1/tasks", "/tokens",
                     "/tokens/{token_name}", "/audit", "/metrics", "/openapi.json", "/"):
        assert expected in paths
    assert table[1] == ["/session/{session_id}/prompt"]


class _Principal:
    token_id = None
    kind = "bootstrap"   # holds no stream


class _Caller:
    """Records what the front layer asks of it."""

    principal = _Principal()

    def __init__(self, seen: dict[str, Any]) -> None:
        self.seen = seen

    def check(self, access: Access) -> None:
        self.seen.setdefault("access", []).append(access)


class _Policy:
    """Admits every request, with a recording caller."""

    def __init__(self, seen: dict[str, Any]) -> None:
        self.seen = seen

    def inspect(self, scope: dict[str, Any]) -> tuple[None, None]:
        scope[CALLER_KEY] = _Caller(self.seen)
        return None, None


def _front(rows: list[RouteRow], hot_paths: list[str], seen: dict[str, Any]) -> FrontLayer:
    def endpoint(path: str) -> Any:
        async def dispatched(request: Any) -> PlainTextResponse:
            seen["route"] = path
            return PlainTextResponse("routed")
        return dispatched

    routes = [Route(path, endpoint(path), methods=sorted(methods)) for path, methods in rows]
    router = IndexedRouter(routes=routes)

    def hot_handler(path: str) -> Any:
        async def handler(scope: dict[str, Any], body: bytes) -> Any:
            seen["route"] = path
            return ({"type": "http.response.start", "status": 202, "headers": []},
                    {"type": "http.response.body", "body": b"hot"})
        return handler

    hot = [HotRoute("POST", route, hot_handler(route.path)) for route in routes
           if route.path in hot_paths]
    return FrontLayer(router, _Policy(seen), doors=DOORS, hot=hot)  # type: ignore[arg-type]


def _access_of(front: FrontLayer, method: str, path: str) -> Access:
    return front.door_of(path).access(method, path)


async def _call(front: FrontLayer, method: str, raw: str) -> int:
    scope = {"type": "http", "http_version": "1.1", "method": method, "scheme": "http",
             "path": unquote(raw), "raw_path": raw.encode(), "root_path": "",
             "query_string": b"", "headers": [(b"host", b"127.0.0.1")],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await front(scope, receive, send)
    return int(sent[0]["status"])


VARIANTS = ("as_is", "leading", "inner", "trailing", "encoded_trailing", "encoded_inner",
            "dot", "dotdot", "relative", "prefixed", "empty")
NO_ROUTE = frozenset({"relative", "prefixed", "empty"})   # never dispatched


def _variant(path: str, kind: str, at: int) -> str:
    """``path`` (canonical, ``/a/b``) changed as ``kind`` says; ``at`` picks a slash."""
    slashes = [i for i, c in enumerate(path) if c == "/"]
    i = slashes[at % len(slashes)]
    if kind == "leading":
        return "/" + path
    if kind == "inner":
        return path[:i] + "/" + path[i:]
    if kind == "trailing":
        return path + "/"
    if kind == "encoded_trailing":
        return path + "%2F"
    if kind == "encoded_inner":
        return path[:i] + "%2F" + path[i + 1:] if i else "/%2F" + path[1:]
    if kind == "dot":
        return path[:i] + "/." + path[i:]
    if kind == "dotdot":
        return path[:i] + "/x/.." + path[i:]
    if kind == "relative":   # no leading slash (uvicorn answers 400; a server may not)
        return path[1:]
    if kind == "prefixed":   # ``xsession/…``: its tail is a route's path
        return "x" + path[1:]
    if kind == "empty":
        return ""
    return path


PARAM = st.one_of(st.from_regex(r"[A-Za-z0-9_~-][A-Za-z0-9._~-]{0,11}", fullmatch=True),
                  st.sampled_from(["prompt", "heartbeat", "tokens", "audit", "metrics",
                                   "lmsp", "acp", "session", "cancel"]))


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_access_applied_is_the_dispatched_routes(
        backend: str, table: tuple[list[RouteRow], list[str]], data: st.DataObject) -> None:
    rows, hot_paths = table
    path, methods = data.draw(st.sampled_from(rows), label="route")
    method = data.draw(st.sampled_from(sorted(methods)), label="method")
    concrete = "/".join(data.draw(PARAM, label=part) if part.startswith("{") else part
                        for part in path.split("/"))
    kind = data.draw(st.sampled_from(VARIANTS), label="variant")
    raw = _variant(concrete, kind, data.draw(st.integers(0, 8), label="at"))
    seen: dict[str, Any] = {}
    front = _front(rows, hot_paths, seen)

    status = anyio.run(_call, front, method, raw, backend=backend)

    dispatched = seen.get("route")
    assert dispatched is None or kind not in NO_ROUTE, (raw, dispatched)
    if dispatched is None:   # refused before any route: 404, nothing decided
        assert status == 404 and "access" not in seen, (raw, status, seen)
        assert canonical_path(unquote(raw)) is None
        return
    expected = _access_of(front, method, dispatched)
    applied = seen.get("access")
    if expected.per_message:
        assert applied is None
    else:
        assert applied == [expected], (method, raw, dispatched)
    if kind in ("as_is", "trailing", "encoded_trailing") and path != "/":
        assert canonical_path(unquote(raw)) == concrete
