"""LMSP tasks on the model agent (an OpenAI-compatible server; here the project's fake
one on a loopback port): streamed deltas, and ``finish_reason: length`` →
``response.incomplete``; against a hostile one (``tests.bridge.hostile_model_server``) an
upstream fault fails the task with the cause."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from acp_server.profiles import AgentProfile
from tests.bridge.fake_model_server import FakeModelState, build_fake_model_app
from tests.bridge.hostile_model_server import hostile_model_server
from tests.clients.openai_strict import strict_event
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
            # the model server's own counts (its usage chunk), not words counted here
            assert done["response"]["usage"] == {
                "input_tokens": 7, "output_tokens": 3, "total_tokens": 10,
                "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0}}
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


async def test_a_thinking_model_s_reasoning_is_a_reasoning_item(tmp_path: Path) -> None:
    """``agent_thought_chunk`` (the model agent's ``reasoning_content``) → a ``reasoning``
    output item before the message (OpenAI Responses: ``response.reasoning_text.delta``,
    ``content: [{type: "reasoning_text"}]``), each item at its own ``output_index``; the
    conversation carried by ``previous_response_id`` takes the message only. A
    conversation over the model's context fails ``context_length_exceeded``."""
    async with hostile_model_server() as upstream:
        model = AgentProfile("m-one", model_server=upstream.url)
        async with local_server(tmp_path, kind=LmspServer, agent_profiles=(model,)) as srv:
            response = await srv.client.post("/lmsp/v1/tasks", json={
                "type": "response", "input": {"model": "m-one", "input": "REASONING"}})
            done = await srv.wait(response.json()["id"])
            assert done["status"] == "succeeded", done
            output = done["response"]["output"]
            rs_id, msg_id = output[0]["id"], output[1]["id"]
            assert rs_id.startswith("rs_") and msg_id.startswith("msg_")
            assert output == [
                {"type": "reasoning", "id": rs_id, "status": "completed", "summary": [],
                 "content": [{"type": "reasoning_text",
                              "text": "Let me think. Still thinking."}]},
                {"type": "message", "id": msg_id, "status": "completed", "role": "assistant",
                 "content": [{"type": "output_text", "text": "the answer",
                              "annotations": []}]}]
            frames = [(kind, data) for _id, kind, data in await srv.events(done["id"])]
            kinds = [kind for kind, _data in frames]
            assert kinds == [
                "response.created", "response.in_progress",
                "response.output_item.added", "response.reasoning_text.delta",
                "response.reasoning_text.delta", "response.output_item.added",
                "response.content_part.added", "response.output_text.delta",
                "response.reasoning_text.done", "response.output_item.done",
                "response.output_text.done", "response.content_part.done",
                "response.output_item.done", "response.completed"], kinds
            for _kind, data in frames:   # each one as the openai SDK's types read it
                strict_event(data)
            indices = {(kind, data.get("output_index")) for kind, data in frames[2:-1]}
            assert ("response.reasoning_text.delta", 0) in indices
            assert ("response.output_text.delta", 1) in indices
            assert [d["delta"] for k, d in frames if k == "response.reasoning_text.delta"] \
                == ["Let me think. ", "Still thinking."]
            follow = await srv.client.post("/lmsp/v1/responses", json={
                "model": "m-one", "input": "and then?", "previous_response_id":
                done["response_id"]})
            assert follow.status_code == 200, follow.text
            assert "Let me think" not in json.dumps(upstream.requests[-1]["messages"])

            upstream.context_chars = 10
            response = await srv.client.post("/lmsp/v1/tasks", json={
                "type": "response", "input": {"model": "m-one", "input": "a" * 20}})
            failed = await srv.wait(response.json()["id"])
            assert failed["status"] == "failed"
            assert failed["error"]["code"] == "context_length_exceeded"
            assert "exceeds the model's context window" in failed["error"]["detail"]
