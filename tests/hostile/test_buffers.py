"""Memory bounded in bytes on ``/acp``: replies buffered for a connection without a
stream, and WebSocket frames (over real HTTP / WebSocket)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from acp_server.acp_http.connection import CONNECTION_BUFFER, REPLY_BUFFER_BYTES
from tests.acp_http.server import FakeClock
from tests.acp_http.wsclient import ws_connect
from tests.hostile.test_input import INIT, JSON, acp_connection
from tests.lmsp.server import LmspServer, running_lmsp

pytestmark = pytest.mark.anyio


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[LmspServer]:
    """The hostile suite's server with the ``/acp`` registry on a clock that stands
    still: these connections never open a stream, and a real clock would reap them
    ``grace_s`` (10 s) after their first request, which 2,000 requests on a loaded
    machine outlast (the refusals then turned into 404s: CI, 2026-12-03)."""
    async with running_lmsp(tmp_path, acp_clock=FakeClock()) as srv:
        yield srv


async def test_reply_buffer_is_capped_in_bytes(server: LmspServer) -> None:
    conn = await acp_connection(server)
    headers = {**JSON, "Acp-Connection-Id": conn}
    method = "x" * (4 * 1024 * 1024)   # the -32601 reply echoes it: 4 MB per reply
    statuses = []
    for i in range(6):
        response = await server.client.post("/acp", headers=headers, content=json.dumps(
            {"jsonrpc": "2.0", "id": i, "method": method}))
        statuses.append(response.status_code)
        if response.status_code == 503:
            assert response.headers["retry-after"] == "5"
            assert response.json()["error"]["code"] == -32603 and response.json()["id"] == i
    accepted = statuses.count(202)
    assert statuses == [202] * accepted + [503] * (6 - accepted)
    assert accepted * len(method) <= REPLY_BUFFER_BYTES + len(method)
    # Reading the stream frees the buffer: the next request is accepted again.
    async with server.client.stream("GET", "/acp", headers={
            "Accept": "text/event-stream", "Acp-Connection-Id": conn}) as stream:
        seen = 0
        async for line in stream.aiter_lines():
            if line.startswith("data: "):
                seen += 1
                if seen == accepted:
                    break
        response = await server.client.post("/acp", headers=headers, content=json.dumps(
            {"jsonrpc": "2.0", "id": 99, "method": "session/list"}))
        assert response.status_code == 202


async def test_small_replies_past_the_frame_cap_are_refused_not_dropped(
        server: LmspServer) -> None:
    """helper-52: 2,500 small requests without a reader were all answered 202 and 452
    replies were dropped (the frame cap, 2,048, came long before the byte cap)."""
    conn = await acp_connection(server)
    headers = {**JSON, "Acp-Connection-Id": conn}
    statuses = []
    for i in range(CONNECTION_BUFFER + 10):
        response = await server.client.post("/acp", headers=headers, content=json.dumps(
            {"jsonrpc": "2.0", "id": i, "method": "nope/unknown"}))
        statuses.append(response.status_code)
    accepted = statuses.count(202)
    assert statuses == [202] * accepted + [503] * (len(statuses) - accepted)
    assert CONNECTION_BUFFER - 10 < accepted < CONNECTION_BUFFER   # every one answered:
    async with server.client.stream("GET", "/acp", headers={
            "Accept": "text/event-stream", "Acp-Connection-Id": conn}) as stream:
        ids = set()
        async for line in stream.aiter_lines():
            if line.startswith("data: "):
                ids.add(json.loads(line[6:])["id"])
                if len(ids) == accepted:
                    break
    assert ids == set(range(accepted))


async def test_websocket_frame_over_the_body_cap_closes_1009(server: LmspServer) -> None:
    cap = 10 * 1024 * 1024
    async with ws_connect(server.base_url) as ws:
        await ws.send_json(INIT)
        assert (await ws.receive_json())["id"] == 0
        await ws.send_text('{"jsonrpc":"2.0","id":1,"method":"session/list","params":{"a":"'
                           + "y" * cap + '"}}')
        assert await ws.wait_closed(timeout=30) == 1009
