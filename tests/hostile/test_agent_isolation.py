"""Agents are isolated from each other (#21 item 5), over real HTTP with the real
``acp-server serve``: an "evil" stdio agent beside an honest one.

The evil agent names the honest agent's sessions in ``session/update``,
``session/request_permission`` and ``fs/read_text_file``, and answers a
``session/new`` with the id of a live honest session. Every such message is dropped,
logged and counted; the victim's SSE stream and an LMSP response of the honest agent
stay clean; the live session is untouched.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from httpx_sse import aconnect_sse

from tests.harness import ServeProcess
from tests.hostile.test_hung_agents import agent_flag, create, runtime

pytestmark = pytest.mark.anyio


async def prompt(daemon: ServeProcess, sid: str, text: str) -> None:
    response = await daemon.client.post(f"/session/{sid}/prompt", json={
        "prompt": [{"type": "text", "text": text}]})
    assert response.status_code == 202, response.text


async def turn(daemon: ServeProcess, sid: str, text: str) -> list[dict[str, Any]]:
    """Prompt ``sid`` and read its events (from before the prompt) to its turn's end."""
    status = (await daemon.client.get(f"/session/{sid}/status")).json()
    events: list[dict[str, Any]] = []
    async with aconnect_sse(daemon.client, "GET", f"/session/{sid}/events", headers={
            "Last-Event-ID": str(status["lastEventId"]),
            "X-Qwen-Event-Epoch": status["eventEpoch"]}) as source:
        await prompt(daemon, sid, text)
        with anyio.fail_after(20):
            async for sse in source.aiter_sse():
                if not sse.data:
                    continue
                event = json.loads(sse.data)
                events.append(event)
                if event["type"] in ("turn_complete", "turn_error"):
                    return events
    raise AssertionError(f"the stream ended: {events}")


def texts(events: list[dict[str, Any]]) -> str:
    return "".join(e["data"]["update"]["content"].get("text", "") for e in events
                   if e["type"] == "session_update"
                   and e["data"]["update"]["sessionUpdate"] == "agent_message_chunk")


async def test_an_evil_agent_reaches_no_other_agents_session(tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("the honest agent's secret\n")
    flags = [*agent_flag("honest"), *agent_flag("evil")]
    async with ServeProcess(tmp_path, *flags, cwd=tmp_path) as daemon:
        victim = (await create(daemon.client, "honest")).json()["sessionId"]
        evil = (await create(daemon.client, "evil")).json()["sessionId"]
        victim_events: list[dict[str, Any]] = []
        async with aconnect_sse(daemon.client, "GET", f"/session/{victim}/events") as source:
            async def watch_victim() -> None:
                async for sse in source.aiter_sse():
                    if sse.data:
                        victim_events.append(json.loads(sse.data))

            async with anyio.create_task_group() as tg:
                tg.start_soon(watch_victim)
                # The attack, then the victim's own turn: its stream holds that turn only.
                evil_events = await turn(daemon, evil, f"inject {victim}")
                seen = json.loads(texts(evil_events).removeprefix("saw: "))
                assert seen["permission"] == {"outcome": {"outcome": "cancelled"}}
                assert seen["fs"]["code"] == -32002 and "secret" not in json.dumps(seen)
                await turn(daemon, victim, "hello")
                with anyio.fail_after(10):
                    while not any(e["type"] == "turn_complete" for e in victim_events):
                        await anyio.sleep(0.01)
                tg.cancel_scope.cancel()
        assert "INJECTED" not in json.dumps(victim_events)
        assert not [e for e in victim_events if e["type"].startswith("permission")]
        assert texts(victim_events) == "honest: hello"
        current = await runtime(daemon)
        assert current["agents"]["foreignMessagesDropped"] == 3
        metrics = (await daemon.client.get("/metrics")).text
        for method in ("session/update", "session/request_permission", "fs/read_text_file"):
            assert (f'acp_server_agent_foreign_messages_dropped_total{{agent="evil",'
                    f'method="{method}"}} 1.0') in metrics
        assert "not its session" in daemon.stderr_text()

        # A session/new answer naming the live victim is refused; the victim is untouched.
        await turn(daemon, evil, f"collide {victim}")
        refused = await create(daemon.client, "evil")
        assert refused.status_code == 502, refused.text
        assert refused.json()["code"] == "agent_protocol_error"
        assert texts(await turn(daemon, victim, "still mine")) == "honest: still mine"
        assert {(s["sessionId"], s["agent"]) for s in await _sessions(daemon)} == {
            (victim, "honest"), (evil, "evil")}


async def test_an_lmsp_response_of_the_honest_agent_stays_clean(tmp_path: Path) -> None:
    flags = [*agent_flag("honest"), *agent_flag("evil")]
    async with ServeProcess(tmp_path, *flags, cwd=tmp_path) as daemon:
        created = await daemon.client.post("/lmsp/v1/responses", json={
            "model": "honest", "input": "gate open-gate", "background": True})
        assert created.status_code in (200, 202), created.text
        response_id = created.json()["id"]
        # Find the task's session (it waits at the gate) and attack it.
        victim = await _session_of(daemon, "honest")
        evil = (await create(daemon.client, "evil")).json()["sessionId"]
        await turn(daemon, evil, f"inject {victim}")
        (tmp_path / "open-gate").write_text("")
        with anyio.fail_after(20):
            while True:
                body = (await daemon.client.get(f"/lmsp/v1/responses/{response_id}")).json()
                if body["status"] not in ("queued", "in_progress"):
                    break
                await anyio.sleep(0.02)
        assert body["status"] == "completed", body
        assert body["output"][0]["content"][0]["text"] == "honest: gate open-gate"
        assert "INJECTED" not in json.dumps(body)
        assert (await runtime(daemon))["agents"]["foreignMessagesDropped"] == 3


async def _sessions(daemon: ServeProcess) -> list[dict[str, Any]]:
    workspace = (await daemon.client.get("/capabilities")).json()["workspaces"][0]["id"]
    listed = (await daemon.client.get(f"/workspace/{workspace}/sessions")).json()
    return listed["sessions"]  # type: ignore[no-any-return]


async def _session_of(daemon: ServeProcess, agent: str) -> str:
    with anyio.fail_after(20):
        while True:
            mine = [s["sessionId"] for s in await _sessions(daemon) if s["agent"] == agent]
            if mine:
                return mine[0]
            await anyio.sleep(0.02)
