"""Our own agents restore from the journal (issue #23): after a ``kill -9`` of a real
``acp-server serve`` the reference agent and the model agent come back empty (they keep
their sessions in memory), so the server makes a fresh ``session/new`` under the same id
seeded with the journal's transcript (``_meta["acp-server/transcript"]``). The next turn
has the conversation: the model agent's next request to the (fake, OpenAI-compatible)
model carries the earlier messages; the reference agent's ``/history`` lists them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx
import pytest

from acp_server.rest.workspace import workspace_id
from tests.bridge.fake_model_server import FakeModelState, build_fake_model_app
from tests.harness import ServeProcess, serving
from tests.store.test_session_restart import _flags, _is, _prompt, read_events

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"   # the client side and the fake model; the server is its own process


async def _turn(client: httpx.AsyncClient, sid: str, text: str) -> str:
    """Run one prompt to its end; the agent's reply text."""
    accepted = await client.post(f"/session/{sid}/prompt", json=_prompt(text))
    assert accepted.status_code == 202, accepted.text
    pid = accepted.json()["promptId"]
    seen = await read_events(client, sid, lambda e: e.get("promptId") == pid and e["type"] in (
        "turn_complete", "turn_error"), last_event_id=accepted.json()["lastEventId"])
    assert seen[-1]["type"] == "turn_complete", seen[-1]
    return "".join(e["data"]["update"]["content"]["text"] for e in seen
                   if e["type"] == "session_update" and e.get("promptId") == pid
                   and e["data"]["update"]["sessionUpdate"] == "agent_message_chunk")


async def test_our_agents_restore_the_conversation_across_kill_9(tmp_path: Path,
                                                                   store_name: str) -> None:
    model = FakeModelState()
    async with serving(build_fake_model_app(model)) as model_url:
        child = ServeProcess(tmp_path, *_flags(tmp_path, store_name),
                             "--model-server", model_url + "/v1")
        try:   # started off the event loop: the server asks the fake model for its models
            await anyio.to_thread.run_sync(child.start)
            async with httpx.AsyncClient(base_url=child.base_url, timeout=20) as client:
                ref = (await client.post("/session", json={"sessionScope": "thread"})
                       ).json()["sessionId"]
                llm = (await client.post("/session", json={"sessionScope": "thread",
                                                           "agent": "fake-small"})
                       ).json()["sessionId"]
                assert await _turn(client, ref, "/chunks 2 apricot") == "Echo: apricot"
                assert await _turn(client, ref, "plum") == "Echo: plum"
                said = await _turn(client, llm, "remember the word apricot")
                assert said == "pong: remember the word apricot"
            child.kill()   # SIGKILL: both agents' memory is gone
            await anyio.to_thread.run_sync(child.start)
            asked = len(model.requests)
            async with httpx.AsyncClient(base_url=child.base_url, timeout=20) as client:
                again = await _turn(client, llm, "which word was it")
                history = await _turn(client, ref, "/history")
        finally:
            await anyio.to_thread.run_sync(child.stop)
    messages: list[dict[str, Any]] = model.requests[asked]["messages"]
    assert messages == [{"role": "user", "content": "remember the word apricot"},
                        {"role": "assistant", "content": said},
                        {"role": "user", "content": "which word was it"}]
    assert again == "pong: which word was it"
    assert history.splitlines() == ["History:", "user: /chunks 2 apricot",
                                    "assistant: Echo: apricot", "user: plum",
                                    "assistant: Echo: plum", "Echo: "]


async def test_a_session_whose_agent_is_gone_is_not_restorable(tmp_path: Path,
                                                                store_name: str) -> None:
    """A model session restored where its model is not listed (the model server down at
    the restart) keeps its readable history and refuses prompts with a 409
    ``session_not_restorable`` naming the agent: another agent (the default, the
    reference agent) never takes its conversation over, as it used to."""
    model = FakeModelState()
    async with serving(build_fake_model_app(model)) as model_url:
        child = ServeProcess(tmp_path, *_flags(tmp_path, store_name),
                             "--model-server", model_url + "/v1")
        try:
            await anyio.to_thread.run_sync(child.start)
            async with httpx.AsyncClient(base_url=child.base_url, timeout=20) as client:
                llm = (await client.post("/session", json={"sessionScope": "thread",
                                                           "agent": "fake-small"})
                       ).json()["sessionId"]
                said = await _turn(client, llm, "remember the word apricot")
            child.kill()
        except BaseException:
            await anyio.to_thread.run_sync(child.stop)
            raise
    try:   # the model server is gone now: its models are not listed at this start
        await anyio.to_thread.run_sync(child.start)
        async with httpx.AsyncClient(base_url=child.base_url, timeout=20) as client:
            refused = await client.post(f"/session/{llm}/prompt", json=_prompt("and now?"))
            assert refused.status_code == 409, refused.text
            assert refused.json()["code"] == "session_not_restorable"
            assert "'fake-small' is not configured" in refused.text
            seen = await read_events(client, llm, lambda e: e["type"] == "replay_complete",
                                     last_event_id=0)
            texts = [e["data"]["update"]["content"]["text"] for e in seen
                     if e["type"] == "session_update"
                     and e["data"]["update"]["sessionUpdate"] == "agent_message_chunk"]
            assert "".join(texts) == said   # the history stays readable
            listed = (await client.get(f"/workspace/{workspace_id(str(tmp_path))}/sessions")
                      ).json()
            assert llm in [s["sessionId"] for s in listed["sessions"]]
            # it is still the model's session, not the default agent's that holds its slot
            assert [s["agent"] for s in listed["sessions"] if s["sessionId"] == llm] == [
                "fake-small"]
    finally:
        await anyio.to_thread.run_sync(child.stop)


async def test_a_restored_session_runs_once_its_model_is_listed(tmp_path: Path,
                                                                store_name: str) -> None:
    """A model session restored while its model is not listed is refused (409) only
    while it is not: once the model server lists it again, the next prompt lists the
    models again (``--model-refresh-ms``), restores the session with its conversation
    and runs; its slot is its own agent's (``/daemon/status``), never the default's."""
    model = FakeModelState()
    async with serving(build_fake_model_app(model)) as model_url:
        child = ServeProcess(tmp_path, *_flags(tmp_path, store_name),
                             "--model-server", model_url + "/v1", "--model-refresh-ms", "1")
        try:
            await anyio.to_thread.run_sync(child.start)
            async with httpx.AsyncClient(base_url=child.base_url, timeout=20) as client:
                llm = (await client.post("/session", json={"sessionScope": "thread",
                                                           "agent": "fake-small"})
                       ).json()["sessionId"]
                said = await _turn(client, llm, "remember the word apricot")
            child.kill()
            model.models = []   # not listed at the restart
            await anyio.to_thread.run_sync(child.start)
            async with httpx.AsyncClient(base_url=child.base_url, timeout=20) as client:
                refused = await client.post(f"/session/{llm}/prompt", json=_prompt("hello?"))
                assert refused.status_code == 409, refused.text
                assert refused.json()["code"] == "session_not_restorable"
                assert "'fake-small' is not configured" in refused.text

                async def on(agent: str) -> int:
                    status = (await client.get("/daemon/status")).json()
                    return sum(a["sessions"] for a in status["agents"] if a["name"] == agent)

                assert await on("reference") == 0   # its slot is not the default's
                model.models = ["fake-small"]
                asked = len(model.requests)
                with anyio.fail_after(20):   # each prompt lists again (1 ms apart at least)
                    while True:
                        accepted = await client.post(f"/session/{llm}/prompt",
                                                     json=_prompt("which word was it"))
                        if accepted.status_code == 202:
                            break
                        assert accepted.status_code == 409, accepted.text
                pid = accepted.json()["promptId"]
                seen = await read_events(
                    client, llm, lambda e: e.get("promptId") == pid and e["type"] in (
                        "turn_complete", "turn_error"),
                    last_event_id=accepted.json()["lastEventId"])
                assert seen[-1]["type"] == "turn_complete", seen[-1]
                assert (await on("fake-small"), await on("reference")) == (1, 0)
        finally:
            await anyio.to_thread.run_sync(child.stop)
    messages: list[dict[str, Any]] = model.requests[asked]["messages"]
    assert messages == [{"role": "user", "content": "remember the word apricot"},
                        {"role": "assistant", "content": said},
                        {"role": "user", "content": "which word was it"}]
