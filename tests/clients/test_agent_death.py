"""Real clients load a session again after its agent died (``bridge.restore.reseed_closed``):
the reference agent over stdio exits mid-turn (``/crash``), forgetting its sessions; the
server keeps the session in its journal, and ``@qwen-code/sdk``'s and our own
``DaemonSessionClient.load`` bring it back with its conversation, and a new turn runs;
``@agentclientprotocol/sdk``'s client finds it in ``session/list`` and loads it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from acp_server.client import DaemonClient, DaemonHttpError, DaemonSessionClient
from tests.clients.node import run_script
from tests.harness import ServeProcess, free_port

pytestmark = [pytest.mark.anyio, pytest.mark.clients]

AGENT = f"{sys.executable} -m bridge.agents.reference"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"   # the client side only (node, and httpx)


async def test_qwen_sdk_loads_a_session_whose_agent_died(qwen_sdk: str, tmp_path: Path) -> None:
    child = ServeProcess(tmp_path, "--port", str(free_port()), "--agent", AGENT).start()
    try:
        first = await run_script("qwen_sdk.mjs", qwen_sdk, child.base_url, "died")
        then = await run_script("qwen_sdk.mjs", qwen_sdk, child.base_url, "after",
                                first["sessionId"])
    finally:
        child.stop()
    assert first["turn"]["stopReason"] == "end_turn"
    assert "result" not in first["crash"], first["crash"]   # the SDK reported the death
    assert then["eventEpoch"] != first["eventEpoch"]   # a new life of the id
    said = [e["text"] for e in then["compactedReplay"] if e["type"] == "session_update"]
    assert said[:2] == ["before it died", "Echo: before it died"]
    assert then["turn"]["stopReason"] == "end_turn"


async def test_our_sdk_loads_a_session_whose_agent_died(tmp_path: Path) -> None:
    child = ServeProcess(tmp_path, "--port", str(free_port()), "--agent", AGENT).start()
    try:
        async with DaemonClient(child.base_url) as client:
            made = await DaemonSessionClient.create_or_attach(
                client, {"sessionScope": "thread"})
            await made.prompt([{"type": "text", "text": "before it died"}])
            # the turn's error when the SDK's stream saw it; 404 when a loaded machine
            # had the stream (re)open only after the session ended
            with pytest.raises(DaemonHttpError) as died:
                await made.prompt([{"type": "text", "text": "/crash"}])
            loaded = await DaemonSessionClient.load(client, made.session_id)
            reply = await loaded.prompt([{"type": "text", "text": "after it"}])
    finally:
        child.stop()
    assert died.value.code in ("agent_died", "session_not_found"), died.value
    assert not loaded.session.attached
    assert loaded.session.event_epoch != made.session.event_epoch   # a new life
    # the conversation came back as the new life's first events (echo and reply)
    assert loaded.session.last_event_id is not None and loaded.session.last_event_id >= 2
    assert reply.stop_reason == "end_turn"


@pytest.mark.parametrize("transport", ["http", "ws"])
async def test_acp_sdk_lists_a_session_whose_agent_died_and_loads_it(
        acp_sdk: str, tmp_path: Path, transport: str) -> None:
    """``session/list`` goes on after the live sessions with the ended ones: the SDK's
    client finds the session its agent's death ended and ``session/load``s it."""
    child = ServeProcess(tmp_path, "--port", str(free_port()), "--agent", AGENT).start()
    try:
        out = await run_script("acp_sdk_ended.mjs", acp_sdk, child.base_url, transport,
                               str(tmp_path))
    finally:
        child.stop()
    assert "error" in out["crash"], out["crash"]   # the turn the death cut short
    assert out["listed"] is not None and out["listed"]["cwd"] == str(tmp_path)
    log = out["log"]
    users = [i for i, e in enumerate(log) if e.get("sessionUpdate") == "user_message_chunk"]
    history, after = log[:users[-1]], log[users[-1]:]

    def said(part: list[dict[str, str]], kind: str) -> list[str]:
        return [e["text"] for e in part if e.get("sessionUpdate") == kind]

    assert said(history, "user_message_chunk")[0] == "before it died"
    assert "".join(said(history, "agent_message_chunk")).startswith("Echo: before it died")
    assert said(after, "user_message_chunk") == ["after"]
    assert "".join(said(after, "agent_message_chunk")) == "Echo: after"
    assert log[-1] == {"kind": "stop", "stopReason": "end_turn"}
