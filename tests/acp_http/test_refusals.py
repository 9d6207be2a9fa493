"""What ``/acp`` refuses, over real loopback HTTP and WebSocket: malformed input with
the JSON-RPC 2.0 codes (-32700 not JSON, -32600 not a message) and a request with
``id: null`` (-32600 at once, never run), the same on both transports; a request past
the connection's channel cap makes no session first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from acp_server.acp_http import connection
from acp_server.acp_http.inbound import BATCH_MESSAGE, NULL_ID_MESSAGE
from bridge import BridgeOptions
from tests.acp_http.server import (RunningAcpServer, Sse, request, running_acp_server, said,
                                   text)
from tests.acp_http.wsclient import ws_connect

pytestmark = pytest.mark.anyio


PARSE, INVALID = -32700, -32600
LIST = b'{"jsonrpc":"2.0","id":1,"method":"session/list"'   # cut short of its "}"
DEEP = b"[" * 5000 + b"]" * 5000
# (case, body, code, id of the answer); every one answered 400 on Streamable HTTP
MALFORMED: list[tuple[str, bytes, int, Any]] = [
    ("cut short", LIST, PARSE, None),
    ("cut short in an array", b'[{"jsonrpc":"2.0","id":1', PARSE, None),
    ("cut short in the id", b'{"jsonrpc":"2.0","id":[1', PARSE, None),
    ("cut short after a bad jsonrpc", b'{"jsonrpc":2,', PARSE, None),
    ("cut short array", b"[1,2", PARSE, None),
    ("trailing garbage", LIST + b"} x", PARSE, None),
    ("two objects", LIST + b"}{}", PARSE, None),
    ("a number then garbage", b"12x", PARSE, None),
    ("nothing", b"", PARSE, None),
    ("whitespace", b" \n ", PARSE, None),
    ("NaN id", b'{"jsonrpc":"2.0","id":NaN,"method":"session/list"}', PARSE, None),
    ("NaN in params", LIST + b',"params":{"a":NaN}}', PARSE, None),
    ("Infinity in params", LIST + b',"params":{"a":-Infinity}}', PARSE, None),
    ("single quotes", b"{'jsonrpc':'2.0','id':1,'method':'session/list'}", PARSE, None),
    ("trailing comma", LIST + b",}", PARSE, None),
    ("byte order mark", b"\xef\xbb\xbf" + LIST + b"}", PARSE, None),
    ("too deep in params", LIST + b',"params":{"a":' + DEEP + b"}}", PARSE, None),
    ("too deep", DEEP, PARSE, None),
    ("invalid UTF-8 in the method", b'{"jsonrpc":"2.0","id":1,"method":"\xff"}', PARSE, None),
    ("invalid UTF-8 in params", LIST + b',"params":{"a":"\xc3("}}', PARSE, None),
    ("invalid UTF-8 in an unknown member", LIST + b',"x":"\xff"}', PARSE, None),
    ("a string", b'"session/list"', INVALID, None),
    ("a number", b"42", INVALID, None),
    ("null", b"null", INVALID, None),
    ("true", b"true", INVALID, None),
    ("an empty array", b"[ ]", INVALID, None),
    ("an empty object", b"{}", INVALID, None),
    ("jsonrpc a number", b'{"jsonrpc":2.0,"id":1,"method":"session/list"}', INVALID, 1),
    ("jsonrpc absent", b'{"id":1,"method":"session/list"}', INVALID, 1),
    ("jsonrpc 1.0", b'{"jsonrpc":"1.0","id":1,"method":"session/list"}', INVALID, 1),
    ("method a number", b'{"jsonrpc":"2.0","id":1,"method":5}', INVALID, 1),
    ("method null", b'{"jsonrpc":"2.0","id":1,"method":null}', INVALID, 1),
    ("id an object", b'{"jsonrpc":"2.0","id":{},"method":"session/list"}', INVALID, None),
    ("id a fraction", b'{"jsonrpc":"2.0","id":1.5,"method":"session/list"}', INVALID, None),
    ("id true", b'{"jsonrpc":"2.0","id":true,"method":"session/list"}', INVALID, None),
    ("id out of range", b'{"jsonrpc":"2.0","id":1e999,"method":"session/list"}', INVALID, None),
    ("params a string", LIST + b',"params":"x"}', INVALID, 1),
    ("a response without an id", b'{"jsonrpc":"2.0","result":{}}', INVALID, None),
    ("a response with both", b'{"jsonrpc":"2.0","id":"r","result":1,'
                             b'"error":{"code":1,"message":"m"}}', INVALID, "r"),
    ("an error code a string", b'{"jsonrpc":"2.0","id":"r","error":{"code":"x","message":"m"}}',
     INVALID, "r"),
    ("a null id", b'{"jsonrpc":"2.0","id":null,"method":"session/list"}', INVALID, None),
    ("a null id on initialize", b'{"jsonrpc":"2.0","id":null,"method":"initialize",'
                                b'"params":{"protocolVersion":1}}', INVALID, None),
]


def _expected(text: bool) -> dict[str, tuple[int, Any]]:
    return {case: (code, rpc_id) for case, body, code, rpc_id in MALFORMED
            if not text or _is_text(body)}


def _is_text(body: bytes) -> bool:
    """A WebSocket text frame is UTF-8 by its protocol: the others cannot be sent."""
    try:
        body.decode()
    except UnicodeDecodeError:
        return False
    return True


def _answer(message: dict[str, Any]) -> tuple[int, Any]:
    assert message["jsonrpc"] == "2.0" and set(message) == {"jsonrpc", "id", "error"}, message
    assert isinstance(message["error"]["message"], str)
    return message["error"]["code"], message["id"]


async def _posted(server: RunningAcpServer) -> dict[str, tuple[int, Any]]:
    """Each body POSTed on a live connection: always 400."""
    conn_id, _ = await server.initialize()
    answers: dict[str, tuple[int, Any]] = {}
    for case, body, _code, _id in MALFORMED:
        response = await server.client.post("/acp", content=body, headers={
            "Content-Type": "application/json", "Acp-Connection-Id": conn_id})
        assert response.status_code == 400, (case, response.status_code, response.text)
        answers[case] = _answer(response.json())
    batch = await server.post(conn_id, [request(1, "session/list")])
    assert (batch.status_code, batch.json()) == (501, {"error": BATCH_MESSAGE})
    return answers


async def _framed(server: RunningAcpServer) -> dict[str, tuple[int, Any]]:
    """Each body as a text frame of one socket: an error frame each; the socket stays
    open and serves the next request."""
    answers: dict[str, tuple[int, Any]] = {}
    async with ws_connect(server.base_url) as ws:
        await ws.send_json(request(0, "initialize", {"protocolVersion": 1}))
        assert (await ws.receive_json())["id"] == 0
        for case, body, _code, _id in MALFORMED:
            if _is_text(body):
                await ws.send_text(body.decode())
                answers[case] = _answer(await ws.receive_json())
        await ws.send_json([request(1, "session/list")])
        batch = await ws.receive_json()
        assert _answer(batch) == (INVALID, None) and batch["error"]["message"] == BATCH_MESSAGE
        await ws.send_json(request(2, "session/list"))
        assert (await ws.receive_json()) == {"jsonrpc": "2.0", "id": 2,
                                             "result": {"sessions": []}}
    return answers


@pytest.mark.parametrize("transport", ["http", "websocket"])
async def test_malformed_input_gets_the_json_rpc_codes(server: RunningAcpServer,
                                                        transport: str) -> None:
    """Every case of ``MALFORMED`` on both transports: -32700 when it is not JSON,
    -32600 when it is JSON but not a JSON-RPC message (with its id when one could be
    read). One server and one connection per transport; the whole table compared at
    once, so a failure names every case that differs."""
    if transport == "http":
        assert await _posted(server) == _expected(text=False)
    else:
        assert await _framed(server) == _expected(text=True)


def _null_id(method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": None, "method": method, "params": params}


def _refused_null_id(message: dict[str, Any]) -> None:
    assert message == {"jsonrpc": "2.0", "id": None, "error": {
        "code": INVALID, "message": NULL_ID_MESSAGE}}, message


async def test_a_null_id_request_is_refused_at_once_over_http(server: RunningAcpServer) -> None:
    """``initialize``, ``session/new`` and ``session/prompt`` with ``id: null``: 400
    -32600 with ``id: null`` on the POST itself; nothing is opened, made or run."""
    response = await server.post(None, _null_id("initialize", {"protocolVersion": 1}))
    assert response.status_code == 400
    _refused_null_id(response.json())
    assert not server.registry.connections
    conn_id, _ = await server.initialize()
    async with server.stream(conn_id) as conn_stream:
        sid = await server.new_session(conn_id, conn_stream)
        response = await server.post(conn_id, _null_id(
            "session/new", {"cwd": server.workspace, "mcpServers": []}))
        assert response.status_code == 400
        _refused_null_id(response.json())
        async with server.stream(conn_id, sid) as session_stream:
            response = await server.post(conn_id, _null_id(
                "session/prompt", {"sessionId": sid, "prompt": text("not run")}), sid)
            assert response.status_code == 400
            _refused_null_id(response.json())
            await server.prompt(conn_id, sid, 9, "after")
            assert (await session_stream.wait_for_id(9))["result"]["stopReason"] == "end_turn"
            assert said(session_stream.messages) == "Echo: after"   # the null one never ran
        assert [s.session_id for s in server.bridge.list_sessions()] == [sid]
    assert all(m["id"] is not None for m in conn_stream.messages if "method" not in m)


async def test_a_null_id_request_is_refused_at_once_over_websocket(
        server: RunningAcpServer) -> None:
    """The same as error frames; the socket stays open. A first frame ``initialize``
    with ``id: null`` is answered so, then the socket closes (1002)."""
    async with ws_connect(server.base_url) as ws:
        await ws.send_json(_null_id("initialize", {"protocolVersion": 1}))
        _refused_null_id(await ws.receive_json())
        assert await ws.wait_closed() == 1002
    async with ws_connect(server.base_url) as ws:
        await ws.send_json(request(0, "initialize", {"protocolVersion": 1}))
        assert (await ws.receive_json())["id"] == 0
        await ws.send_json(request(1, "session/new", {"cwd": server.workspace,
                                                      "mcpServers": []}))
        sid = (await ws.wait_for(lambda m: m.get("id") == 1))["result"]["sessionId"]
        await ws.send_json(_null_id("session/new", {"cwd": server.workspace,
                                                    "mcpServers": []}))
        _refused_null_id(await ws.receive_json())
        await ws.send_json(_null_id("session/prompt", {"sessionId": sid,
                                                       "prompt": text("not run")}))
        _refused_null_id(await ws.receive_json())
        await ws.send_json(request(2, "session/prompt", {"sessionId": sid,
                                                         "prompt": text("after")}))
        seen: list[dict[str, Any]] = []
        reply = await ws.wait_for(lambda m: seen.append(m) or m.get("id") == 2)
        assert reply["result"]["stopReason"] == "end_turn"
        assert said(seen) == "Echo: after"   # the null one never ran
        assert all(m["id"] is not None for m in seen if "method" not in m)
        assert [s.session_id for s in server.bridge.list_sessions()] == [sid]


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


async def test_a_fault_while_a_restore_looks_up_its_maker_is_answered(tmp_path: Path) -> None:
    """A load or resume asks the journal for the session's maker before it runs; a fault
    there other than the store's unavailability (a bug, a value the store refuses) is
    answered -32603 ``internal`` like a fault in the method itself: the WebSocket stays
    open (it was closed, every session on it detached) and over HTTP the answer reaches
    the stream (none was sent)."""
    async with running_acp_server(tmp_path) as srv:
        async def fault(session_id: str) -> str | None:
            raise RuntimeError("not a store outage")

        srv.bridge.journal.record_of = fault  # type: ignore[method-assign]
        params = {"sessionId": "never-made", "cwd": srv.workspace, "mcpServers": []}
        async with ws_connect(srv.base_url) as ws:
            await ws.send_json(request(0, "initialize", {"protocolVersion": 1}))
            await ws.wait_for(lambda m: m.get("id") == 0)
            await ws.send_json(request(1, "session/load", params))
            answer = await ws.wait_for(lambda m: m.get("id") == 1)
            assert answer["error"]["data"]["errorKind"] == "internal", answer
            await ws.send_json(request(2, "session/list", {}))
            assert "result" in await ws.wait_for(lambda m: m.get("id") == 2)
        conn_id, _ = await srv.initialize()
        async with srv.stream(conn_id) as stream:
            assert (await srv.post(conn_id, request(3, "session/resume", params))).status_code \
                == 202
            answer = await stream.wait_for_id(3)
            assert answer["error"]["data"]["errorKind"] == "internal", answer


async def test_the_channels_of_gone_sessions_do_not_fill_the_cap(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A long-lived connection whose sessions were closed elsewhere (another
    connection's ``session/close``), and which opened streams for ids that are no
    session (as the TypeScript SDK does before a ``session/load`` that then fails),
    still makes sessions: at the cap those channels go, not the new session."""
    monkeypatch.setattr(connection, "MAX_CHANNELS_PER_CONNECTION", 2)
    async with running_acp_server(tmp_path) as srv:
        conn_id, _ = await srv.initialize()
        other, _ = await srv.initialize()
        async with srv.stream(conn_id) as conn_stream:
            made = [await srv.new_session(conn_id, conn_stream, rpc_id=i) for i in (1, 2)]
            for rpc_id, sid in enumerate(made, start=3):
                async with srv.stream(other, sid) as closing:
                    await srv.post(other, request(rpc_id, "session/close", {"sessionId": sid}),
                                   sid)
                    assert (await closing.wait_for_id(rpc_id))["result"] == {}
            third = await srv.new_session(conn_id, conn_stream, rpc_id=5)
            for gone in ("no-such-1", "no-such-2"):   # a stream, then a load that fails
                async with srv.stream(conn_id, gone):
                    pass
            response = await srv.post(conn_id, request(6, "session/load", {
                "sessionId": "no-such-1", "cwd": srv.workspace, "mcpServers": []}), "no-such-1")
            assert response.status_code == 202, response.text
            assert (await conn_stream.wait_for_id(6))["error"]["code"] == -32602
            fourth = await srv.new_session(conn_id, conn_stream, rpc_id=7)
            async with srv.stream(conn_id, fourth) as session_stream:   # both still served
                await srv.prompt(conn_id, fourth, 8, "hi")
                assert (await session_stream.wait_for_id(8))["result"]["stopReason"] == "end_turn"
                await srv.prompt(conn_id, third, 9, "hi")
                async with srv.stream(conn_id, third) as third_stream:
                    assert (await third_stream.wait_for_id(9))["result"] == {
                        "stopReason": "end_turn"}
