"""LMSP tasks on the model agent (an OpenAI-compatible server; here the project's fake
one on a loopback port): streamed deltas, and ``finish_reason: length`` →
``response.incomplete``."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from acp_server.app import build_app
from acp_server.lmsp import install_lmsp, open_lmsp
from acp_server.settings import Settings
from bridge import Bridge
from bridge.agents.model import ModelAgentFactory
from bridge.agents.reference import ReferenceAgentFactory
from tests.bridge.fake_model_server import FakeModelState, build_fake_model_app
from tests.lmsp.server import LmspServer
from tests.rest.server import serving

pytestmark = pytest.mark.anyio


async def test_model_agent_tasks(tmp_path: Path) -> None:
    state = FakeModelState()
    async with serving(build_fake_model_app(state)) as model_url:
        agents = {"fake-small": ModelAgentFactory(model_url + "/v1", model="fake-small")}
        settings = Settings(workspace=str(tmp_path), port=0)
        async with Bridge(ReferenceAgentFactory(), workspace_cwd=str(tmp_path),
                          agents=agents) as bridge, \
                open_lmsp(bridge, state_dir=str(tmp_path)) as service:
            app = build_app(settings, bridge)
            install_lmsp(app, service)
            async with serving(app, on_stop=bridge.aclose) as url, \
                    httpx.AsyncClient(base_url=url, timeout=10) as client:
                srv = LmspServer(url, service, client)
                caps = (await client.get("/lmsp/v1/capabilities")).json()
                assert sorted(caps["models"]) == ["fake-small", "reference"]

                async def create(text: str) -> str:
                    response = await client.post("/lmsp/v1/tasks", json={
                        "type": "response", "input": {"model": "fake-small", "input": text}})
                    assert response.status_code == 202, response.text
                    return response.json()["id"]  # type: ignore[no-any-return]

                done = await srv.wait(await create("hello"))
                assert done["status"] == "succeeded"
                assert done["response"]["status"] == "completed"
                text = done["response"]["output"][0]["content"][0]["text"]
                assert text.startswith("pong: ")
                deltas = [f for f in await srv.events(done["id"])
                          if f[1] == "response.output_text.delta"]
                assert "".join(f[2]["delta"] for f in deltas) == text and len(deltas) == 3

                cut = await srv.wait(await create("LENGTH please"))
                assert cut["status"] == "succeeded"   # incomplete still counts as succeeded
                assert cut["response"]["status"] == "incomplete"
                assert cut["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
                frames = await srv.events(cut["id"])
                assert frames[-1][1] == "response.incomplete"
                assert state.requests[-1]["model"] == "fake-small"
