"""The runner does not blame the server for its own rate limit. With an ordinary stored
token (prompt 10, mutation 30, read 120 per minute) a run reported 28 MUST failures,
each ``saw 429 rate_limit_exceeded``, as if the server broke the spec. Now any 429 (a
request, a stream, the WebSocket's upgrade) or rate-limit error (a WebSocket message)
stops the run: its clean-ups run, no check is failed for it, and one line says so and
names ``acp-server token create NAME --unlimited``; the command exits 2. Against our
real server with real stored tokens, on both backends."""

from __future__ import annotations

import contextlib
import io
import json
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from rich.console import Console

from acp_server.cli import build_parser
from acp_server.conformance import CHECKS, Options, RateLimited, Result, run_conformance
from acp_server.conformance import acp_http
from acp_server.conformance.cli import run_conformance_args
from acp_server.conformance.context import Context
from acp_server.conformance.runner import discover
from bridge import BridgeOptions
from tests.conformance.broken import matches
from tests.conformance.server import FAST, running_target
from tests.harness.local import LocalServer, local_server
from tests.principals.helpers import bearer, mint

pytestmark = pytest.mark.anyio
BOOT = "boot-s3cret"
HINT = "acp-server token create NAME --unlimited"
FLAGS = ["--hold-prompt", "/sleep 30s hold", "--timeout", "5", "--settle-timeout", "15",
         "--saturate-tasks", "3"]


@contextlib.asynccontextmanager
async def limited_server(tmp_path: Path, **tiers: int) -> AsyncIterator[LocalServer]:
    """Our server with stored tokens, so rate limits apply (``tiers``: the
    ``rate_limit_*`` settings; the defaults are the server's, prompt 10 per minute)."""
    async with local_server(tmp_path, token=BOOT, max_running_tasks=2,
                            options=BridgeOptions(max_pending_prompts_per_session=3),
                            **{f"rate_limit_{k}": v for k, v in tiers.items()}) as srv:
        yield srv


async def _no_sessions_left(srv: LocalServer) -> None:
    with anyio.fail_after(10):
        while srv.bridge.sessions():
            await anyio.sleep(0.05)


def _cli(argv: list[str]) -> tuple[int, str]:
    parser, _ = build_parser()
    out = io.StringIO()
    status = run_conformance_args(parser.parse_args(argv),
                                  console=Console(file=out, width=220, force_terminal=False))
    return status, out.getvalue()


async def test_an_ordinary_stored_token_stops_the_run_blaming_no_check(
        tmp_path: Path, capsys: Any) -> None:
    """The reported case: the server's default tiers, a token made without
    ``--unlimited``. The command stops at the first 429 (exit 2), fails no check, leaves
    no session behind; an ``--unlimited`` token passes on the same server."""
    async with limited_server(tmp_path) as srv:
        token = await mint(srv.server, "ci")
        free = await mint(srv.server, "ci-free", unlimited=True)
        status, out = await anyio.to_thread.run_sync(
            _cli, ["conformance", srv.base_url, "--token", token, *FLAGS])
        await _no_sessions_left(srv)
        report = await run_conformance(srv.base_url, options=Options(
            token=free, hold_prompt=FAST.hold_prompt, timeout_s=5, settle_timeout_s=15),
            suites=["backpressure"])
    assert status == 2, out
    lines = out.splitlines()
    assert lines and all(line.startswith("PASS  ") for line in lines), out   # nothing blamed
    assert "passed" not in out            # no summary: the run has no verdict
    [line] = [line for line in capsys.readouterr().err.splitlines() if "conformance" in line]
    assert line.startswith(f"acp-server conformance: {srv.base_url} rate-limited the runner "
                           "(429 rate_limit_exceeded, tier prompt, Retry-After ")
    assert " s) at POST /session/" in line and HINT in line
    assert {r.outcome for r in report.results} == {"pass"}, \
        {r.id: r.detail for r in report.results if r.outcome != "pass"}


@pytest.mark.parametrize(("tier", "tiers"), [
    ("prompt", {"prompt": 3, "mutation": 0, "read": 0}),
    ("read", {"prompt": 0, "mutation": 0, "read": 6}),
])
async def test_whichever_tier_refuses_the_run_stops_there(tmp_path: Path, tier: str,
                                                          tiers: dict[str, int]) -> None:
    results: list[Result] = []
    async with limited_server(tmp_path, **tiers) as srv:
        token = await mint(srv.server, "ci")
        with pytest.raises(RateLimited) as stopped:
            await run_conformance(srv.base_url, options=Options(
                token=token, hold_prompt=FAST.hold_prompt, timeout_s=5, settle_timeout_s=15),
                on_result=results.append)
        await _no_sessions_left(srv)
    assert f"rate-limited the runner (429 rate_limit_exceeded, tier {tier}, " in str(
        stopped.value) and HINT in str(stopped.value)
    assert [r for r in results if r.outcome != "pass"] == []
    assert len(results) < len(CHECKS)


async def _drained(srv: LocalServer, token: str, path: str, method: str = "GET",
                   **kwargs: Any) -> None:
    """Sends ``method path`` with ``token`` until the server answers 429."""
    async with httpx.AsyncClient(base_url=srv.base_url, headers=bearer(token)) as client:
        for _ in range(50):
            if (await client.request(method, path, **kwargs)).status_code == 429:
                return
    raise AssertionError(f"{method} {path} was never refused")


async def test_a_rate_limit_on_the_websocket_stops_the_run(tmp_path: Path) -> None:
    """``session/prompt`` over the WebSocket: the server answers a JSON-RPC error with
    ``data.errorKind: rate_limit_exceeded`` on the open socket (no HTTP status)."""
    async with limited_server(tmp_path, prompt=1, mutation=0, read=0) as srv:
        token = await mint(srv.server, "ci")
        sid = (await srv.client.post("/session", json={}, headers=bearer(token))).json()[
            "sessionId"]
        await _drained(srv, token, f"/session/{sid}/prompt", "POST",
                       json={"prompt": [{"type": "text", "text": "hi"}]})
        async with Context.open(srv.base_url, Options(token=token, timeout_s=5)) as ctx:
            await discover(ctx)
            with pytest.raises(RateLimited) as stopped:
                await acp_http.check_websocket(ctx)
            await ctx.run_cleanups()
        assert ctx.results == {}
    assert "(rate_limit_exceeded, tier prompt, Retry-After " in str(stopped.value)
    assert "at a WebSocket message on /acp" in str(stopped.value) and HINT in str(stopped.value)


class Throttle:
    """A proxy's rate limit in front of our server (nginx ``limit_req``: a page, no
    ``code``): after ``allowed`` requests, every request (WebSocket upgrades included)
    is answered 429 ``text/html`` with ``Retry-After: 1`` for one second; then all pass."""

    def __init__(self, allowed: int) -> None:
        self.allowed = allowed
        self.seen = 0
        self.tripped: float | None = None
        self.refused: list[str] = []

    def _refuses(self) -> bool:
        self.seen += 1
        if self.seen > self.allowed and self.tripped is None:
            self.tripped = time.monotonic()
        return self.tripped is not None and time.monotonic() - self.tripped < 1.0

    def wrap(self, app: Any) -> Any:
        async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] not in ("http", "websocket") or not self._refuses():
                return await app(scope, receive, send)
            self.refused.append(f"{scope.get('method', 'GET')} {scope['path']}")
            body = b"<html><title>429 Too Many Requests</title></html>"
            headers = [(b"content-type", b"text/html"), (b"retry-after", b"1"),
                       (b"content-length", str(len(body)).encode())]
            kind = "http" if scope["type"] == "http" else "websocket.http"
            if scope["type"] == "websocket":
                await receive()   # websocket.connect; then deny it with an HTTP answer
            await send({"type": f"{kind}.response.start", "status": 429, "headers": headers})
            await send({"type": f"{kind}.response.body", "body": body})
        return asgi


async def test_any_429_stops_the_run_and_the_clean_ups_wait_it_out(tmp_path: Path) -> None:
    """A 429 without the server's body (a proxy's) stops the run the same way; the
    clean-ups it refuses are sent again after its ``Retry-After``: no session is left."""
    throttle = Throttle(allowed=12)
    results: list[Result] = []
    async with running_target(tmp_path, wrap=throttle.wrap) as url:
        with pytest.raises(RateLimited) as stopped:
            await run_conformance(url, options=FAST, suites=["backpressure"],
                                  on_result=results.append)
        async with httpx.AsyncClient(base_url=url) as client:
            workspace = (await client.get("/capabilities")).json()["workspaces"][0]["id"]
            listed = (await client.get(f"/workspace/{workspace}/sessions")).json()
    assert str(stopped.value).startswith(
        f"{url} rate-limited the runner (429 Too Many Requests, Retry-After 1 s) at ")
    assert [r for r in results if r.outcome != "pass"] == []
    assert any(refused.startswith("DELETE /session/") for refused in throttle.refused), \
        throttle.refused                  # a clean-up was refused, and sent again:
    assert listed["sessions"] == []


async def test_a_websocket_upgrade_refused_429_stops_the_run(tmp_path: Path) -> None:
    throttle = Throttle(allowed=0)
    async with running_target(tmp_path, wrap=throttle.wrap) as url:
        async with Context.open(url, Options(timeout_s=5)) as ctx:
            with pytest.raises(RateLimited, match=r"\(429 Too Many Requests, Retry-After 1 s\) "
                                                  r"at GET /acp: "):
                await acp_http.check_websocket(ctx)
        assert ctx.results == {}


async def test_a_429_naming_another_limit_is_the_servers_answer(tmp_path: Path) -> None:
    """acp-server's ``subscriber_limit_exceeded`` (too many readers of one session) is
    a 429 too, but no rate limit of the runner: the checks it meets judge it, the run
    goes on to its verdict."""
    body = json.dumps({"error": "Too many event subscribers", "code":
                       "subscriber_limit_exceeded", "sessionId": "s", "limit": 1}).encode()
    events = re.compile(r"/session/[^/]+/events")

    def wrap(app: Any) -> Any:
        async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if not matches(scope, "GET", events):
                return await app(scope, receive, send)
            await send({"type": "http.response.start", "status": 429, "headers": [
                (b"content-type", b"application/json"), (b"retry-after", b"5"),
                (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
        return asgi

    async with running_target(tmp_path, wrap=wrap) as url:
        report = await run_conformance(url, options=FAST, suites=["backpressure"])
    failed = {r.id: r.detail for r in report.results if r.outcome == "fail"}
    assert failed and all("429" in detail and "subscriber_limit_exceeded" in detail
                          for detail in failed.values()), failed
    assert report.exit_status() == 1
