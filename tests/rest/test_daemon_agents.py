"""``/daemon/status`` ``agents`` over real HTTP: each agent's state (not started,
running, exited after its process died), its live sessions and what it reports as."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from tests.bridge.test_stdio_bridge import reference_child
from tests.rest.server import RunningServer, running_server, text_prompt

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
    async with running_server(tmp_path, agent_factory=reference_child(tmp_path)) as server:
        client = server.client
        sid = (await client.post("/session", json={})).json()["sessionId"]
        [agent] = (await client.get("/daemon/status")).json()["agents"]
        assert agent["state"] == "running"
        await client.post(f"/session/{sid}/prompt", json=text_prompt("/crash bye"))
        with anyio.fail_after(10):
            while agent["state"] != "exited":
                await anyio.sleep(0.02)
                [agent] = (await client.get("/daemon/status")).json()["agents"]
        assert agent["sessions"] == 0   # its sessions died with it
