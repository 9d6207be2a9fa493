"""The happy path over raw HTTP: initialize, streams, session/new, prompt, replies."""

from __future__ import annotations

import pytest

from tests.acp_http.server import RunningAcpServer

pytestmark = pytest.mark.anyio


async def test_initialize_inline(server: RunningAcpServer) -> None:
    conn_id, body = await server.initialize()
    assert conn_id
    assert body["jsonrpc"] == "2.0" and body["id"] == 0
    result = body["result"]
    assert result["protocolVersion"] == 1
    assert "agentCapabilities" in result


async def test_prompt_round_trip(server: RunningAcpServer) -> None:
    conn_id, _ = await server.initialize()
    async with server.stream(conn_id) as conn_stream:
        sid = await server.new_session(conn_id, conn_stream)
        async with server.stream(conn_id, sid) as session_stream:
            response = await server.prompt(conn_id, sid, 2, "/chunks 3 hello there")
            assert response.status_code == 202 and response.content == b""
            reply = await session_stream.wait_for_id(2)
            assert reply["result"]["stopReason"] == "end_turn"
            updates = [(i, m) for i, m in session_stream.frames
                       if m.get("method") == "session/update"]
            chunks = [m["params"]["update"]["content"]["text"] for _i, m in updates
                      if m["params"]["update"]["sessionUpdate"] == "agent_message_chunk"]
            assert "".join(chunks) == "Echo: hello there"
            assert len(chunks) == 3
            assert all(i is not None and i.isdigit() for i, _m in updates)
            kinds = [m["params"]["kind"] for m in session_stream.messages
                     if m.get("method") == "_qwen/notify"]
            assert "turn_complete" in kinds


async def test_sse_framing_retry_and_heartbeat(tmp_path) -> None:
    import anyio

    from tests.acp_http.server import running_acp_server

    async with running_acp_server(tmp_path, heartbeat_s=0.05) as srv:
        conn_id, _ = await srv.initialize()
        headers = {"Accept": "text/event-stream", "Acp-Connection-Id": conn_id}
        received = b""
        async with srv.client.stream("GET", "/acp", headers=headers) as response:
            assert response.status_code == 200
            assert response.headers["content-type"] == "text/event-stream"
            with anyio.fail_after(30):
                async for chunk in response.aiter_bytes():
                    received += chunk
                    if received.count(b": hb\n") >= 2:
                        break
        assert received.startswith(b"retry: 3000\n: hb\n: hb\n")   # no data-less frame


async def test_session_new_picks_an_agent_and_passes_its_answer_through(server: RunningAcpServer) -> None:
    from tests.acp_http.server import request

    conn_id, _ = await server.initialize()
    async with server.stream(conn_id) as conn_stream:
        params = {"cwd": server.workspace, "mcpServers": [],
                  "_meta": {"acp-server/agent": "reference", "acp-server/origin": "ci.editor"}}
        await server.post(conn_id, request(7, "session/new", params))
        reply = await conn_stream.wait_for_id(7)
        assert isinstance(reply["result"]["sessionId"], str)
        assert server.bridge.session_status(reply["result"]["sessionId"]).origin == "ci.editor"
        params["_meta"] = {"acp-server/agent": "nope"}
        await server.post(conn_id, request(8, "session/new", params))
        error = (await conn_stream.wait_for_id(8))["error"]
        assert error["code"] == -32602
        assert error["data"] == {"errorKind": "agent_not_found", "available": ["reference"]}
