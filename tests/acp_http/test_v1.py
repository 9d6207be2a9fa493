"""ACP v1 (schema 1.21) on ``/acp``: ``session/delete``, ``session/fork``, ``logout``,
``$/cancel_request``, methods passed through to an agent that advertises them, and
what reconnecting clients ask through ``_meta`` (event ids, prompt ids, cursors)."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path
from typing import Any

import anyio
import pytest

from acp_server.acp_http.passthrough import advertised
from bridge.wire import envelope
from tests.acp_http.extended_agent import ExtendedFactory
from tests.acp_http.server import RunningAcpServer, request, running_acp_server, text
from tests.acp_http.wsclient import ws_connect
from tests.agents import fixture_command

pytestmark = pytest.mark.anyio

RESUMABLE = {"protocolVersion": 1, "_meta": {"acp-server/resumable": True}}


async def test_session_delete(server: RunningAcpServer) -> None:
    conn_id, init = await server.initialize()
    assert init["result"]["agentCapabilities"]["sessionCapabilities"]["delete"] == {}
    async with server.stream(conn_id) as conn_stream:
        sid = await server.new_session(conn_id, conn_stream)
        async with server.stream(conn_id, sid) as session_stream:
            await server.post(conn_id, request(2, "session/delete", {"sessionId": sid}))
            reply = await session_stream.wait_for_id(2)
            assert reply["result"] == {}
            await session_stream.wait_for_end()
        await server.post(conn_id, request(3, "session/list", {}))
        listed = await conn_stream.wait_for_id(3)
        assert sid not in [s["sessionId"] for s in listed["result"]["sessions"]]
        # deleting what is gone, or never was, succeeds silently (the spec's SHOULD)
        for rpc_id, gone in ((4, sid), (5, "never-was")):
            await server.post(conn_id, request(rpc_id, "session/delete", {"sessionId": gone}))
            assert (await conn_stream.wait_for_id(rpc_id))["result"] == {}


async def test_logout_and_fork(server: RunningAcpServer) -> None:
    conn_id, _ = await server.initialize()
    async with server.stream(conn_id) as conn_stream:
        await server.post(conn_id, request(1, "logout", {}))
        assert (await conn_stream.wait_for_id(1))["result"] == {}
        sid = await server.new_session(conn_id, conn_stream, rpc_id=2)
        async with server.stream(conn_id, sid) as session_stream:
            await server.prompt(conn_id, sid, 3, "remember me")
            await session_stream.wait_for_id(3)
        await server.post(conn_id, request(4, "session/fork", {
            "sessionId": sid, "cwd": server.workspace, "mcpServers": []}))
        forked = (await conn_stream.wait_for_id(4))["result"]["sessionId"]
        assert forked != sid
        assert server.bridge.get_session(forked).forked_from == sid
        async with server.stream(conn_id, forked) as fork_stream:
            await server.prompt(conn_id, forked, 5, "/history")
            await fork_stream.wait_for_id(5)
            said = "".join(m["params"]["update"]["content"]["text"] for m in fork_stream.messages
                           if m.get("method") == "session/update"
                           and m["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
            assert "user: remember me" in said


async def test_cancel_request_of_a_slow_load(tmp_path: Path) -> None:
    async with running_acp_server(tmp_path, agent_factory=ExtendedFactory()) as srv:
        conn_id, _ = await srv.initialize()
        async with srv.stream(conn_id) as conn_stream:
            await srv.post(conn_id, request(7, "session/load", {
                "sessionId": "slow-1", "cwd": srv.workspace, "mcpServers": []}))
            registry = srv.registry.connections[conn_id]
            with anyio.fail_after(30):
                while (int, 7) not in registry.in_flight:
                    await anyio.sleep(0.01)
            await srv.post(conn_id, request(None, "$/cancel_request", {"requestId": 7}))
            reply = await conn_stream.wait_for_id(7)
            assert reply["error"] == {"code": -32800, "message": "Request cancelled"}
            assert "slow-1" not in [s.session_id for s in srv.bridge.sessions()]
            # an id nobody runs: ignored, the connection goes on
            await srv.post(conn_id, request(None, "$/cancel_request", {"requestId": "nope"}))
            await srv.post(conn_id, request(8, "session/list", {}))
            assert "result" in await conn_stream.wait_for_id(8)


async def test_cancel_request_of_a_prompt(server: RunningAcpServer) -> None:
    conn_id, _ = await server.initialize()
    async with server.stream(conn_id) as conn_stream:
        sid = await server.new_session(conn_id, conn_stream)
        async with server.stream(conn_id, sid) as session_stream:
            await server.prompt(conn_id, sid, "p-1", "/sleep 30s long")
            await session_stream.wait_for(lambda m: m.get("method") == "session/update")
            await server.post(conn_id, request(None, "$/cancel_request", {"requestId": "p-1"}))
            reply = await session_stream.wait_for_id("p-1")
            assert reply["result"]["stopReason"] == "cancelled"


async def test_unknown_methods_pass_through_when_advertised(tmp_path: Path) -> None:
    factory = ExtendedFactory()
    async with running_acp_server(tmp_path, agent_factory=factory) as srv:
        conn_id, _ = await srv.initialize()
        async with srv.stream(conn_id) as conn_stream:
            sid = await srv.new_session(conn_id, conn_stream)
            params = {"sessionId": sid, "x": [1, {"y": None}]}
            await srv.post(conn_id, request(2, "_example.com/echo", params))
            assert (await conn_stream.wait_for_id(2))["result"] == {"echoed": params}
            await srv.post(conn_id, request(None, "_example.com/note", params))
            for rpc_id, method, sent in ((3, "_other.org/thing", params),
                                         (4, "_example.com/echo", {}),       # no session
                                         (5, "nes/start", params)):           # not offered
                await srv.post(conn_id, request(rpc_id, method, sent))
                reply = await conn_stream.wait_for_id(rpc_id)
                assert reply["error"]["code"] == -32601, reply
                assert reply["error"]["data"] == {"method": method}
            assert factory.connection is not None
            assert factory.connection.notes == [("_example.com/note", params)]


def test_advertised_rules() -> None:
    qwen = {"agentCapabilities": {}, "_meta": {"qwen": {"methods": ["_qwen/x", "qwen/y"]}}}
    assert advertised(qwen, "_qwen/x") and advertised(qwen, "qwen/y")
    assert not advertised(qwen, "_qwen/z")
    assert advertised({"agentCapabilities": {"nes": {}}}, "document/didOpen")
    assert not advertised({"agentCapabilities": {"nes": None}}, "nes/start")
    assert advertised({"agentCapabilities": {"mcpCapabilities": {"acp": True}}}, "mcp/message")
    assert not advertised({"agentCapabilities": {"_meta": {"zed.dev": False}}}, "_zed.dev/a")
    deep: Any = ["_deep/m"]
    for _ in range(10):
        deep = {"k": deep}
    assert not advertised({"_meta": deep}, "_deep/m")   # bounded search


def _event_meta(message: dict[str, Any]) -> dict[str, Any]:
    return message["params"]["_meta"]["acp-server/event"]  # type: ignore[no-any-return]


async def test_resumable_frames_carry_event_ids(server: RunningAcpServer) -> None:
    async with ws_connect(server.base_url, "/acp") as ws:
        await ws.send_json(request(0, "initialize", RESUMABLE))
        init = await ws.receive_json()
        assert init["result"]["_meta"]["acp-server"]["resumable"] is True
        await ws.send_json(request(1, "session/new", {"cwd": server.workspace,
                                                      "mcpServers": []}))
        sid = (await ws.receive_json())["result"]["sessionId"]
        await ws.send_json(request(2, "session/prompt", {"sessionId": sid, "prompt": text("hi")}))
        seen = []
        while True:
            message = await ws.receive_json()
            if message.get("id") == 2:
                break
            seen.append(message)
        epoch = server.bridge.get_session(sid).bus.epoch
        metas = [_event_meta(m) for m in seen]
        assert [m["epoch"] for m in metas] == [epoch] * len(seen)
        assert {m["sessionId"] for m in metas} == {sid}
        assert [m["id"] for m in metas] == list(range(1, len(seen) + 1))
        update = next(m for m in seen if m["method"] == "session/update")
        assert set(update["params"]) == {"sessionId", "update", "_meta"}
    # a connection that did not ask sees the frames as before
    conn_id, init = await server.initialize()
    assert "resumable" not in init["result"]["_meta"]["acp-server"]


async def _prompt_ws(ws: Any, rpc_id: Any, sid: str, value: str, prompt_id: str) -> None:
    await ws.send_json(request(rpc_id, "session/prompt", {
        "sessionId": sid, "prompt": text(value), "_meta": {"acp-server/promptId": prompt_id}}))


async def test_reconnect_recipe(server: RunningAcpServer) -> None:
    """A turn survives its connection: re-attached by cursor and prompt id, nothing
    doubled, the prompt admitted once, a pending permission asked again."""
    async with ws_connect(server.base_url, "/acp") as ws:
        await ws.send_json(request(0, "initialize", RESUMABLE))
        await ws.receive_json()
        await ws.send_json(request(1, "session/new", {"cwd": server.workspace, "mcpServers": []}))
        sid = (await ws.receive_json())["result"]["sessionId"]
        await _prompt_ws(ws, 2, sid, "/permission ask me", "prompt-A")
        seen: list[dict[str, Any]] = []
        while True:
            message = await ws.receive_json()
            seen.append(message)
            if message.get("method") == "session/request_permission":
                break
        await ws.close(4000)   # not 1000: that would end the connection like DELETE
    with anyio.fail_after(30):
        while server.registry.connections:   # the server saw the socket go
            await anyio.sleep(0.01)
    # the socket is gone; the turn is not, and neither is its question
    session = server.bridge.get_session(sid)
    assert "prompt-A" in session.pending
    assert server.bridge.permissions.pending_count == 1
    cursor = _event_meta(seen[-2])   # the last event before the question
    async with ws_connect(server.base_url, "/acp") as ws:
        await ws.send_json(request(0, "initialize", RESUMABLE))
        await ws.receive_json()
        await ws.send_json(request(1, "session/load", {
            "sessionId": sid, "cwd": server.workspace, "mcpServers": [],
            "_meta": {"acp-server/lastEventId": cursor["id"],
                      "acp-server/eventEpoch": cursor["epoch"]}}))
        replay = []
        while True:
            message = await ws.receive_json()
            if message.get("id") == 1:
                loaded = message["result"]
                break
            replay.append(message)
        events = [m for m in replay if "acp-server/event" in m["params"].get("_meta", {})]
        assert [m["method"] for m in events] == ["session/request_permission"]
        assert [m["params"]["kind"] for m in replay if m not in events] == ["replay_complete"]
        assert _event_meta(replay[0])["id"] == cursor["id"] + 1
        assert loaded["_meta"]["acp-server/events"]["eventEpoch"] == cursor["epoch"]
        await _prompt_ws(ws, 3, sid, "/permission ask me", "prompt-A")   # sent again
        ask = replay[0]
        await ws.send_json({"jsonrpc": "2.0", "id": ask["id"], "result": {
            "outcome": {"outcome": "selected", "optionId": "allow_once"}}})
        while True:
            message = await ws.receive_json()
            if message.get("id") == 3:
                assert message["result"]["stopReason"] == "end_turn"
                break
        # once more after the end: answered from the prompt's terminal, not run again
        await _prompt_ws(ws, 4, sid, "/permission ask me", "prompt-A")
        message = await ws.receive_json()
        assert message == {"jsonrpc": "2.0", "id": 4, "result": {"stopReason": "end_turn"}}
        users = [e for e in session.bus.ring_events() if e.type == "session_update"
                 and b"user_message_chunk" in envelope(e)]
        assert len(users) == 1
        # a foreign epoch: nothing replayed, the answer says why
        await ws.send_json(request(5, "session/resume", {
            "sessionId": sid, "cwd": server.workspace,
            "_meta": {"acp-server/lastEventId": 1, "acp-server/eventEpoch": "other"}}))
        message = await ws.receive_json()
        while message.get("id") != 5:   # the session stream's replay_complete may come first
            message = await ws.receive_json()
        assert message["result"]["_meta"]["acp-server/events"]["resync"] == "epoch_reset"


async def test_a_finished_prompt_resent_on_a_fresh_connection_is_answered_at_once(
        server: RunningAcpServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """helper-52: the answer waited for the fresh channel to write events it was never
    going to carry (it follows the bus live), FLUSH_TIMEOUT_S (10 s), and on a
    WebSocket the messages behind it waited too. With that wait made an hour, the
    answers come only if nothing waits for those events."""
    from acp_server.acp_http import connection

    monkeypatch.setattr(connection, "FLUSH_TIMEOUT_S", 3600.0)
    async with ws_connect(server.base_url, "/acp") as first, \
            ws_connect(server.base_url, "/acp") as ws:   # the first keeps the session
        await first.send_json(request(0, "initialize", RESUMABLE))
        await first.receive_json()
        await first.send_json(request(1, "session/new", {"cwd": server.workspace,
                                                         "mcpServers": []}))
        sid = (await first.receive_json())["result"]["sessionId"]
        await _prompt_ws(first, 2, sid, "/chunks 3 hello", "prompt-B")
        while (await first.receive_json()).get("id") != 2:
            pass
        await ws.send_json(request(0, "initialize", RESUMABLE))
        await ws.receive_json()
        with anyio.fail_after(30):   # a hang guard: the wait it replaced was an hour
            await _prompt_ws(ws, 3, sid, "/chunks 3 hello", "prompt-B")
            await ws.send_json(request(4, "session/list", {}))
            answers = {}
            while len(answers) < 2:
                message = await ws.receive_json()
                if message.get("id") in (3, 4):
                    answers[message["id"]] = message
        assert answers[3].get("result") == {"stopReason": "end_turn"}, answers[3]
        assert "sessions" in answers[4]["result"]


async def test_lost_resumable_connection_cancels_its_permission_after_the_grace(
        tmp_path: Path) -> None:
    async with running_acp_server(tmp_path) as srv:
        srv.registry.resume_grace_s = 0.0
        async with ws_connect(srv.base_url, "/acp") as ws:
            await ws.send_json(request(0, "initialize", RESUMABLE))
            await ws.receive_json()
            await ws.send_json(request(1, "session/new", {"cwd": srv.workspace,
                                                          "mcpServers": []}))
            sid = (await ws.receive_json())["result"]["sessionId"]
            await _prompt_ws(ws, 2, sid, "/permission ask", "p")
            while (await ws.receive_json()).get("method") != "session/request_permission":
                pass
        srv.registry.sweep()
        with anyio.fail_after(30):
            while srv.bridge.permissions.pending_count:
                await anyio.sleep(0.01)
                srv.registry.sweep()
        assert not srv.registry.lingering


async def test_bad_meta_values(server: RunningAcpServer) -> None:
    conn_id, _ = await server.initialize()
    async with server.stream(conn_id) as conn_stream:
        sid = await server.new_session(conn_id, conn_stream)
        async with server.stream(conn_id, sid) as session_stream:
            for rpc_id, meta in ((2, {"acp-server/promptId": 7}),
                                 (3, {"acp-server/promptId": "x" * 129}),
                                 (4, {"acp-server/promptId": ""})):
                await server.post(conn_id, request(rpc_id, "session/prompt", {
                    "sessionId": sid, "prompt": text("x"), "_meta": meta}), sid)
                reply = await session_stream.wait_for_id(rpc_id)
                assert reply["error"]["code"] == -32602, reply
        for rpc_id, meta in ((5, {"acp-server/lastEventId": -1}),
                             (6, {"acp-server/lastEventId": True}),
                             (7, {"acp-server/lastEventId": 1, "acp-server/eventEpoch": 3})):
            await server.post(conn_id, request(rpc_id, "session/load", {
                "sessionId": sid, "cwd": server.workspace, "mcpServers": [], "_meta": meta}))
            reply = await conn_stream.wait_for_id(rpc_id)
            assert reply["error"]["code"] == -32602, reply


@pytest.mark.parametrize("behaviour", ["answer", "hang"])
async def test_session_delete_forwarded_to_an_agent_that_offers_it(
        tmp_path: Path, behaviour: str) -> None:
    """An agent offering ``session/delete`` gets it first; one that never answers it
    (``hang``) holds it for ``--agent-request-timeout-ms`` at most: the session is then
    closed here all the same (it held the delete, and the session, for ever). The
    short deadline is set only once the session is made: ``session/new`` has it too,
    and a loaded machine may keep the agent's process from answering within 300 ms."""
    agent = shlex.join(fixture_command("del", "--delete", behaviour))
    async with running_acp_server(tmp_path, agent=agent) as srv:
        conn_id, _ = await srv.initialize()
        async with srv.stream(conn_id) as conn_stream:
            sid = await srv.new_session(conn_id, conn_stream)
            if behaviour == "hang":   # the deadline is the subject here, and only here
                srv.bridge.options = dataclasses.replace(srv.bridge.options,
                                                         agent_request_timeout_ms=300)
            async with srv.stream(conn_id, sid) as session_stream:
                await srv.post(conn_id, request(2, "session/delete", {"sessionId": sid}))
                with anyio.fail_after(15):
                    assert (await session_stream.wait_for_id(2))["result"] == {}
                    await session_stream.wait_for_end()
            await srv.post(conn_id, request(3, "session/list", {}))
            listed = await conn_stream.wait_for_id(3)
            assert sid not in [s["sessionId"] for s in listed["result"]["sessions"]]
        assert list(tmp_path.rglob("deleted-*")), "the agent was not asked"
