"""`qwen --acp` behind a real ``acp-server serve`` killed with ``kill -9`` (issue #23):
the session comes back on the restarted server (same state folder and port), ``/load``
brings back its history from the journal, and qwen itself is restored through its own
``session/load`` (its transcript under its ``HOME``): the next turn's request to the
model carries the conversation from before the kill."""

from __future__ import annotations

import contextlib
import json
import shlex
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from acp_server.rest.workspace import workspace_id
from bridge.restore import CONTINUE_TEXT
from tests.bridge.fake_model_server import FakeModelState, build_fake_model_app
from tests.harness import ServeProcess, free_port, serving
from tests.npm_agents.test_qwen import agent_text, events, new_session, prompt
from tests.store.test_session_restart import read_events

pytestmark = [pytest.mark.anyio, pytest.mark.agents]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"   # the client side and the fake model; the server is its own process


def _updates(envelopes: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e["data"]["update"] for e in envelopes if e["type"] == "session_update"
            and e["data"]["update"]["sessionUpdate"] == kind]


def _texts(envelopes: list[dict[str, Any]], kind: str) -> str:
    return "".join(u["content"].get("text", "") for u in _updates(envelopes, kind))


@contextlib.asynccontextmanager
async def qwen_serve(tmp_path: Path, qwen_entry: str, *flags: str
                     ) -> AsyncIterator[tuple[ServeProcess, FakeModelState, Path]]:
    """A real ``acp-server serve`` (not started yet) with ``qwen --acp`` as its default
    agent, against our fake model server; stopped at the end."""
    model = FakeModelState()
    workspace, home = tmp_path / "ws", tmp_path / "home"
    workspace.mkdir()
    home.mkdir()
    async with serving(build_fake_model_app(model)) as model_url:
        agent = shlex.join([shutil.which("node") or "node", qwen_entry, "--acp",
                            "--auth-type", "openai", "--approval-mode", "default"])
        child = ServeProcess(
            workspace, "--agent", agent, "--port", str(free_port()),
            "--initialize-timeout-ms", "60000", "--agent-request-timeout-ms", "60000", *flags,
            state_dir=tmp_path / "state",
            env={"HOME": str(home), "OPENAI_BASE_URL": model_url + "/v1",
                 "OPENAI_API_KEY": "x", "OPENAI_MODEL": "fake-small",
                 "QWEN_CODE_NO_RELAUNCH": "true", "NO_COLOR": "1"})
        try:
            yield child, model, workspace
        finally:
            await anyio.to_thread.run_sync(child.stop)


async def test_a_qwen_session_survives_kill_9(tmp_path: Path, qwen_entry: str) -> None:
    async with qwen_serve(tmp_path, qwen_entry) as (child, model, workspace):
        await anyio.to_thread.run_sync(child.start)
        async with httpx.AsyncClient(base_url=child.base_url, timeout=90) as client:
            sid = await new_session(client)
            first = await prompt(client, sid, "remember the word apricot")
            assert first.status_code == 202, first.text
            frames = await events(client, sid, 0, "turn_complete")
            assert frames[-1][1]["data"]["stopReason"] == "end_turn"
            said = agent_text(frames)
            assert said.startswith("pong") and "apricot" in said
            epoch = (await client.post(f"/session/{sid}/load", json={})
                     ).json()["eventEpoch"]
        await anyio.to_thread.run_sync(child.kill)   # SIGKILL: no drain, no clean stop
        await anyio.to_thread.run_sync(child.start)
        async with httpx.AsyncClient(base_url=child.base_url, timeout=90) as client:
            listed = (await client.get(
                f"/workspace/{workspace_id(str(workspace))}/sessions")).json()
            assert sid in [s["sessionId"] for s in listed["sessions"]]
            loaded = await client.post(f"/session/{sid}/load", json={})
            assert loaded.status_code == 200, loaded.text
            body = loaded.json()
            assert body["eventEpoch"] == epoch
            history = [*body["compactedReplay"], *body["liveJournal"]]
            assert "remember the word apricot" in _texts(history, "user_message_chunk")
            assert _texts(history, "agent_message_chunk") == said
            terminals = {t["promptId"]: t["terminal"] for t in body["promptTerminals"]}
            assert terminals[first.json()["promptId"]] == "completed"
            asked = len(model.requests)
            again = await prompt(client, sid, "which word was it")
            assert again.status_code == 202, again.text
            frames = await events(client, sid, body["lastEventId"], "turn_complete")
            assert frames[-1][1]["data"]["stopReason"] == "end_turn"
            assert "which word was it" in agent_text(frames)
        # qwen restored its own session: the new turn's request carries the old one
        later = json.dumps(model.requests[asked:])
        assert "remember the word apricot" in later and "which word was it" in later


async def test_continue_asks_qwen_to_continue_the_interrupted_turn(
        tmp_path: Path, qwen_entry: str) -> None:
    """``--session-on-restart continue``: the turn streaming at the kill runs again under
    its prompt id; qwen restored its session through ``session/load``, so it is asked to
    continue (``CONTINUE_TEXT``) rather than given the prompt again, and the stream's
    echo of that request is marked ``acp-server/continued``."""
    async with qwen_serve(tmp_path, qwen_entry, "--session-on-restart", "continue") as (
            child, model, _workspace):
        await anyio.to_thread.run_sync(child.start)
        async with httpx.AsyncClient(base_url=child.base_url, timeout=90) as client:
            sid = await new_session(client)
            running = await prompt(client, sid, "answer SLOW please")
            assert running.status_code == 202, running.text
            pid = running.json()["promptId"]
            seen = await read_events(client, sid, lambda e: e["type"] == "session_update"
                                     and e["data"]["update"]["sessionUpdate"]
                                     == "agent_message_chunk", last_event_id=0, timeout=90)
            cursor = max(e["id"] for e in seen if e.get("id") is not None)
        await anyio.to_thread.run_sync(child.kill)   # mid-stream: 50 chunks, 0.1 s apart
        asked = len(model.requests)
        await anyio.to_thread.run_sync(child.start)
        async with httpx.AsyncClient(base_url=child.base_url, timeout=90) as client:
            after = await read_events(client, sid, lambda e: e["type"] == "turn_complete",
                                      last_event_id=cursor, timeout=90)
            assert not [e for e in after if e["type"] in ("turn_error", "state_resync_required")]
            assert after[-1]["promptId"] == pid
            assert after[-1]["data"]["stopReason"] == "end_turn"
            assert [(u["content"]["text"], u["_meta"]["acp-server/continued"])
                    for u in _updates(after, "user_message_chunk")] == [
                (CONTINUE_TEXT, {"reason": "server_restarted"})]
            assert _texts(after, "agent_message_chunk")   # the continued turn's answer
        later = json.dumps(model.requests[asked:])
        assert CONTINUE_TEXT in later and "answer SLOW please" in later   # its transcript
