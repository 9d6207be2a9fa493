"""An agent that never ends a cancelled turn (``bridge.abandoning``), behind the doors,
over real HTTP on both anyio backends: a real child (``tests.agents.fixture_agent``,
whose ``gate <file>`` prompt ignores ``session/cancel`` and never ends while the file
is missing). Past ``--abandoned-turn-timeout-ms`` the stream says so in the door's shape
(REST SSE ``agent_abandoned``; ``/acp`` ``_qwen/notify`` of that kind), the prompt
queued behind the turn runs, ``/metrics`` counts the give-up by its action
(``acp_server_agent_abandoned_total``), and the server stops."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from httpx_sse import aconnect_sse
from prometheus_client.parser import text_string_to_metric_families

from bridge.options import BridgeOptions
from tests.acp_http.server import request, running_acp_server
from tests.agents import ROOT
from tests.bridge.helpers import wait_until

pytestmark = pytest.mark.anyio
OPTIONS = BridgeOptions(cancel_grace_ms=100, abandoned_turn_timeout_ms=400)


async def give_ups(client: Any) -> dict[str, float]:
    """``acp_server_agent_abandoned_total`` by action, as ``/metrics`` says."""
    scraped = await client.get("/metrics")
    assert scraped.status_code == 200, scraped.text
    return {s.labels["action"]: s.value
            for family in text_string_to_metric_families(scraped.text)
            for s in family.samples if s.name == "acp_server_agent_abandoned_total"}


async def hang_then_cancel(client: Any, sid: str, record: Path, gate: Path) -> str:
    """A turn the agent never ends, cancelled, and a prompt queued behind it: the
    queued prompt's id."""
    hung = await client.post(f"/session/{sid}/prompt", json={
        "prompt": [{"type": "text", "text": f"gate {gate}"}]})
    assert hung.status_code == 202, hung.text
    await wait_until(lambda: record.exists() and gate.name in record.read_text())
    queued = await client.post(f"/session/{sid}/prompt", json={
        "prompt": [{"type": "text", "text": "next"}]})
    assert queued.status_code == 202, queued.text
    assert (await client.post(f"/session/{sid}/cancel")).status_code < 300
    return queued.json()["promptId"]  # type: ignore[no-any-return]


def gated(record: Path) -> str:
    return shlex.join([sys.executable, str(ROOT / "tests" / "agents" / "fixture_agent.py"),
                       "--name", "gated", "--record-prompts", str(record)])


async def test_rest_stream_shows_the_agent_given_up_on(tmp_path: Path) -> None:
    record = tmp_path / "prompts.txt"
    with anyio.fail_after(90):
        async with running_acp_server(tmp_path, agent=gated(record), options=OPTIONS) as srv:
            client = srv.client
            created = await client.post("/session", json={})
            assert created.status_code == 200, created.text
            sid = created.json()["sessionId"]
            events: list[dict[str, Any]] = []
            async with aconnect_sse(client, "GET", f"/session/{sid}/events") as source:
                hung = await client.post(f"/session/{sid}/prompt", json={
                    "prompt": [{"type": "text", "text": f"gate {tmp_path / 'never'}"}]})
                assert hung.status_code == 202, hung.text
                await wait_until(lambda: record.exists() and "never" in record.read_text())
                queued = await client.post(f"/session/{sid}/prompt", json={
                    "prompt": [{"type": "text", "text": "next"}]})
                assert queued.status_code == 202, queued.text
                assert (await client.post(f"/session/{sid}/cancel")).status_code < 300
                async for sse in source.aiter_sse():
                    if not sse.data:
                        continue
                    event = json.loads(sse.data)
                    events.append(event)
                    if event["type"] == "turn_complete" \
                            and event["promptId"] == queued.json()["promptId"]:
                        break
            kinds = [(e["type"], e["data"].get("stopReason") or e["data"].get("action"))
                     for e in events if e["type"] in ("turn_complete", "agent_abandoned")]
            assert kinds == [("turn_complete", "cancelled"), ("agent_abandoned", "agent_stopped"),
                             ("turn_complete", "end_turn")], kinds
            abandoned = next(e for e in events if e["type"] == "agent_abandoned")
            assert abandoned["data"]["sessionId"] == sid
            assert abandoned["data"]["promptId"] == hung.json()["promptId"]
            said = [e["data"]["update"]["content"]["text"] for e in events
                    if e["type"] == "session_update"
                    and e["data"]["update"]["sessionUpdate"] == "agent_message_chunk"]
            assert said == ["gated: next"], said
            assert await give_ups(client) == {"agent_stopped": 1, "session_detached": 0}


async def test_metrics_count_a_session_detached_from_a_shared_agent(tmp_path: Path) -> None:
    """Two sessions on one agent process: the one whose turn is given up on lets go of
    it (``session_detached``), the process stays for the other; ``/metrics`` counts
    it under that action."""
    record = tmp_path / "prompts.txt"
    with anyio.fail_after(90):
        async with running_acp_server(tmp_path, agent=gated(record), options=OPTIONS) as srv:
            client = srv.client
            assert await give_ups(client) == {"agent_stopped": 0, "session_detached": 0}
            other, sid = [(await client.post("/session", json={"sessionScope": "thread"})
                           ).json()["sessionId"] for _ in range(2)]
            async with aconnect_sse(client, "GET", f"/session/{sid}/events") as source:
                queued = await hang_then_cancel(client, sid, record, tmp_path / "never")
                async for sse in source.aiter_sse():
                    event = json.loads(sse.data) if sse.data else {}
                    if event.get("type") == "turn_complete" and event["promptId"] == queued:
                        break
            assert await give_ups(client) == {"agent_stopped": 0, "session_detached": 1}
            assert other != sid


async def test_acp_stream_shows_the_agent_given_up_on(tmp_path: Path) -> None:
    record = tmp_path / "prompts.txt"
    with anyio.fail_after(90):
        async with running_acp_server(tmp_path, agent=gated(record), options=OPTIONS) as srv:
            conn_id, _ = await srv.initialize()
            async with srv.stream(conn_id) as conn_stream:
                sid = await srv.new_session(conn_id, conn_stream)
                async with srv.stream(conn_id, sid) as session_stream:
                    await srv.prompt(conn_id, sid, 2, f"gate {tmp_path / 'never'}")
                    await wait_until(lambda: record.exists() and "never" in record.read_text())
                    await srv.prompt(conn_id, sid, 3, "next")
                    response = await srv.post(conn_id, request(None, "session/cancel",
                                                               {"sessionId": sid}), sid)
                    assert response.status_code == 202
                    reply = await session_stream.wait_for_id(2)
                    assert reply["result"]["stopReason"] == "cancelled", reply
                    notice = await session_stream.wait_for(
                        lambda m: m.get("method") == "_qwen/notify"
                        and m["params"].get("kind") == "agent_abandoned")
                    assert notice["params"]["data"]["action"] == "agent_stopped", notice
                    assert notice["params"]["data"]["sessionId"] == sid
                    reply = await session_stream.wait_for_id(3)
                    assert reply["result"]["stopReason"] == "end_turn", reply
                    texts = [m["params"]["update"].get("content", {}).get("text")
                             for m in session_stream.messages
                             if m.get("method") == "session/update"]
                    assert "gated: next" in texts, texts
