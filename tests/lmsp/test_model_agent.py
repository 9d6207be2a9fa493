"""LMSP tasks on the model agent (an OpenAI-compatible server; here the project's fake
one on a loopback port): streamed deltas, and ``finish_reason: length`` →
``response.incomplete``; against a hostile one (``tests.bridge.hostile_model_server``) an
upstream fault fails the task with the cause."""

from __future__ import annotations

from pathlib import Path

import pytest

from acp_server.profiles import AgentProfile
from tests.bridge.fake_model_server import FakeModelState, build_fake_model_app
from tests.bridge.hostile_model_server import hostile_model_server
from tests.harness import local_server, serving
from tests.lmsp.server import LmspServer

pytestmark = pytest.mark.anyio


async def test_model_agent_tasks(tmp_path: Path) -> None:
    state = FakeModelState()
    async with serving(build_fake_model_app(state)) as model_url:
        model = AgentProfile("fake-small", model_server=model_url + "/v1")
        async with local_server(tmp_path, kind=LmspServer, agent_profiles=(model,)) as srv:
            client = srv.client
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


async def test_an_upstream_fault_fails_the_task_with_its_cause(tmp_path: Path) -> None:
    async with hostile_model_server() as upstream:
        model = AgentProfile("m-one", model_server=upstream.url)
        async with local_server(tmp_path, kind=LmspServer, agent_profiles=(model,)) as srv:
            async def run(text: str) -> dict:  # type: ignore[type-arg]
                response = await srv.client.post("/lmsp/v1/tasks", json={
                    "type": "response", "input": {"model": "m-one", "input": text}})
                assert response.status_code == 202, response.text
                return await srv.wait(response.json()["id"])  # type: ignore[no-any-return]

            failed = await run("STREAM_ERROR")
            assert failed["status"] == "failed"
            assert failed["error"]["code"] == "agent_error"
            assert failed["error"]["detail"] == (
                f"Model server {upstream.url} reported an error: The upstream model crashed "
                "(type server_error, code model_crashed)")
            assert (await run("fine"))["status"] == "succeeded"
