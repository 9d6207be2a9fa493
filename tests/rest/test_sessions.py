"""Session routes over real HTTP: create/attach, scopes, overrides, limits, load,
resume, branch, cancel, close, status, heartbeat, client ids and body errors."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from bridge import BridgeOptions
from tests.rest.server import RunningServer, running_server, text_prompt
from tests.rest.test_load import PEER_KEYS
from tests.rest.test_workspace import _workspace_id

pytestmark = pytest.mark.anyio

BAD_CLIENT_ID = "`X-Qwen-Client-Id` must be a non-empty token of 128 characters or fewer"


async def test_single_scope_attaches(server: RunningServer) -> None:
    first = await server.create_session()
    assert set(first) == {"sessionId", "workspaceCwd", "attached", "clientId", "createdAt",
                          "eventEpoch"}
    assert first["attached"] is False
    assert first["workspaceCwd"] == server.settings.workspace
    assert first["clientId"].startswith("client_")
    assert first["createdAt"].endswith("Z")
    second = await server.create_session(sessionScope="single", cwd=server.settings.workspace)
    assert second["sessionId"] == first["sessionId"]
    assert second["attached"] is True
    assert second["clientId"] != first["clientId"]
    # an attach adds the peer's two flags (a new session has neither)
    assert (second["hasActivePrompt"], second["hasRunningBackgroundTasks"]) == (False, False)


async def test_thread_scope_spawns(server: RunningServer) -> None:
    first = await server.create_session(sessionScope="thread")
    second = await server.create_session(sessionScope="thread")
    assert first["sessionId"] != second["sessionId"]
    assert not first["attached"] and not second["attached"]


async def test_session_id_override(server: RunningServer) -> None:
    wanted = str(uuid.uuid4())
    body = await server.create_session(sessionId=wanted)
    assert body["sessionId"] == wanted
    assert body["attached"] is False
    # The override forces thread scope: the default session is another one.
    default = await server.create_session()
    assert default["sessionId"] != wanted


@pytest.mark.parametrize("bad", ["nope", "00000000-0000-0000-0000-000000000000", 42,
                                 "3c0ff91b-1234-6abc-8def-0123456789ab"])
async def test_invalid_session_id(server: RunningServer, bad: object) -> None:
    response = await server.client.post("/session", json={"sessionId": bad})
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_session_id"


@pytest.mark.parametrize("bad", ["multi", "", 3])
async def test_invalid_session_scope(server: RunningServer, bad: object) -> None:
    response = await server.client.post("/session", json={"sessionScope": bad})
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_session_scope"


BAD_APPROVAL_MODE = {"error": "`approvalMode` must be a known approval mode when provided",
                     "code": "invalid_approval_mode",
                     "allowed": ["plan", "default", "auto-edit", "auto", "yolo"]}


@pytest.mark.parametrize("bad", ["super-yolo", "YOLO", "", None, 3, ["plan"]])
async def test_invalid_approval_mode(server: RunningServer, bad: object) -> None:
    """An unknown ``approvalMode`` (``null`` too) is qwen serve's 400 on create, load and
    resume, body for body; nothing is made or restored."""
    response = await server.client.post("/session", json={"approvalMode": bad})
    assert (response.status_code, response.json()) == (400, BAD_APPROVAL_MODE)
    sid = (await server.create_session(sessionScope="thread"))["sessionId"]
    for route in ("load", "resume"):
        response = await server.client.post(f"/session/{sid}/{route}",
                                            json={"approvalMode": bad})
        assert (response.status_code, response.json()) == (400, BAD_APPROVAL_MODE)
    listed = (await server.client.get(f"/workspace/{await _workspace_id(server)}/sessions")).json()
    assert [s["sessionId"] for s in listed["sessions"]] == [sid]


async def test_known_approval_modes_are_taken(server: RunningServer) -> None:
    for mode in BAD_APPROVAL_MODE["allowed"]:
        created = await server.create_session(sessionScope="thread", approvalMode=mode)
        response = await server.client.post(f"/session/{created['sessionId']}/load",
                                            json={"approvalMode": mode})
        assert response.status_code == 200
    # the workspace is checked first, as the peer does
    response = await server.client.post("/session", json={"cwd": "/elsewhere",
                                                           "approvalMode": "bogus"})
    assert response.json()["code"] == "workspace_mismatch"


async def test_workspace_mismatch(server: RunningServer, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    response = await server.client.post("/session", json={"cwd": str(other)})
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "workspace_mismatch"
    bound = server.settings.workspace
    assert body["boundWorkspace"] == bound
    assert body["requestedWorkspace"] == str(other)
    # qwen serve 0.24.4's words (read from its bundle), a long path cut as it cuts it
    assert body["error"] == (
        f'Workspace mismatch: runtime is bound to "{bound}" but request asked for '
        f'"{other}". Select a registered runtime for "{other}" or register it before '
        "retrying; this bridge will not fall back to the primary workspace.")
    long = "/" + "d" * 5000
    body = (await server.client.post("/session", json={"cwd": long})).json()
    assert body["requestedWorkspace"] == long[:4096] + "\u2026[truncated]"
    assert long[:4097] not in body["error"]


async def test_session_limit(tmp_path: Path) -> None:
    async with running_server(tmp_path, options=BridgeOptions(max_sessions=1)) as srv:
        await srv.create_session(sessionScope="thread")
        response = await srv.client.post("/session", json={"sessionScope": "thread"})
        assert response.status_code == 503
        assert response.headers["retry-after"] == "5"
        body = response.json()
        assert body["code"] == "session_limit_exceeded"
        assert body["limit"] == 1
        assert body["scope"] == "workspace"


async def test_malformed_json(server: RunningServer) -> None:
    for path in ("/session", "/session/x/prompt"):
        response = await server.client.post(path, content=b"{not json",
                                             headers={"content-type": "application/json"})
        assert response.status_code == 400
        assert response.json() == {"error": "Invalid JSON in request body"}


async def test_wrong_body_shape(server: RunningServer) -> None:
    response = await server.client.post("/session", json={"cwd": 5})
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_request_body"


async def test_empty_body_is_empty_object(server: RunningServer) -> None:
    response = await server.client.post("/session")
    assert response.status_code == 200


async def test_body_over_cap(tmp_path: Path) -> None:
    async with running_server(tmp_path, max_body_bytes=1024) as srv:
        sid = (await srv.create_session())["sessionId"]
        big = text_prompt("x" * 2048)
        response = await srv.client.post(f"/session/{sid}/prompt", json=big)
        assert response.status_code == 413
        assert response.json()["code"] == "payload_too_large"

        async def chunked() -> object:  # no Content-Length: the cap holds while reading
            for _ in range(4):
                yield b"x" * 512

        response = await srv.client.post(f"/session/{sid}/prompt", content=chunked())
        assert response.status_code == 413


async def test_close_then_404(server: RunningServer) -> None:
    sid = (await server.create_session())["sessionId"]
    response = await server.client.delete(f"/session/{sid}")
    assert response.status_code == 204
    assert response.content == b""
    response = await server.client.delete(f"/session/{sid}")
    assert response.status_code == 404
    assert response.json() == {"error": f'No session with id "{sid}"', "code": "session_not_found",
                               "sessionId": sid}


@pytest.mark.parametrize(("method", "path"), [
    ("POST", "/session/{sid}/prompt"), ("GET", "/session/{sid}/events"),
    ("POST", "/session/{sid}/cancel"), ("POST", "/session/{sid}/branch"),
    ("GET", "/session/{sid}/status"), ("GET", "/session/{sid}/pending-prompts"),
    ("DELETE", "/session/{sid}/pending-prompts/p1"), ("POST", "/session/{sid}/heartbeat"),
    ("DELETE", "/session/{sid}"), ("POST", "/session/{sid}/permission/r1"),
])
async def test_unknown_session_404(server: RunningServer, method: str, path: str) -> None:
    sid = str(uuid.uuid4())
    body = text_prompt("hi") if path.endswith("prompt") else (
        {"outcome": {"outcome": "cancelled"}} if "permission" in path else None)
    response = await server.client.request(method, path.format(sid=sid), json=body)
    assert response.status_code == 404
    assert response.json()["code"] == "session_not_found"
    assert response.json()["sessionId"] == sid


async def test_load_and_resume(server: RunningServer) -> None:
    created = await server.create_session(sessionScope="thread")
    sid = created["sessionId"]
    for route in ("load", "resume"):
        response = await server.client.post(f"/session/{sid}/{route}", json={})
        assert response.status_code == 200
        body = response.json()
        assert set(body) == set(PEER_KEYS[route])   # as qwen serve 0.24.4 (tests/rest/test_load.py)
        assert body["sessionId"] == sid
        assert body["attached"] is True
        assert body["hasActivePrompt"] is False
        assert body["eventEpoch"] == created["eventEpoch"]
    # After a close the agent restores it (the reference agent keeps its history).
    assert (await server.client.delete(f"/session/{sid}")).status_code == 204
    response = await server.client.post(f"/session/{sid}/load", json={})
    assert response.status_code == 200
    assert response.json()["attached"] is False
    assert response.json()["sessionId"] == sid


async def test_load_workspace_mismatch(server: RunningServer, tmp_path: Path) -> None:
    sid = (await server.create_session())["sessionId"]
    response = await server.client.post(f"/session/{sid}/load", json={"cwd": "/elsewhere"})
    assert response.status_code == 400
    assert response.json()["code"] == "workspace_mismatch"


async def test_branch(server: RunningServer) -> None:
    sid = (await server.create_session(sessionScope="thread"))["sessionId"]
    response = await server.client.post(f"/session/{sid}/branch", json={})
    assert response.status_code == 201
    body = response.json()
    assert body["forkedFrom"] == {"sessionId": sid}
    assert body["sessionId"] != sid
    assert body["attached"] is False
    assert {"workspaceCwd", "clientId", "createdAt"} <= set(body)


async def test_branch_while_prompt_active(server: RunningServer) -> None:
    sid = (await server.create_session())["sessionId"]
    assert (await server.prompt(sid, "/sleep 60s busy")).status_code == 202
    response = await server.client.post(f"/session/{sid}/branch")
    assert response.status_code == 409
    assert response.json()["code"] == "branch_while_prompt_active"
    assert response.json()["sessionId"] == sid
    await server.client.delete(f"/session/{sid}")


async def test_cancel_active_prompt(server: RunningServer) -> None:
    sid = (await server.create_session())["sessionId"]
    accepted = (await server.prompt(sid, "/sleep 60s long")).json()   # ended by the cancel
    # the bridge echoes the prompt as the turn starts, in the same step as the agent call
    await server.events_until(sid, lambda kind, frame: kind == "session_update" and frame[
        "data"]["update"]["sessionUpdate"] == "user_message_chunk",
        last_event_id=accepted["lastEventId"])
    assert (await server.client.post(f"/session/{sid}/cancel")).status_code == 204
    frames = await server.events_until(sid, "turn_complete", last_event_id=accepted["lastEventId"])
    assert frames[-1][1]["data"]["stopReason"] == "cancelled"
    assert frames[-1][1]["promptId"] == accepted["promptId"]


async def test_status(server: RunningServer) -> None:
    sid = (await server.create_session())["sessionId"]
    assert (await server.prompt(sid, "/sleep 60s a")).status_code == 202
    assert (await server.prompt(sid, "/sleep 60s b")).status_code == 202
    body = (await server.client.get(f"/session/{sid}/status")).json()
    assert body["sessionId"] == sid
    assert body["pendingPrompts"] == 2
    assert body["hasActivePrompt"] is True
    assert body["clientCount"] == 1
    await server.client.delete(f"/session/{sid}")


async def test_status_turn_fields(server: RunningServer) -> None:
    """qwen serve's status fields: ``updatedAt`` (the end of the last turn that ran,
    absent before the first), ``hasTurnError`` / ``turnError`` (that turn failed; false
    once the next one runs), ``activeWorkState`` (``active`` with a prompt queued or
    running, else ``unsupported``); the listing has them too, its ``updatedAt`` its own."""
    sid = (await server.create_session(sessionScope="thread"))["sessionId"]
    body = (await server.client.get(f"/session/{sid}/status")).json()
    assert (body["activeWorkState"], body["hasTurnError"], body["hasRunningBackgroundTasks"]) \
        == ("unsupported", False, False)
    assert "updatedAt" not in body and "turnError" not in body
    failed = (await server.prompt(sid, "/fail")).json()
    await server.events_until(sid, "turn_error", last_event_id=failed["lastEventId"])
    body = (await server.client.get(f"/session/{sid}/status")).json()
    assert (body["activeWorkState"], body["hasTurnError"]) == ("unsupported", True)
    assert body["turnError"] == {"message": "Reference agent failure (/fail)", "code": "-32603"}
    ended = body["updatedAt"]
    assert ended > body["createdAt"]
    listed = (await server.client.get(f"/workspace/{await _workspace_id(server)}/sessions")).json()
    [summary] = [s for s in listed["sessions"] if s["sessionId"] == sid]
    assert (summary["hasTurnError"], summary["turnError"], summary["activeWorkState"]) == \
        (True, body["turnError"], "unsupported")
    running = (await server.prompt(sid, "/sleep 60s next")).json()
    await server.events_until(sid, lambda kind, frame: kind == "session_update",
                              last_event_id=running["lastEventId"])   # its echo: it runs
    body = (await server.client.get(f"/session/{sid}/status")).json()
    assert (body["activeWorkState"], body["hasTurnError"], body["updatedAt"]) == \
        ("active", False, ended)
    assert "turnError" not in body
    await server.client.post(f"/session/{sid}/cancel")
    await server.events_until(sid, "turn_complete", last_event_id=running["lastEventId"])
    body = (await server.client.get(f"/session/{sid}/status")).json()
    assert body["updatedAt"] > ended and body["hasTurnError"] is False   # cancelled: no error
    await server.client.delete(f"/session/{sid}")


async def test_heartbeat(server: RunningServer) -> None:
    created = await server.create_session()
    sid, client_id = created["sessionId"], created["clientId"]
    response = await server.client.post(f"/session/{sid}/heartbeat",
                                        headers={"X-Qwen-Client-Id": client_id})
    assert response.status_code == 200
    body = response.json()
    assert body["sessionId"] == sid
    assert body["clientId"] == client_id
    assert isinstance(body["lastSeenAt"], int)   # epoch ms, as qwen serve's
    anonymous = (await server.client.post(f"/session/{sid}/heartbeat")).json()
    assert "clientId" not in anonymous


async def test_client_id_validation(server: RunningServer) -> None:
    sid = (await server.create_session())["sessionId"]
    for bad in (b"has space", b"x" * 129, b"a/b", "é".encode()):
        response = await server.client.post(f"/session/{sid}/prompt", json=text_prompt("hi"),
                                            headers={"X-Qwen-Client-Id": bad})
        assert response.status_code == 400
        assert response.json() == {"error": BAD_CLIENT_ID, "code": "invalid_client_id"}
    # Well-formed but unknown to the session.
    response = await server.client.post(f"/session/{sid}/prompt", json=text_prompt("hi"),
                                        headers={"X-Qwen-Client-Id": "client_unknown"})
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "invalid_client_id"
    assert body["clientId"] == "client_unknown"
    response = await server.client.post(f"/session/{sid}/heartbeat",
                                        headers={"X-Qwen-Client-Id": "client_unknown"})
    assert response.status_code == 400


async def test_unknown_route_is_json_404(server: RunningServer) -> None:
    response = await server.client.get("/nope")
    assert response.status_code == 404
    assert response.json() == {"error": "Not Found"}
