"""A client's answer to an agent's question (``session/request_permission``,
``elicitation/create``) whose ``result`` cannot be decoded (a number out of range,
``1e999``): never a 5xx nor a dropped socket, and the question stays open, so the
client can answer it again (over real HTTP and WebSocket)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.acp_http.extended_agent import ExtendedFactory
from tests.acp_http.server import RunningAcpServer, request, running_acp_server, said, text
from tests.acp_http.wsclient import ws_connect

pytestmark = pytest.mark.anyio


def _unreadable(request_id: str, result: str) -> str:
    return '{"jsonrpc":"2.0","id":"%s","result":%s}' % (request_id, result)


async def test_an_unreadable_permission_answer_over_post_leaves_it_open(
        server: RunningAcpServer) -> None:
    conn_id, _ = await server.initialize()
    async with server.stream(conn_id) as conn_stream:
        sid = await server.new_session(conn_id, conn_stream)
        async with server.stream(conn_id, sid) as session_stream:
            await server.prompt(conn_id, sid, 2, "/permission go")
            ask = await session_stream.wait_for(
                lambda m: m.get("method") == "session/request_permission")
            option = ask["params"]["options"][0]["optionId"]
            for bad in ('{"outcome":{"outcome":"selected","optionId":"%s"},"n":1e999}' % option,
                        "1e999", '[1e999]'):
                response = await server.client.post("/acp", content=_unreadable(ask["id"], bad),
                                                    headers={"Content-Type": "application/json",
                                                             "Acp-Connection-Id": conn_id,
                                                             "Acp-Session-Id": sid})
                assert response.status_code == 202, response.text
                assert server.bridge.permissions.pending_count == 1   # still asked
            answer = {"jsonrpc": "2.0", "id": ask["id"],
                      "result": {"outcome": {"outcome": "selected", "optionId": option}}}
            assert (await server.post(conn_id, answer, sid)).status_code == 202
            reply = await session_stream.wait_for_id(2)
            assert reply["result"]["stopReason"] == "end_turn"
            assert f"Permission allowed ({option})." in said(session_stream.messages)
            assert not server.bridge.permissions.pending_count


async def test_an_unreadable_permission_answer_over_a_websocket_keeps_the_socket(
        server: RunningAcpServer) -> None:
    async with ws_connect(server.base_url, "/acp") as ws:
        await ws.send_json(request(0, "initialize", {"protocolVersion": 1}))
        await ws.receive_json()
        await ws.send_json(request(1, "session/new", {"cwd": server.workspace, "mcpServers": []}))
        sid = (await ws.wait_for(lambda m: m.get("id") == 1))["result"]["sessionId"]
        await ws.send_json(request(2, "session/prompt", {"sessionId": sid,
                                                         "prompt": text("/permission go")}))
        ask = await ws.wait_for(lambda m: m.get("method") == "session/request_permission")
        option = ask["params"]["options"][0]["optionId"]
        await ws.send_text(_unreadable(ask["id"], '{"outcome":1e999}'))
        await ws.send_json(request(3, "session/list", {}))   # the socket still serves
        assert "result" in await ws.wait_for(lambda m: m.get("id") == 3)
        assert server.bridge.permissions.pending_count == 1
        await ws.send_json({"jsonrpc": "2.0", "id": ask["id"], "result": {
            "outcome": {"outcome": "selected", "optionId": option}}})
        seen: list[dict[str, Any]] = []
        done = await ws.wait_for(lambda m: seen.append(m) or m.get("id") == 2)
        assert done["result"]["stopReason"] == "end_turn"
        assert f"Permission allowed ({option})." in said(seen)


async def test_an_unreadable_elicitation_answer_leaves_it_open(tmp_path: Path) -> None:
    offers = {"protocolVersion": 1, "clientCapabilities": {"elicitation": {"form": {}}}}
    async with running_acp_server(tmp_path, agent_factory=ExtendedFactory()) as srv:
        async with ws_connect(srv.base_url) as ws:
            await ws.send_json(request(0, "initialize", offers))
            await ws.receive_json()
            await ws.send_json(request(1, "session/new", {"cwd": srv.workspace,
                                                          "mcpServers": []}))
            sid = (await ws.wait_for(lambda m: m.get("id") == 1))["result"]["sessionId"]
            await ws.send_json(request(2, "session/prompt", {"sessionId": sid,
                                                             "prompt": text("/elicit form")}))
            ask = await ws.wait_for(lambda m: m.get("method") == "elicitation/create")
            await ws.send_text(_unreadable(ask["id"], '{"action":"accept","n":-1e999}'))
            await ws.send_json(request(3, "session/list", {}))
            assert "result" in await ws.wait_for(lambda m: m.get("id") == 3)
            assert srv.bridge.elicitations.pending_count == 1
            await ws.send_json({"jsonrpc": "2.0", "id": ask["id"], "result": {
                "action": "accept", "content": {"name": "Ada"}}})
            seen: list[dict[str, Any]] = []
            done = await ws.wait_for(lambda m: seen.append(m) or m.get("id") == 2)
            assert done["result"]["stopReason"] == "end_turn"
            assert said(seen) == 'Elicited accept {"name": "Ada"}'


async def test_params_with_a_number_out_of_range_say_so(server: RunningAcpServer) -> None:
    conn_id, _ = await server.initialize()
    response = await server.client.post(
        "/acp", content='{"jsonrpc":"2.0","id":5,"method":"session/list","params":{"n":1e999}}',
        headers={"Content-Type": "application/json", "Acp-Connection-Id": conn_id})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == -32602
    assert "out of range" in error["message"] and "not JSON" not in error["message"]
