"""What ``/acp`` refuses, over real loopback HTTP and WebSocket: a request past the
connection's channel cap makes no session first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from acp_server.acp_http import connection
from bridge import BridgeOptions
from tests.acp_http.server import RunningAcpServer, Sse, request, running_acp_server
from tests.acp_http.wsclient import ws_connect

pytestmark = pytest.mark.anyio


async def _active_sessions(srv: RunningAcpServer) -> int:
    response = await srv.client.get("/daemon/status")
    assert response.status_code == 200, response.text
    return response.json()["runtime"]["sessions"]["active"]  # type: ignore[no-any-return]


async def _refused_at_the_cap(srv: RunningAcpServer, conn_id: str, conn_stream: Sse,
                              rpc_id: int, method: str, params: dict[str, Any]) -> None:
    response = await srv.post(conn_id, request(rpc_id, method, params))
    assert response.status_code == 202, response.text
    error = (await conn_stream.wait_for_id(rpc_id))["error"]
    assert error["code"] == -32603
    assert error["data"] == {"errorKind": "session_stream_limit_exceeded", "limit": 1,
                             "retryable": True}


async def test_a_refused_session_new_fork_or_load_leaves_no_session(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the connection's channel cap ``session/new``, ``session/fork``,
    ``session/load`` and ``session/resume`` are refused before the session is made
    (or restored): no session is left, no ``--max-sessions`` slot is held."""
    monkeypatch.setattr(connection, "MAX_CHANNELS_PER_CONNECTION", 1)
    async with running_acp_server(tmp_path, options=BridgeOptions(max_sessions=2)) as srv:
        conn_id, _ = await srv.initialize()
        async with srv.stream(conn_id) as conn_stream:
            sid = await srv.new_session(conn_id, conn_stream)
            assert await _active_sessions(srv) == 1
            await _refused_at_the_cap(srv, conn_id, conn_stream, 2, "session/new",
                                      {"cwd": srv.workspace, "mcpServers": []})
            assert await _active_sessions(srv) == 1
            await _refused_at_the_cap(srv, conn_id, conn_stream, 3, "session/fork",
                                      {"sessionId": sid, "cwd": srv.workspace,
                                       "mcpServers": []})
            assert [s.session_id for s in srv.bridge.list_sessions()] == [sid]
            async with srv.stream(conn_id, sid) as session_stream:
                await srv.post(conn_id, request(4, "session/close", {"sessionId": sid}), sid)
                assert (await session_stream.wait_for_id(4))["result"] == {}
        assert await _active_sessions(srv) == 0
        other, _ = await srv.initialize()   # the slot a refused one would hold is free
        async with srv.stream(other) as other_stream:
            made = await srv.new_session(other, other_stream, rpc_id=5)
            for rpc_id, method in [(6, "session/load"), (7, "session/resume")]:
                await _refused_at_the_cap(srv, other, other_stream, rpc_id, method, {
                    "sessionId": sid, "cwd": srv.workspace, "mcpServers": []})
                assert [s.session_id for s in srv.bridge.list_sessions()] == [made]


async def test_concurrent_session_news_hold_their_channel_before_the_session(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ``session/new`` on one WebSocket run concurrently: the first holds the last
    channel while its session is made, so the second is refused before making one."""
    monkeypatch.setattr(connection, "MAX_CHANNELS_PER_CONNECTION", 1)
    async with running_acp_server(tmp_path) as srv, ws_connect(srv.base_url) as ws:
        await ws.send_json(request(0, "initialize", {"protocolVersion": 1}))
        assert (await ws.receive_json())["id"] == 0
        params = {"cwd": srv.workspace, "mcpServers": []}
        await ws.send_json(request(1, "session/new", params))
        await ws.send_json(request(2, "session/new", params))
        replies = {}
        while len(replies) < 2:
            message = await ws.receive_json()
            if "method" not in message:
                replies[message["id"]] = message
        made = [r["result"]["sessionId"] for r in replies.values() if "result" in r]
        refused = [r["error"]["data"]["errorKind"] for r in replies.values() if "error" in r]
        assert len(made) == 1 and refused == ["session_stream_limit_exceeded"]
        assert [s.session_id for s in srv.bridge.list_sessions()] == made
        assert await _active_sessions(srv) == 1
