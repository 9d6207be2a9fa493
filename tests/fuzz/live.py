"""The in-process server (``tests.harness.local_server``), run in a blocking portal so that
hypothesis (synchronous) drives it over real HTTP and WebSocket, on either backend; or
the shipped daemon (granian, ``tests.harness.ServeProcess``) driven over HTTP/2.

    with live_server(tmp_path, "trio") as live:        # hypercorn under trio
        live.http.post("/session", json={})             # a sync httpx client
        live.portal.call(async_fn, ...)                 # run in the server's event loop
    with live_daemon(tmp_path) as live:                 # acp-server serve, HTTP/2 client
        ...                                             # (the portal only runs clients)
    with live_on_postgres(tmp_path) as live:            # asyncio, the store on PostgreSQL
        ...                                             # (skipped without one configured)

The bridge runs without session / queue caps (a fuzz run creates many sessions), so
every answer the doors give is a documented 4xx or a success.

``live.sendable(body)``: False for a body past 64 KiB on hypercorn, whose answer to a
body the route does not read may be lost; uvicorn drains such a body, and so does our
front layer over HTTP/2 (``tests/hostile/test_unread_bodies.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio.from_thread
import httpx
import pytest

from bridge import BridgeOptions
from tests.harness.local import local_server
from tests.harness.process import ServeProcess
from tests.lmsp import stores

OPTIONS = BridgeOptions(max_sessions=0, max_pending_prompts_per_session=0)


@dataclass
class Live:
    base_url: str
    http: httpx.Client
    portal: anyio.from_thread.BlockingPortal
    session_id: str
    task_id: str
    connection_id: str
    body_cap: int | None = None   # bodies past it are not sent (see the docstring)

    def sendable(self, body: bytes | None) -> bool:
        return self.body_cap is None or body is None or len(body) <= self.body_cap


UNREAD_BODY_SAFE = 64 * 1024   # granian and hypercorn read at least this much unasked


@contextlib.asynccontextmanager
async def _serve(workspace: Path, store: Any) -> Any:
    async with local_server(workspace, options=OPTIONS, max_running_tasks=4,
                            lmsp_store=store) as srv:
        yield srv.base_url


@contextlib.contextmanager
def live_server(workspace: Path, backend: str, *, store: Any = None) -> Iterator[Live]:
    """``store``: the LMSP task store (and session journal) to serve, an unopened
    ``TaskStore`` (default: SQLite in the state folder)."""
    with anyio.from_thread.start_blocking_portal(backend) as portal, \
            portal.wrap_async_context_manager(_serve(workspace, store)) as base_url, \
            httpx.Client(base_url=base_url, timeout=15) as http:
        live = _seeded(base_url, http, portal)
        live.body_cap = UNREAD_BODY_SAFE if backend == "trio" else None
        yield live
        assert_healthy(http)


@contextlib.contextmanager
def live_on_postgres(workspace: Path) -> Iterator[Live]:
    """``live_server`` (asyncio) with its tasks and session journal on PostgreSQL: a
    client's strings reach its queries (a NUL it cannot hold), not SQLite's. Skipped
    unless ``ACP_SERVER_TEST_POSTGRES`` names one (``tests.lmsp.stores``)."""
    if not stores.postgres_dsn():
        pytest.skip(stores.SKIP_POSTGRES)
    store = stores.STORE_FACTORIES["postgres"](workspace, "fuzz", True)
    with live_server(workspace, "asyncio", store=store) as live:
        yield live


DAEMON_FLAGS = ("--max-sessions", "0", "--max-pending-prompts-per-session", "0",
                "--max-running-tasks", "4")


@contextlib.contextmanager
def live_daemon(workspace: Path, server: str = "granian") -> Iterator[Live]:
    """``acp-server serve`` (granian, or ``server``) in a child process; an HTTP/2-only
    client."""
    with ServeProcess(workspace, *DAEMON_FLAGS, "--http-server", server) as child, \
            anyio.from_thread.start_blocking_portal("asyncio") as portal, \
            httpx.Client(base_url=child.base_url, timeout=15, http1=False, http2=True) as http:
        live = _seeded(child.base_url, http, portal)
        # (no body cap: the front layer drains a body it answered without reading)
        yield live
        assert http.get("/health").http_version == "HTTP/2"
        assert_healthy(http)


def _seeded(base_url: str, http: httpx.Client, portal: anyio.from_thread.BlockingPortal
            ) -> Live:
    """A session, a task and an /acp connection for the fuzzed paths to name."""
    session_id = http.post("/session", json={}).json()["sessionId"]
    task = http.post("/lmsp/v1/tasks", json={"type": "response", "input": {
        "model": "reference", "input": "seed"}}).json()
    init = http.post("/acp", json={"jsonrpc": "2.0", "id": 0, "method": "initialize",
                                   "params": {"protocolVersion": 1}})
    return Live(base_url, http, portal, session_id, task["id"],
                init.headers["acp-connection-id"])


def assert_healthy(http: httpx.Client) -> None:
    """Still serving every door after the run: a REST turn, an LMSP response, /acp."""
    assert http.get("/health").json() == {"status": "ok"}
    sid = http.post("/session", json={"sessionScope": "thread"}).json()["sessionId"]
    assert http.post(f"/session/{sid}/prompt", json={
        "prompt": [{"type": "text", "text": "after the fuzz"}]}).status_code == 202
    response = http.post("/lmsp/v1/responses", json={"model": "reference", "input": "ok?"})
    assert response.status_code == 200 and response.json()["status"] == "completed"
    init = http.post("/acp", json={"jsonrpc": "2.0", "id": 0, "method": "initialize",
                                   "params": {"protocolVersion": 1}})
    assert init.status_code == 200 and init.json()["result"]["protocolVersion"] == 1
