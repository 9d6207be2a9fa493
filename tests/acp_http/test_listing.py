"""``/acp`` ``session/list`` over real HTTP and WebSocket: pages of ``PAGE_SIZE`` newest
first, ``nextCursor`` until the last page, a walk that sees every session live
throughout exactly once while others come and go, ``cwd`` (any spelling of the
workspace, across pages), bad and tampered cursors (-32602), each principal's own
sessions, sessions restored after a restart listed as REST lists them, and the ended
sessions the journal keeps after the live ones."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import os
import time

import anyio
import pytest

from acp_server.acp_http.listing import ENDED_START, PAGE_SIZE
from acp_server.rest.workspace import workspace_id
from bridge import BridgeOptions
from bridge.wire import iso
from tests.acp_http.server import RunningAcpServer, request, running_acp_server
from tests.acp_http.wsclient import ws_connect
from tests.harness import local_server
from tests.principals.helpers import bearer, mint
from tests.store.faults import faulty
from tests.store.test_session_journal import _settled
from tests.store.test_session_restart import _prompt, read_events

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
    {"cursor": "x" * 10_000}, {"cwd": 3}, {"cwd": {"a": 1}}, {"cwd": ["/"]},
    {"cwd": "relative/ws"}, {"cwd": ""}, {"cwd": "."}, {"cwd": "/ws\x00/x"},
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


async def _walk(lister: Lister, params: dict[str, Any]) -> list[list[str]]:
    """The pages of a whole walk from ``params``' first page: their session ids."""
    pages, cursor = [], params.get("cursor")
    while True:
        answer = (await lister.call({**params, "cursor": cursor}))["result"]
        pages.append([s["sessionId"] for s in answer["sessions"]])
        cursor = answer.get("nextCursor")
        if cursor is None:
            return pages


async def test_a_tampered_cursor_is_invalid_params(server: RunningAcpServer) -> None:
    await _make(server, PAGE_SIZE + 1)
    async with ws_connect(server.base_url, "/acp") as ws:
        lister = await _lister(ws)
        cursor = (await lister.call({}))["result"]["nextCursor"]
        assert len((await lister.call({"cursor": cursor}))["result"]["sessions"]) == 1
        for tampered in (cursor[:-1], cursor + "A", cursor + "=", cursor[1:], "x" + cursor[1:],
                         cursor.upper(), cursor[::-1], f" {cursor}", cursor.replace("e", "é")):
            answer = await lister.call({"cursor": tampered})
            assert answer["error"]["code"] == -32602, (tampered, answer)
            assert "cursor" in answer["error"]["message"]


async def test_cwd_pages_and_takes_any_spelling_of_the_workspace(
        server: RunningAcpServer, tmp_path: Path) -> None:
    made = await _make(server, PAGE_SIZE + 4)
    link = tmp_path / "link-to-ws"
    link.symlink_to(server.workspace, target_is_directory=True)
    async with ws_connect(server.base_url, "/acp") as ws:
        lister = await _lister(ws)
        for spelling in (server.workspace, server.workspace + "/", server.workspace + "/.",
                         f"{server.workspace}/sub/..", str(link)):
            pages = await _walk(lister, {"cwd": spelling})
            assert [len(p) for p in pages] == [PAGE_SIZE, 4], spelling
            assert sum(pages, []) == made[::-1], spelling
        # a cursor of the workspace's walk on another folder: nothing, and no nextCursor
        cursor = (await lister.call({}))["result"]["nextCursor"]
        assert (await lister.call({"cwd": "/elsewhere", "cursor": cursor}))["result"] \
            == {"sessions": []}


async def test_each_principal_pages_through_its_own_sessions(tmp_path: Path) -> None:
    boot = "boot-s3cret"
    async with running_acp_server(tmp_path, token=boot, headers=bearer(boot),
                                  options=BridgeOptions(max_sessions=300)) as srv:
        people = {name: bearer(await mint(srv.server, name, *scopes, unlimited=True))
                  for name, scopes in (("alice", ()), ("bob", ()), ("ops", ("admin",)))}
        made: dict[str, list[str]] = {"alice": [], "bob": []}
        for n in range(PAGE_SIZE + 6):   # interleaved: bob's among alice's
            who = "bob" if n % 25 == 1 else "alice"   # bob's first older than alice's cursor
            answer = await srv.client.post("/session", json={"sessionScope": "thread"},
                                           headers=people[who])
            made[who].append(answer.json()["sessionId"])
        walks: dict[str, list[list[str]]] = {}
        listers: dict[str, Lister] = {}
        async with ws_connect(srv.base_url, "/acp", headers=people["alice"]) as a_ws, \
                ws_connect(srv.base_url, "/acp", headers=people["bob"]) as b_ws, \
                ws_connect(srv.base_url, "/acp", headers=people["ops"]) as o_ws:
            for name, ws in (("alice", a_ws), ("bob", b_ws), ("ops", o_ws)):
                listers[name] = await _lister(ws)
                walks[name] = await _walk(listers[name], {})
            # alice's cursor is a position: from it bob still sees only his own
            alices = (await listers["alice"].call({}))["result"]["nextCursor"]
            from_there = await _walk(listers["bob"], {"cursor": alices})
    assert len(made["bob"]) == 3
    assert walks["bob"] == [made["bob"][::-1]]   # one page, no cursor to alice's
    assert from_there == [[made["bob"][0]]]
    assert [len(p) for p in walks["alice"]] == [PAGE_SIZE, len(made["alice"]) - PAGE_SIZE]
    assert sum(walks["alice"], []) == made["alice"][::-1]
    everyone = sum(walks["ops"], [])
    assert sorted(everyone) == sorted(made["alice"] + made["bob"]) and len(walks["ops"]) == 2


async def test_restored_sessions_are_listed_as_rest_lists_them(tmp_path: Path) -> None:
    """After a restart the journaled sessions are listed by both doors alike, each
    ``updatedAt`` the last activity the journal knows (not the restart's time) until
    the session is used again."""
    async with local_server(tmp_path) as srv:
        sids = [(await srv.client.post("/session", json={"sessionScope": "thread"})
                 ).json()["sessionId"] for _ in range(3)]
        accepted = await srv.client.post(f"/session/{sids[1]}/prompt", json=_prompt("hi"))
        events = await read_events(srv.client, sids[1],
                                   lambda e: e["type"] == "turn_complete", last_event_id=0)
        last_event = iso(events[-1]["_meta"]["serverTimestamp"] / 1000)
        assert accepted.status_code == 202
    stopped = iso(time.time())
    async with running_acp_server(tmp_path) as srv:
        rest = (await srv.client.get(f"/workspace/{workspace_id(srv.workspace)}/sessions")
                ).json()
        async with ws_connect(srv.base_url, "/acp") as ws:
            lister = await _lister(ws)
            acp = (await lister.call({}))["result"]
            assert [(s["sessionId"], s["cwd"], s["updatedAt"]) for s in acp["sessions"]] == [
                (s["sessionId"], s["workspaceCwd"], s["updatedAt"]) for s in rest["sessions"]]
            assert [s["sessionId"] for s in acp["sessions"]] == sids[::-1]
            for row in rest["sessions"]:
                assert row["createdAt"] <= row["updatedAt"] <= stopped, row
            assert rest["sessions"][1]["updatedAt"] >= last_event
            # used again (a prompt): its updatedAt is now, in both doors
            again = await srv.client.post(f"/session/{sids[0]}/prompt", json=_prompt("again"))
            await _settled(srv.client, sids[0], again.json()["promptId"])
            acp = (await lister.call({}))["result"]
        assert acp["sessions"][-1]["sessionId"] == sids[0]
        assert acp["sessions"][-1]["updatedAt"] >= stopped


async def _end(server: Any, sids: list[str]) -> None:
    """What an agent's death does to each: closed, kept (not deleted); once the ends
    are committed (REST's ended listing has them)."""
    for sid in sids:
        await server.bridge.close_session(sid, reason="agent_exited")
    wid = workspace_id(server.workspace)
    with anyio.fail_after(20):
        while len((await server.client.get(f"/workspace/{wid}/ended-sessions")
                   ).json()["sessions"]) < len(sids):
            await anyio.sleep(0.01)


async def test_ended_sessions_follow_the_live_ones(server: RunningAcpServer) -> None:
    """ACP's list is what a client may ``session/load``: after the live sessions, the
    ended ones the journal keeps, newest end first, their ``updatedAt`` their end."""
    gone = await _make(server, 2)
    live = await _make(server, 3)
    await _end(server, gone[::-1])   # gone[1] ends first: gone[0] is the newer end
    async with ws_connect(server.base_url, "/acp") as ws:
        lister = await _lister(ws)
        answer = (await lister.call({}))["result"]
        assert [s["sessionId"] for s in answer["sessions"]] == live[::-1] + gone
        assert "nextCursor" not in answer
        ended_rows = answer["sessions"][3:]
        assert ended_rows[0]["updatedAt"] >= ended_rows[1]["updatedAt"]
        assert all(row["cwd"] == server.workspace for row in ended_rows)
        assert (await lister.call({"cwd": "/elsewhere"}))["result"] == {"sessions": []}
    wid = workspace_id(server.workspace)
    assert (await server.client.post(f"/session/{gone[0]}/load", json={})).status_code == 200
    async with ws_connect(server.base_url, "/acp") as ws:
        lister = await _lister(ws)
        answer = (await lister.call({}))["result"]   # live again: among the live ones
        ids = [s["sessionId"] for s in answer["sessions"]]
        assert ids.count(gone[0]) == 1 and ids[-1] == gone[1]
    assert gone[0] not in [s["sessionId"] for s in (await server.client.get(
        f"/workspace/{wid}/ended-sessions")).json()["sessions"]]


async def test_a_full_page_of_live_sessions_hands_over_to_the_ended_ones(
        server: RunningAcpServer) -> None:
    gone = await _make(server, PAGE_SIZE + 3)
    await _end(server, gone[:3])
    async with ws_connect(server.base_url, "/acp") as ws:
        lister = await _lister(ws)
        pages = await _walk(lister, {})
        first = (await lister.call({}))["result"]
    assert first["nextCursor"] == ENDED_START
    assert pages == [gone[3:][::-1], gone[:3][::-1]]


async def test_the_store_down_answers_the_live_sessions_and_asks_again_for_the_ended(
        tmp_path: Path) -> None:
    store = faulty(tmp_path)
    async with running_acp_server(tmp_path, lmsp_store=store) as srv:
        gone = await _make(srv, 1)
        live = await _make(srv, 1)
        await _end(srv, gone)
        async with ws_connect(srv.base_url, "/acp") as ws:
            lister = await _lister(ws)
            store.faults.on()
            answer = (await lister.call({}))["result"]
            assert answer == {"sessions": [answer["sessions"][0]], "nextCursor": ENDED_START}
            assert answer["sessions"][0]["sessionId"] == live[0]
            refused = await lister.call({"cursor": ENDED_START})
            assert refused["error"]["data"]["errorKind"] == "store_unavailable", refused
            store.faults.off()
            again = (await lister.call({"cursor": ENDED_START}))["result"]
            assert [s["sessionId"] for s in again["sessions"]] == gone


async def test_each_principal_lists_its_own_ended_sessions(tmp_path: Path) -> None:
    boot = "boot-s3cret"
    async with running_acp_server(tmp_path, token=boot, headers=bearer(boot)) as srv:
        people = {name: bearer(await mint(srv.server, name, unlimited=True))
                  for name in ("alice", "bob")}
        made = {}
        for name, headers in people.items():
            answer = await srv.client.post("/session", json={"sessionScope": "thread"},
                                           headers=headers)
            made[name] = answer.json()["sessionId"]
        await _end(srv, list(made.values()))
        for name, headers in people.items():
            async with ws_connect(srv.base_url, "/acp", headers=headers) as ws:
                lister = await _lister(ws)
                assert [s["sessionId"] for s in (await lister.call({}))["result"]["sessions"]] \
                    == [made[name]], name


async def test_a_session_is_titled_by_its_first_prompt(server: RunningAcpServer) -> None:
    """ACP's ``title`` (qwen's too): the session's first prompt's name, as REST's
    ``displayName``; absent before its first prompt with text."""
    named, blank = await _make(server, 2)
    ticket = server.bridge.send_prompt(named, [{"type": "text", "text": "name me"}])
    await ticket
    async with ws_connect(server.base_url, "/acp") as ws:
        listed = (await (await _lister(ws)).call({}))["result"]["sessions"]
    titles = {s["sessionId"]: s.get("title") for s in listed}
    assert titles == {named: "name me", blank: None}
