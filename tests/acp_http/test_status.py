"""Every HTTP status rule of ``/acp``, with raw httpx."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from tests.acp_http.server import RunningAcpServer, request, running_acp_server

pytestmark = pytest.mark.anyio


def rpc_error(body: bytes) -> dict:
    message = json.loads(body)
    assert message["jsonrpc"] == "2.0"
    return message["error"]


async def test_post_wrong_content_type_415(server: RunningAcpServer) -> None:
    response = await server.client.post("/acp", content=json.dumps(request(0, "initialize")),
                                        headers={"Content-Type": "text/plain"})
    assert response.status_code == 415


async def test_post_batch_501(server: RunningAcpServer) -> None:
    response = await server.post(None, [request(0, "initialize")])
    assert response.status_code == 501
    assert response.json() == {"error": "Batch JSON-RPC requests are not supported"}


async def test_post_malformed_json_400_parse_error(server: RunningAcpServer) -> None:
    response = await server.client.post("/acp", content=b"{not json",
                                        headers={"Content-Type": "application/json"})
    assert response.status_code == 400
    assert rpc_error(response.content)["code"] == -32700
    assert response.json()["id"] is None


@pytest.mark.parametrize("body", [{"id": 1, "method": "initialize"},
                                  {"jsonrpc": "1.0", "id": 1, "method": "x"}, 5, "str",
                                  {"jsonrpc": "2.0", "id": 1, "method": "x", "params": 3}])
async def test_post_not_jsonrpc_400_invalid_request(server: RunningAcpServer, body: object) -> None:
    response = await server.post(None, body)
    assert response.status_code == 400
    assert rpc_error(response.content)["code"] == -32600


async def test_post_missing_connection_400(server: RunningAcpServer) -> None:
    response = await server.post(None, request(1, "session/list", {}))
    assert response.status_code == 400
    error = rpc_error(response.content)
    assert error == {"code": -32600, "message": "Missing Acp-Connection-Id"}
    assert response.json()["id"] == 1


async def test_post_unknown_connection_404(server: RunningAcpServer) -> None:
    response = await server.post("nope", request(1, "session/list", {}))
    assert response.status_code == 404
    assert rpc_error(response.content) == {"code": -32600, "message": "Unknown Acp-Connection-Id"}


async def test_initialize_with_connection_header_400(server: RunningAcpServer) -> None:
    conn_id, _ = await server.initialize()
    response = await server.post(conn_id, request(5, "initialize", {"protocolVersion": 1}))
    assert response.status_code == 400
    assert rpc_error(response.content)["code"] == -32600


async def test_session_header_mismatch_400(server: RunningAcpServer) -> None:
    conn_id, _ = await server.initialize()
    message = request(3, "session/prompt", {"sessionId": "a", "prompt": []})
    response = await server.post(conn_id, message, "b")
    assert response.status_code == 400
    assert rpc_error(response.content)["code"] == -32602
    assert response.json()["id"] == 3


async def test_session_method_without_any_session_id_400(server: RunningAcpServer) -> None:
    conn_id, _ = await server.initialize()
    message = request(3, "session/prompt", {"prompt": []})
    response = await server.post(conn_id, message)
    assert response.status_code == 400
    assert rpc_error(response.content) == {"code": -32600,
                                           "message": "Missing Acp-Session-Id for session/prompt"}


async def test_session_method_falls_back_to_params_session_id(server: RunningAcpServer) -> None:
    """qwen's AcpHttpTransport sends ``params.sessionId`` without the header."""
    conn_id, _ = await server.initialize()
    message = request(3, "session/prompt", {"sessionId": "a", "prompt": []})
    response = await server.post(conn_id, message)
    assert response.status_code == 202 and response.content == b""


async def test_post_over_body_limit_413(tmp_path: Path) -> None:
    async with running_acp_server(tmp_path, max_body_bytes=1024) as srv:
        conn_id, _ = await srv.initialize()
        message = request(1, "session/list", {"pad": "x" * 2000})
        response = await srv.post(conn_id, message)
        assert response.status_code == 413


async def test_get_without_event_stream_accept_406(server: RunningAcpServer) -> None:
    conn_id, _ = await server.initialize()
    response = await server.client.get("/acp", headers={"Acp-Connection-Id": conn_id,
                                                        "Accept": "application/json"})
    assert response.status_code == 406


@pytest.mark.parametrize("accept", ["text/event-stream;q=0", "text/event-stream; Q=0.000",
                                    "application/x-text/event-stream-like", "*/*", "text/*"])
async def test_get_accept_that_refuses_event_stream_406(server: RunningAcpServer,
                                                        accept: str) -> None:
    """The RFD: ``Accept`` MUST include ``text/event-stream``; ``q=0`` refuses it."""
    conn_id, _ = await server.initialize()
    response = await server.client.get("/acp", headers={"Acp-Connection-Id": conn_id,
                                                        "Accept": accept})
    assert response.status_code == 406, accept


@pytest.mark.parametrize("accept", ["application/json, text/event-stream;q=0.5",
                                    "TEXT/Event-Stream", "text/event-stream; q=oops"])
async def test_get_accept_naming_event_stream_opens_it(server: RunningAcpServer,
                                                       accept: str) -> None:
    conn_id, _ = await server.initialize()
    async with server.client.stream("GET", "/acp", headers={"Acp-Connection-Id": conn_id,
                                                            "Accept": accept}) as response:
        assert response.status_code == 200, accept


async def test_get_connection_header_rules(server: RunningAcpServer) -> None:
    sse = {"Accept": "text/event-stream"}
    response = await server.client.get("/acp", headers=sse)
    assert response.status_code == 400
    response = await server.client.get("/acp", headers={**sse, "Acp-Connection-Id": "nope"})
    assert response.status_code == 404


async def test_second_reader_409(server: RunningAcpServer) -> None:
    conn_id, _ = await server.initialize()
    headers = {"Accept": "text/event-stream", "Acp-Connection-Id": conn_id}
    async with server.stream(conn_id) as conn_stream:
        response = await server.client.get("/acp", headers=headers)
        assert response.status_code == 409
        sid = await server.new_session(conn_id, conn_stream)
        async with server.stream(conn_id, sid):
            response = await server.client.get("/acp", headers={**headers, "Acp-Session-Id": sid})
            assert response.status_code == 409
        # The reader left: the stream can be opened again.
        async with server.stream(conn_id, sid):
            pass


async def test_connection_cap_503(tmp_path: Path) -> None:
    async with running_acp_server(tmp_path, max_connections=2) as srv:
        await srv.initialize()
        await srv.initialize()
        response = await srv.post(None, request(7, "initialize", {"protocolVersion": 1}))
        assert response.status_code == 503
        assert response.headers["retry-after"] == "5"
        assert response.json() == {"jsonrpc": "2.0", "id": 7, "error": {
            "code": -32603, "message": "Too many ACP connections; retry later"}}


async def test_delete_then_404(server: RunningAcpServer) -> None:
    conn_id, _ = await server.initialize()
    response = await server.client.delete("/acp", headers={"Acp-Connection-Id": conn_id})
    assert response.status_code == 202
    response = await server.post(conn_id, request(1, "session/list", {}))
    assert response.status_code == 404
    response = await server.client.delete("/acp", headers={"Acp-Connection-Id": conn_id})
    assert response.status_code == 404
    response = await server.client.delete("/acp")
    assert response.status_code == 400


async def test_unknown_method_32601_on_connection_stream(server: RunningAcpServer) -> None:
    conn_id, _ = await server.initialize()
    response = await server.post(conn_id, request(9, "foo/bar", {}))
    assert response.status_code == 202
    async with server.stream(conn_id) as conn_stream:   # buffered until it opens
        reply = await conn_stream.wait_for_id(9)
    assert reply["error"]["code"] == -32601
    assert reply["error"]["message"] == "Unknown method: foo/bar"


async def test_token_and_origin_guard(tmp_path: Path) -> None:
    async with running_acp_server(tmp_path, token="s3cret") as srv:
        response = await srv.post(None, request(0, "initialize", {"protocolVersion": 1}))
        assert response.status_code == 401
        response = await srv.post(None, request(0, "initialize", {"protocolVersion": 1}),
                                  Authorization="Bearer s3cret")
        assert response.status_code == 200
        response = await srv.post(None, request(0, "initialize", {"protocolVersion": 1}),
                                  Authorization="Bearer s3cret", Origin="http://evil.example")
        assert response.status_code == 403


async def test_one_principal_cannot_take_every_connection(tmp_path: Any) -> None:
    """Three quarters of --max-acp-connections at most are one principal's: the last
    quarter stays for the others (helper-54: one read token locked everyone out)."""
    from acp_server.acp_http.registry import ConnectionCapError, principal_share
    from acp_server.principals.gate import LOCAL_CALLER, Caller

    assert [principal_share(n) for n in (1, 2, 4, 64)] == [1, 2, 3, 48]
    async with running_acp_server(tmp_path, max_connections=4) as srv:
        registry = srv.registry
        other = Caller(dataclasses.replace(LOCAL_CALLER.principal, name="other"),
                       LOCAL_CALLER.gate)
        held = [registry.create(caller=LOCAL_CALLER) for _ in range(3)]
        with pytest.raises(ConnectionCapError, match="of this principal"):
            registry.create(caller=LOCAL_CALLER)
        registry.create(caller=other)   # the last one: another principal's
        with pytest.raises(ConnectionCapError, match="Too many ACP connections; retry"):
            registry.create(caller=other)
        assert len(held) == 3
