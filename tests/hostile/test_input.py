"""Bad input answered in each door's own 4xx shape, never a 500 (over real HTTP / WebSocket)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest

from acp_server.http.body import MAX_JSON_DEPTH
from tests.acp_http.wsclient import ws_connect
from tests.lmsp.server import LmspServer

pytestmark = pytest.mark.anyio

DEEP = b'{"z":' + b"[" * 3000 + b"]" * 3000 + b"}"
JSON = {"Content-Type": "application/json"}
INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def assert_rest_error(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert isinstance(body["error"], str) and body["code"] == code, body


def assert_problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert body["code"] == code and body["status"] == status, body
    return body  # type: ignore[no-any-return]


async def acp_connection(srv: LmspServer) -> str:
    response = await srv.client.post("/acp", json=INIT)
    assert response.status_code == 200, response.text
    return response.headers["acp-connection-id"]


# -- 1. deep JSON ---------------------------------------------------------------------------
async def test_deep_json_rest(server: LmspServer) -> None:
    assert_rest_error(await server.client.post("/session", content=DEEP, headers=JSON),
                      400, "invalid_json")
    sid = (await server.client.post("/session", json={})).json()["sessionId"]
    block = '{"prompt":[{"type":"text","text":"hi","x":' + nested(3000) + "}]}"
    assert_rest_error(await server.client.post(f"/session/{sid}/prompt", content=block,
                                               headers=JSON), 400, "invalid_json")
    # The limit itself: MAX_JSON_DEPTH levels pass, one more is refused.
    ok = '{"prompt":[{"type":"text","text":"hi"}],"x":' + nested(MAX_JSON_DEPTH - 1) + "}"
    assert (await server.client.post(f"/session/{sid}/prompt", content=ok,
                                     headers=JSON)).status_code == 202
    over = '{"prompt":[{"type":"text","text":"hi"}],"x":' + nested(MAX_JSON_DEPTH) + "}"
    assert_rest_error(await server.client.post(f"/session/{sid}/prompt", content=over,
                                               headers=JSON), 400, "invalid_json")
    assert (await server.client.get("/health")).status_code == 200


async def test_deep_json_lmsp(server: LmspServer) -> None:
    for path in ("/lmsp/v1/tasks", "/lmsp/v1/responses"):
        body = assert_problem(await server.client.post(path, content=DEEP, headers=JSON),
                              400, "invalid_request")
        assert body["param"] == "body"
    inner = ('{"type":"response","input":{"model":"reference","input":"hi","metadata":'
             + nested(2000) + "}}")
    assert_problem(await server.client.post("/lmsp/v1/tasks", content=inner, headers=JSON),
                   400, "invalid_request")


async def test_deep_json_acp_http(server: LmspServer) -> None:
    response = await server.client.post("/acp", content=DEEP, headers=JSON)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == -32700
    conn = await acp_connection(server)
    message = '{"jsonrpc":"2.0","id":5,"method":"session/list","params":{"a":' \
        + nested(3000) + "}}"
    response = await server.client.post("/acp", content=message,
                                        headers={**JSON, "Acp-Connection-Id": conn})
    assert response.status_code == 400
    assert response.json()["error"]["code"] in (-32700, -32600)


async def test_deep_json_websocket_keeps_the_socket(server: LmspServer) -> None:
    async with ws_connect(server.base_url) as ws:
        await ws.send_json(INIT)
        assert (await ws.receive_json())["id"] == 0
        await ws.send_json({"jsonrpc": "2.0", "id": 1, "method": "session/list"})
        await ws.send_text('{"jsonrpc":"2.0","id":2,"method":"session/list","params":{"a":'
                           + nested(3000) + "}}")
        await ws.send_json({"jsonrpc": "2.0", "id": 3, "method": "session/list"})
        seen: dict[Any, Any] = {}
        while not {1, 3, None} <= seen.keys():   # replies may come in any order
            message = await ws.receive_json()
            seen[message.get("id")] = message
        assert "result" in seen[1] and "result" in seen[3]   # owed replies not lost
        assert seen[None]["error"]["code"] == -32700


# -- 2. NUL byte ----------------------------------------------------------------------------
async def test_nul_byte_in_cwd(server: LmspServer) -> None:
    bad = {"cwd": "/tmp\u0000x"}
    assert_rest_error(await server.client.post("/session", json=bad), 400, "workspace_mismatch")
    sid = str(uuid.uuid4())
    for route in ("load", "resume"):
        assert_rest_error(await server.client.post(f"/session/{sid}/{route}", json=bad),
                          400, "workspace_mismatch")
    conn = await acp_connection(server)
    async with server.client.stream("GET", "/acp", headers={
            "Accept": "text/event-stream", "Acp-Connection-Id": conn}) as stream:
        response = await server.client.post("/acp", headers={**JSON, "Acp-Connection-Id": conn},
                                            content=json.dumps({
                                                "jsonrpc": "2.0", "id": 7,
                                                "method": "session/new", "params": bad}))
        assert response.status_code == 202
        async for line in stream.aiter_lines():
            if line.startswith("data: "):
                reply = json.loads(line[6:])
                if reply.get("id") == 7:
                    break
    assert reply["error"]["code"] == -32602


# -- 3. unknown session on load / resume ---------------------------------------------------
async def test_unknown_session_restore_is_404(server: LmspServer) -> None:
    sid = str(uuid.uuid4())
    for route in ("load", "resume"):
        response = await server.client.post(f"/session/{sid}/{route}", json={})
        assert_rest_error(response, 404, "session_not_found")
    assert (await server.client.get("/daemon/status")).status_code == 200


# -- 12. session/new as a notification -----------------------------------------------------
async def test_session_new_notification_is_refused(server: LmspServer) -> None:
    conn = await acp_connection(server)
    before = len(server.service.models["reference"][0].sessions())
    for method in ("session/new", "session/load", "session/resume"):
        response = await server.client.post("/acp", headers={**JSON, "Acp-Connection-Id": conn},
                                            content=json.dumps({
                                                "jsonrpc": "2.0", "method": method,
                                                "params": {"cwd": "/", "sessionId": "x"}}))
        assert response.status_code == 400, response.text
        assert response.json()["error"]["code"] == -32600
    async with ws_connect(server.base_url) as ws:
        await ws.send_json(INIT)
        assert (await ws.receive_json())["id"] == 0
        await ws.send_json({"jsonrpc": "2.0", "method": "session/new", "params": {}})
        reply = await ws.receive_json()
        assert reply["id"] is None and reply["error"]["code"] == -32600
    assert len(server.service.models["reference"][0].sessions()) == before


# -- 4. every LMSP error is a problem object -----------------------------------------------
@pytest.mark.parametrize(("method", "path", "status", "code"), [
    ("GET", "/lmsp/v1/nope", 404, "not_found"),
    ("POST", "/lmsp/v1/tasks/x/y/z", 404, "not_found"),
    ("GET", "/lmsp/v1/tasks/a%2Fb", 404, "not_found"),
    ("GET", "/lmsp/v1/tasks/a%2Fb/events", 404, "not_found"),
    ("OPTIONS", "/lmsp/v1/tasks", 405, "method_not_allowed"),
    ("PUT", "/lmsp/v1/capabilities", 405, "method_not_allowed"),
    ("HEAD", "/lmsp/v1/tasks", 405, "method_not_allowed"),
    ("GET", "/lmsp/", 404, "not_found"),
])
async def test_lmsp_errors_are_problems(server: LmspServer, method: str, path: str,
                                        status: int, code: str) -> None:
    response = await server.client.request(method, path)
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    if method != "HEAD":
        assert response.json()["code"] == code


async def test_lmsp_cors_refusal_is_a_problem(server: LmspServer) -> None:
    response = await server.client.post("/lmsp/v1/tasks", json={},
                                        headers={"Origin": "https://evil.example"})
    assert_problem(response, 403, "forbidden")
    rest = await server.client.post("/session", json={}, headers={"Origin": "https://evil.example"})
    assert rest.status_code == 403 and rest.json() == {"error": "Request denied by CORS policy"}
