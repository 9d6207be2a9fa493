"""``/acp`` ``session/list`` over real HTTP and WebSocket: pages of ``PAGE_SIZE`` newest
first, ``nextCursor`` until the last page, a walk that sees every session live
throughout exactly once while others come and go, ``cwd``, and bad cursors (-32602)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from acp_server.acp_http.listing import PAGE_SIZE
from bridge import BridgeOptions
from tests.acp_http.server import RunningAcpServer, request, running_acp_server
from tests.acp_http.wsclient import ws_connect

pytestmark = pytest.mark.anyio


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[RunningAcpServer]:
    async with running_acp_server(tmp_path, options=BridgeOptions(max_sessions=300)) as srv:
        yield srv


async def _make(server: RunningAcpServer, count: int) -> list[str]:
    return [(await server.bridge.create_session()).session_id for _ in range(count)]


class Lister:
    """``session/list`` over one initialized WebSocket."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.next_id = 100

    async def call(self, params: dict[str, Any]) -> dict[str, Any]:
        self.next_id += 1
        rpc_id = self.next_id
        await self.ws.send_json(request(rpc_id, "session/list", params))
        return await self.ws.wait_for(lambda m: m.get("id") == rpc_id)   # type: ignore[no-any-return]


async def _lister(ws: Any) -> Lister:
    await ws.send_json(request(0, "initialize", {"protocolVersion": 1}))
    await ws.receive_json()
    return Lister(ws)


async def test_a_walk_sees_every_session_once_newest_first(server: RunningAcpServer) -> None:
    made = await _make(server, 2 * PAGE_SIZE + 7)
    async with ws_connect(server.base_url, "/acp") as ws:
        lister = await _lister(ws)
        seen: list[dict[str, Any]] = []
        cursor: str | None = None
        sizes = []
        while True:
            answer = (await lister.call({} if cursor is None else {"cursor": cursor}))["result"]
            sizes.append(len(answer["sessions"]))
            seen.extend(answer["sessions"])
            cursor = answer.get("nextCursor")
            if cursor is None:
                assert "nextCursor" not in answer   # absent, not null, on the last page
                break
    assert sizes == [PAGE_SIZE, PAGE_SIZE, 7]
    assert [s["sessionId"] for s in seen] == made[::-1]   # newest first
    for row in seen:
        assert set(row) == {"sessionId", "cwd", "updatedAt"}
        assert row["cwd"] == server.workspace
        assert row["updatedAt"].endswith("Z") and "T" in row["updatedAt"]


async def test_sessions_made_and_closed_during_the_walk_do_not_upset_it(
        server: RunningAcpServer) -> None:
    made = await _make(server, 2 * PAGE_SIZE + 20)
    async with ws_connect(server.base_url, "/acp") as ws:
        lister = await _lister(ws)
        first = (await lister.call({}))["result"]
        listed = [s["sessionId"] for s in first["sessions"]]
        # between the pages: new sessions (newer than the cursor: not listed), and some
        # listed and some not yet listed ones closed
        await _make(server, 5)
        gone = [listed[0], listed[-1], made[0], made[1]]
        for sid in gone:
            await server.bridge.close_session(sid)
        cursor = first["nextCursor"]
        while cursor is not None:
            answer = (await lister.call({"cursor": cursor}))["result"]
            listed.extend(s["sessionId"] for s in answer["sessions"])
            cursor = answer.get("nextCursor")
    assert len(listed) == len(set(listed))   # never twice
    throughout = [sid for sid in made if sid not in gone]
    assert all(sid in listed for sid in throughout)   # each live one once
    assert not {made[0], made[1]} & set(listed)   # closed before their page: not listed


async def test_cwd_keeps_that_folders_sessions(server: RunningAcpServer) -> None:
    made = await _make(server, 3)
    async with ws_connect(server.base_url, "/acp") as ws:
        lister = await _lister(ws)
        mine = (await lister.call({"cwd": server.workspace}))["result"]
        assert [s["sessionId"] for s in mine["sessions"]] == made[::-1]
        other = (await lister.call({"cwd": "/elsewhere"}))["result"]
        assert other == {"sessions": []}
        for empty in ({"cursor": ""}, {"cursor": None}, {"cwd": None}):
            assert len((await lister.call(empty))["result"]["sessions"]) == 3, empty


@pytest.mark.parametrize("params", [
    {"cursor": 12}, {"cursor": ["a"]}, {"cursor": "not-a-cursor"}, {"cursor": "20"},
    {"cursor": "eyJjcmVhdGVkVXMiOjF9"},   # base64url JSON, not a key of ours
    {"cursor": "x" * 10_000}, {"cwd": 3}, {"cwd": {"a": 1}},
])
async def test_a_bad_cursor_or_cwd_is_invalid_params(server: RunningAcpServer,
                                                      params: dict[str, Any]) -> None:
    await _make(server, 1)
    async with ws_connect(server.base_url, "/acp") as ws:
        lister = await _lister(ws)
        answer = await lister.call(params)
        assert answer["error"]["code"] == -32602, answer
        assert len(answer["error"]["message"]) < 300
        assert "sessions" in (await lister.call({}))["result"]   # the socket goes on


async def test_pages_over_streamable_http(server: RunningAcpServer) -> None:
    made = await _make(server, PAGE_SIZE + 1)
    conn_id, _ = await server.initialize()
    async with server.stream(conn_id) as conn_stream:
        await server.post(conn_id, request(1, "session/list", {}))
        first = (await conn_stream.wait_for_id(1))["result"]
        await server.post(conn_id, request(2, "session/list", {"cursor": first["nextCursor"]}))
        second = (await conn_stream.wait_for_id(2))["result"]
    assert [s["sessionId"] for s in first["sessions"] + second["sessions"]] == made[::-1]
    assert "nextCursor" not in second
