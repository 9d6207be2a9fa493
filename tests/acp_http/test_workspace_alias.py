"""``/workspaces/{ws}/acp``, ``qwen serve``'s per-workspace mount, over real HTTP and
WebSocket: the same door as ``/acp`` (its connections, its refusals, its guard) for this
daemon's workspace named by id or absolute path; any other ``{ws}`` is 400
``workspace_mismatch``."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import pytest

from acp_server.rest.workspace import workspace_id
from tests.acp_http.server import RunningAcpServer, request, running_acp_server, said
from tests.acp_http.wsclient import WsRejected, ws_connect
from tests.principals.helpers import bearer, mint

pytestmark = pytest.mark.anyio


def _alias(server: RunningAcpServer) -> str:
    return f"/workspaces/{workspace_id(server.workspace)}/acp"


async def test_a_turn_through_the_alias_over_streamable_http(server: RunningAcpServer) -> None:
    server.acp_path = _alias(server)
    conn_id, init = await server.initialize()
    assert init["result"]["protocolVersion"] == 1
    async with server.stream(conn_id) as conn_stream:
        sid = await server.new_session(conn_id, conn_stream)
        async with server.stream(conn_id, sid) as session_stream:
            assert (await server.prompt(conn_id, sid, 2, "hello alias")).status_code == 202
            reply = await session_stream.wait_for_id(2)
    assert reply["result"]["stopReason"] == "end_turn"
    assert said(session_stream.messages) == "Echo: hello alias"
    # one registry: the connection made through the alias is /acp's connection
    server.acp_path = "/acp"
    assert server.registry.get(conn_id) is not None
    response = await server.post(conn_id, request(3, "session/list", {}))
    assert response.status_code == 202


async def test_the_absolute_path_form_and_a_trailing_slash(server: RunningAcpServer) -> None:
    absolute = quote(server.workspace, safe="")
    for path in (f"/workspaces/{absolute}/acp", _alias(server) + "/",
                 f"/workspaces/{absolute}%2F/acp", f"/workspaces/%2F{absolute}%2Fx%2F../acp/"):
        response = await server.client.post(path, json=request(0, "initialize",
                                                                {"protocolVersion": 1}))
        assert response.status_code == 200, (path, response.text)
        assert response.headers["acp-connection-id"]


async def test_a_turn_through_the_alias_over_a_websocket(server: RunningAcpServer) -> None:
    async with ws_connect(server.base_url, _alias(server)) as ws:
        await ws.send_json(request(0, "initialize", {"protocolVersion": 1}))
        assert (await ws.receive_json())["result"]["protocolVersion"] == 1
        await ws.send_json(request(1, "session/new", {"cwd": server.workspace, "mcpServers": []}))
        sid = (await ws.wait_for(lambda m: m.get("id") == 1))["result"]["sessionId"]
        await ws.send_json(request(2, "session/prompt", {
            "sessionId": sid, "prompt": [{"type": "text", "text": "over ws"}]}))
        done = await ws.wait_for(lambda m: m.get("id") == 2)
    assert done["result"]["stopReason"] == "end_turn"


@pytest.mark.parametrize("method", ["POST", "GET", "DELETE"])
async def test_another_workspace_is_a_mismatch(server: RunningAcpServer, method: str) -> None:
    elsewhere = quote(str(Path(server.workspace).parent / "elsewhere"), safe="")
    for ws in ("0123456789abcdef", "not-an-id", elsewhere, "%2E%2E"):
        response = await server.client.request(
            method, f"/workspaces/{ws}/acp", json=request(0, "initialize", {"protocolVersion": 1})
            if method == "POST" else None)
        assert response.status_code == 400, response.text
        body = response.json()
        assert body["code"] == "workspace_mismatch" and body["workspace"] == ws
    assert not server.registry.connections   # nothing was made


async def test_a_websocket_to_another_workspace_is_refused(server: RunningAcpServer) -> None:
    """Refused before the handshake completes, nothing made: no route takes a WebSocket
    there, the router closes it unaccepted and the server answers 403 (the peer answers
    400). Another spelling of this workspace's path is its mount."""
    elsewhere = quote(str(Path(server.workspace).parent / "elsewhere"), safe="")
    for ws in ("0123456789abcdef", elsewhere):
        with pytest.raises(WsRejected) as refused:
            async with ws_connect(server.base_url, f"/workspaces/{ws}/acp"):
                pass
        assert refused.value.status == 403
    assert not server.registry.connections
    spelled = f"/workspaces/{quote(server.workspace, safe='')}%2F/acp"
    async with ws_connect(server.base_url, spelled) as ws:
        await ws.send_json(request(0, "initialize", {"protocolVersion": 1}))
        assert (await ws.receive_json())["result"]["protocolVersion"] == 1


async def test_the_connection_cap_is_the_one_of_acp(tmp_path: Path) -> None:
    async with running_acp_server(tmp_path, max_connections=2) as srv:
        await srv.initialize()
        srv.acp_path = _alias(srv)
        await srv.initialize()
        capped = [await srv.client.post(path, json=request(7, "initialize", {"protocolVersion": 1}))
                  for path in (_alias(srv), "/acp")]
        assert len(srv.registry.connections) == 2
    assert [(r.status_code, r.headers["retry-after"]) for r in capped] == [(503, "5")] * 2
    assert capped[0].content == capped[1].content
    assert capped[0].json()["error"]["message"] == "Too many ACP connections; retry later"


async def test_a_missing_scope_is_refused_as_on_acp(tmp_path: Path) -> None:
    """Per message, as on ``/acp``: a ``read`` token may initialize and list through the
    alias, not make a session (403, the same JSON-RPC error), over HTTP and WebSocket."""
    async with running_acp_server(tmp_path, token="s3cret", headers=bearer("s3cret")) as srv:
        reader = bearer(await mint(srv.server, "reader", "read"))
        new = request(1, "session/new", {"cwd": srv.workspace, "mcpServers": []})
        answers = {}
        for path in ("/acp", _alias(srv)):
            srv.acp_path = path
            conn_id, _ = await srv.initialize(**reader)
            answers[path] = await srv.post(conn_id, new, **reader)
            assert (await srv.post(conn_id, request(2, "session/list", {}),
                                   **reader)).status_code == 202
        first, second = answers.values()
        assert (first.status_code, first.content) == (second.status_code, second.content)
        assert second.status_code == 403
        assert second.json()["error"]["data"] == {"errorKind": "forbidden",
                                                  "requiredScope": "prompt"}
        async with ws_connect(srv.base_url, _alias(srv), headers=reader) as ws:
            await ws.send_json(request(0, "initialize", {"protocolVersion": 1}))
            assert "result" in await ws.receive_json()
            await ws.send_json(new)
            frame = await ws.wait_for(lambda m: m.get("id") == 1)
            assert frame["error"]["data"]["errorKind"] == "forbidden"


async def test_the_guard_is_the_same_as_on_acp(tmp_path: Path) -> None:
    async with running_acp_server(tmp_path, token="s3cret") as srv:
        alias = _alias(srv)
        init = request(0, "initialize", {"protocolVersion": 1})
        for path in ("/acp", alias):
            bare = await srv.client.post(path, json=init)
            assert bare.status_code == 401
            evil = await srv.client.post(path, json=init, headers={
                "Authorization": "Bearer s3cret", "Origin": "http://evil.example"})
            assert evil.status_code == 403
            good = await srv.client.post(path, json=init,
                                         headers={"Authorization": "Bearer s3cret"})
            assert good.status_code == 200
        first = await srv.client.post("/acp", json=init)
        second = await srv.client.post(alias, json=init)
        assert (first.status_code, first.content) == (second.status_code, second.content)
        with pytest.raises(WsRejected):
            async with ws_connect(srv.base_url, alias):
                pass
        async with ws_connect(srv.base_url, alias,
                              headers={"Authorization": "Bearer s3cret"}) as ws:
            await ws.send_json(init)
            assert (await ws.receive_json())["result"]["protocolVersion"] == 1
