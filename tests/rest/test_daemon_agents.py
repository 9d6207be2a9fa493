"""``/daemon/status`` ``agents`` over real HTTP: each agent's state (not started,
running, exited after its process died), its live sessions and what it reports as."""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import pytest

from acp_server.app import build_app
from acp_server.settings import Settings
from bridge import Bridge
from tests.bridge.test_stdio_bridge import reference_child
from tests.rest.server import RunningServer, serving, text_prompt

pytestmark = pytest.mark.anyio


async def test_state_and_sessions_of_the_in_process_agent(server: RunningServer) -> None:
    [before] = (await server.client.get("/daemon/status")).json()["agents"]
    assert before == {"name": "reference", "default": True, "state": "not_started",
                      "sessions": 0, "agentInfo": None}
    await server.create_session(sessionScope="thread")
    await server.create_session(sessionScope="thread")
    [after] = (await server.client.get("/daemon/status")).json()["agents"]
    assert (after["state"], after["sessions"]) == ("running", 2)
    assert after["agentInfo"]["name"] == "acp-server-reference"


async def test_a_dead_stdio_agent_is_exited(tmp_path: Path) -> None:
    settings = Settings(workspace=str(tmp_path), port=0)
    async with Bridge(reference_child(tmp_path), workspace_cwd=settings.workspace) as bridge:
        async with serving(build_app(settings, bridge), on_stop=bridge.aclose) as base_url:
            async with httpx.AsyncClient(base_url=base_url, timeout=10) as client:
                sid = (await client.post("/session", json={})).json()["sessionId"]
                [agent] = (await client.get("/daemon/status")).json()["agents"]
                assert agent["state"] == "running"
                await client.post(f"/session/{sid}/prompt", json=text_prompt("/crash bye"))
                with anyio.fail_after(10):
                    while agent["state"] != "exited":
                        await anyio.sleep(0.02)
                        [agent] = (await client.get("/daemon/status")).json()["agents"]
                assert agent["sessions"] == 0   # its sessions died with it
