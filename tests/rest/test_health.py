"""/health, /capabilities and /daemon/status over real HTTP."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge import BridgeOptions
from tests.rest.server import RunningServer, running_server

pytestmark = pytest.mark.anyio


async def test_health(server: RunningServer) -> None:
    response = await server.client.get("/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert response.headers["content-type"] == "application/json"


async def test_health_deep(server: RunningServer) -> None:
    await server.create_session()
    body = (await server.client.get("/health", params={"deep": "1"})).json()
    assert body["status"] == "ok"
    assert body["sessions"] == 1
    assert body["activePrompts"] == 0
    assert body["pendingPermissions"] == 0


async def test_capabilities_envelope(server: RunningServer) -> None:
    body = (await server.client.get("/capabilities")).json()
    assert body["v"] == 1
    assert body["protocolVersions"] == {"current": "v1", "supported": ["v1"]}
    assert body["mode"] == "http-bridge"
    assert body["transports"] == ["rest", "acp-http", "acp-ws"]
    assert body["policy"] == {"permission": "first-responder"}
    assert body["workspaceCwd"] == server.settings.workspace
    assert body["limits"]["maxPendingPromptsPerSession"] == 5
    # the agent's start, its session/load, and a session/new (10 + 30 + 30 s)
    assert body["limits"]["sessionRestoreTimeoutMs"] == 70_000
    for tag in ("health", "capabilities", "daemon_status", "session_create", "session_prompt",
                "non_blocking_prompt", "session_events", "session_cancel", "session_branch",
                "session_permission_vote", "permission_vote", "session_load", "session_resume",
                "session_close", "session_status", "session_approval_mode_control",
                "session_set_model"):
        assert tag in body["features"]
    # Conditional tags only when their option is on.
    assert "prompt_absolute_deadline" not in body["features"]
    assert "require_auth" not in body["features"]


@pytest.mark.parametrize(("cap", "expected"), [(0, None), (12, 12), (float("inf"), None)])
async def test_capabilities_pending_prompt_limit(tmp_path: Path, cap: float,
                                                 expected: int | None) -> None:
    options = BridgeOptions(max_pending_prompts_per_session=cap)
    async with running_server(tmp_path, options=options) as srv:
        body = (await srv.client.get("/capabilities")).json()
    assert body["limits"]["maxPendingPromptsPerSession"] == expected


async def test_capabilities_deadline_tag(tmp_path: Path) -> None:
    async with running_server(tmp_path, options=BridgeOptions(prompt_deadline_ms=5000)) as srv:
        body = (await srv.client.get("/capabilities")).json()
    assert "prompt_absolute_deadline" in body["features"]


async def test_daemon_status_activity(server: RunningServer) -> None:
    session = await server.create_session()
    sid = session["sessionId"]
    for _ in range(3):
        assert (await server.prompt(sid, "/sleep 60s hold")).status_code == 202
    body = (await server.client.get("/daemon/status")).json()
    assert body["v"] == 1
    assert body["status"] == "ok"
    assert body["limits"]["maxPendingPromptsPerSession"] == 5
    assert body["limits"]["maxSessions"] == 32
    assert body["limits"]["eventRingSize"] == 8000
    assert body["limits"]["promptDeadlineMs"] is None
    activity = body["runtime"]["activity"]
    assert activity["pendingPrompts"] == 3
    assert activity["activePrompts"] + activity["queuedPrompts"] == 3
    assert set(body["runtime"]["perf"]["promptQueueWait"]) >= {"count", "meanMs", "maxMs"}
    assert body["runtime"]["sessions"]["active"] == 1
    await server.client.delete(f"/session/{sid}")   # ends the held turns
