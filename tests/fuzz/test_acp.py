"""Fuzz ``/acp`` (and its alias ``/workspaces/{id}/acp``) over HTTP (POST / GET / DELETE)
and over the WebSocket: generated
JSON-RPC messages, raw bodies and frames, connection and session headers. No 5xx,
every error a JSON-RPC error (or the documented ``{"error"}``), a WebSocket that
stays open and still answers, the server healthy afterwards; on SQLite under each
backend, and on PostgreSQL (asyncio) when ``ACP_SERVER_TEST_POSTGRES`` names one (a
``sessionId`` reaches its queries: a NUL it cannot hold)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.acp_http.wsclient import ws_connect
from tests.fuzz.budget import Budget, fuzz_settings
from tests.fuzz.http import send
from tests.fuzz.live import Live, live_on_postgres
from tests.fuzz.shapes import check_acp, check_rpc_message
from tests.fuzz.strategies import (
    CONTENT_TYPE, HEADER_VALUE, HEADERS, bodies, deep, rpc_messages)

pytestmark = pytest.mark.slow   # hypothesis against a live server: tens of seconds

INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}


def test_acp_http(live: Live) -> None:
    _fuzz_http(live)


def test_acp_http_on_postgres(tmp_path: Path) -> None:
    with live_on_postgres(tmp_path) as live:
        _fuzz_http(live)


def _fuzz_http(live: Live) -> None:
    messages = rpc_messages([live.session_id]).map(lambda m: json.dumps(m).encode())
    budget = Budget()
    workspace = live.http.get("/capabilities").json()["workspaces"][0]
    respelled = f"/workspaces/{quote(workspace['cwd'], safe='')}%2F.%2F/acp"   # decoded: stray

    @fuzz_settings()
    @given(path=st.sampled_from(["/acp", "/acp", f"/workspaces/{workspace['id']}/acp",
                                 respelled]),
           method=st.sampled_from(["POST", "POST", "POST", "GET", "DELETE", "PUT"]),
           body=st.one_of(messages, bodies({})),
           connection=st.one_of(st.just(live.connection_id), HEADER_VALUE, st.none()),
           session=st.one_of(st.just(live.session_id), HEADER_VALUE, st.none()),
           accept=st.sampled_from(["text/event-stream", "application/json", ""]),
           content_type=CONTENT_TYPE, extra=HEADERS)
    def run(path: str, method: str, body: bytes, connection: str | None,
            session: str | None, accept: str, content_type: str,
            extra: dict[str, str]) -> None:
        if budget.spent:
            return
        if not live.sendable(body if method == "POST" else None):
            return
        headers = {**extra, "content-type": content_type, "accept": accept}
        if connection is not None:
            headers["acp-connection-id"] = connection
        if session is not None:
            headers["acp-session-id"] = session
        response = send(live.http, method, path, headers=headers,
                        content=body if method == "POST" else None)
        check_acp(response)

    run()


async def _exchange(base_url: str, frames: list[str]) -> None:
    async with ws_connect(base_url) as ws:
        await ws.send_json(INIT)
        check_rpc_message(await ws.receive_json())
        for frame in frames:
            await ws.send_text(frame)
        await ws.send_json({"jsonrpc": "2.0", "id": "probe", "method": "session/list"})
        with anyio.fail_after(10):   # the socket stays open and still answers
            while True:
                message: Any = json.loads(await ws.receive_text(timeout=10))
                check_rpc_message(message)
                if message.get("id") == "probe" and "method" not in message:
                    assert "result" in message, message
                    return


def test_acp_websocket_frames(live: Live) -> None:
    _fuzz_frames(live)


def test_acp_websocket_frames_on_postgres(tmp_path: Path) -> None:
    with live_on_postgres(tmp_path) as live:
        _fuzz_frames(live)


def _fuzz_frames(live: Live) -> None:
    frame = st.one_of(rpc_messages([live.session_id]).map(json.dumps),
                      st.text(max_size=50),
                      st.integers(min_value=100, max_value=3000).map(lambda n: deep(n).decode()),
                      st.sampled_from(["[]", "[{}]", "{", "null", '{"jsonrpc":"2.0"}']))

    budget = Budget()

    @fuzz_settings(0.25)
    @given(frames=st.lists(frame, min_size=1, max_size=4))
    def run(frames: list[str]) -> None:
        if not budget.spent:
            live.portal.call(_exchange, live.base_url, frames)

    run()
