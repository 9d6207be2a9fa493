"""Sessions survive ``kill -9`` (issue #23): a real ``acp-server serve`` on SQLite and on
PostgreSQL, with the reference agent, killed with SIGKILL and started again on the same
state dir and port.

Every prompt acknowledged with 202 before the kill is accounted for: the one that was
running fails visibly (``server_restarted``, policy ``fail``), the queued ones run after
the restart in their order. A reader that reconnects with ``Last-Event-ID`` and
``X-Qwen-Event-Epoch`` gets exactly the events it missed: no gap, no duplicate, no
resync. Our SDK's ``DaemonSessionClient`` sees the same across the restart.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from acp_server.client import DaemonClient
from acp_server.client.errors import DaemonTurnError
from acp_server.rest.workspace import workspace_id
from tests.harness import ServeProcess, free_port
from tests.lmsp import stores

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"   # the client side only; the server is its own process


def _flags(tmp_path: Path, store_name: str) -> list[str]:
    port = ["--port", str(free_port())]
    if store_name == "postgres":
        return [*port, "--store", stores.postgres_url_for(tmp_path, "sessions"),
                *stores.lease_flags()]
    return port


def _prompt(text: str) -> dict[str, Any]:
    return {"prompt": [{"type": "text", "text": text}]}


async def read_events(client: httpx.AsyncClient, sid: str, stop: Any, *,
                      last_event_id: int | None = None, epoch: str | None = None,
                      timeout: float = 20) -> list[dict[str, Any]]:
    """SSE envelopes (and control frames) until ``stop(envelope)`` is true."""
    headers = {}
    if last_event_id is not None:
        headers["Last-Event-ID"] = str(last_event_id)
    if epoch is not None:
        headers["X-Qwen-Event-Epoch"] = epoch
    seen: list[dict[str, Any]] = []
    with anyio.fail_after(timeout):
        async with client.stream("GET", f"/session/{sid}/events", headers=headers) as response:
            assert response.status_code == 200, await response.aread()
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    envelope = json.loads(line[len("data: "):])
                    seen.append(envelope)
                    if stop(envelope):
                        return seen
    return seen


def _is(kind: str, prompt_id: str) -> Any:
    return lambda e: e["type"] == kind and e.get("promptId") == prompt_id


def _ids(events: list[dict[str, Any]]) -> list[int]:
    return [e["id"] for e in events if e.get("id") is not None]


async def test_kill_9_keeps_sessions_prompts_and_cursors(tmp_path: Path, store_name: str) -> None:
    flags = _flags(tmp_path, store_name)
    child = ServeProcess(tmp_path, *flags).start()
    try:
        async with httpx.AsyncClient(base_url=child.base_url, timeout=10) as client:
            created = (await client.post("/session", json={"sessionScope": "thread"})).json()
            sid, epoch = created["sessionId"], created["eventEpoch"]
            first = (await client.post(f"/session/{sid}/prompt", json=_prompt("hello"))).json()
            await read_events(client, sid, _is("turn_complete", first["promptId"]),
                              last_event_id=0)
            acked = []
            for text in ("/sleep 30s long", "queued one", "queued two"):
                body = _prompt(text) if acked else {**_prompt(text), "promptId": "long-1"}
                answer = await client.post(f"/session/{sid}/prompt", json=body)
                assert answer.status_code == 202
                acked.append(answer.json()["promptId"])
            long_id = acked[0]
            assert long_id == "long-1"
            held = await client.post(f"/session/{sid}/prompt",   # runs after the restart
                                     json={**_prompt("/sleep 30s held"), "promptId": "q-3"})
            assert held.status_code == 202
            # A reader that saw everything up to the long prompt's echo.
            before = await read_events(client, sid, lambda e: e.get("promptId") == long_id
                                       and e["type"] == "session_update", last_event_id=0)
            cursor = _ids(before)[-1]
            assert _ids(before) == list(range(1, cursor + 1))
        child.kill()   # SIGKILL: no drain, no clean stop
        child.start()
        async with httpx.AsyncClient(base_url=child.base_url, timeout=10) as client:
            listed = (await client.get(f"/workspace/{workspace_id(str(tmp_path))}/sessions")
                      ).json()
            assert sid in [s["sessionId"] for s in listed["sessions"]]
            after = await read_events(client, sid, _is("turn_complete", acked[2]),
                                      last_event_id=cursor, epoch=epoch)
            assert not [e for e in after if e["type"] == "state_resync_required"]
            ids = _ids(after)
            assert ids == list(range(cursor + 1, cursor + 1 + len(ids)))   # no gap, no dup
            failed = [e for e in after if e["type"] == "turn_error"]
            assert [(e["promptId"], e["data"]["code"]) for e in failed] == [
                (long_id, "server_restarted")]
            done = [e["promptId"] for e in after if e["type"] == "turn_complete"]
            assert done == acked[1:]   # the queued ones, in their order
            loaded = (await client.post(f"/session/{sid}/load", json={})).json()
            terminals = {t["promptId"]: t for t in loaded["promptTerminals"]}
            assert terminals[long_id]["terminal"] == "failed"
            assert terminals[long_id]["errorCode"] == "server_restarted"
            assert all(terminals[p]["terminal"] == "completed" for p in [first["promptId"],
                                                                          *acked[1:]])
            assert loaded["eventEpoch"] == epoch
            # Sent again under their ids after the restart: answered, never run again.
            again = await client.post(f"/session/{sid}/prompt",
                                      json={**_prompt("/sleep 30s long"), "promptId": long_id})
            assert again.status_code == 200, again.text
            assert again.json()["errorCode"] == "server_restarted"
            again = await client.post(f"/session/{sid}/prompt",
                                      json={**_prompt("queued two"), "promptId": acked[2]})
            assert again.status_code == 200 and again.json()["terminal"] == "completed"
            again = await client.post(f"/session/{sid}/prompt",   # pending: its first 202
                                      json={**_prompt("/sleep 30s held"), "promptId": "q-3"})
            assert again.status_code == 202 and again.json() == held.json()
            assert again.headers["idempotent-replayed"] == "true"
            assert (await client.delete(f"/session/{sid}/pending-prompts/q-3")
                    ).json() == {"removed": True}
    finally:
        child.stop()


class _Gate(httpx.AsyncBaseTransport):
    """A real transport that holds requests while the server is down (``closed``), so a
    client's reconnects wait for the restart instead of spending their attempts."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.open = anyio.Event()
        self.open.set()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await self.open.wait()
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_our_sdk_client_across_a_restart(tmp_path: Path, store_name: str) -> None:
    """``DaemonClient.prompt`` (our SDK) waiting on a running turn when the server is
    killed: after the restart on the same URL it resumes its stream by cursor and
    reports the turn's ``server_restarted`` failure; a queued prompt it sent runs."""
    child = ServeProcess(tmp_path, *_flags(tmp_path, store_name)).start()
    gate = _Gate()
    try:
        # the client's timeout bounds a hang (httpx's default, 5 s between two bytes of
        # an event stream, a loaded machine can pass while the queued prompt reruns)
        async with DaemonClient(child.base_url, transport=gate) as sdk, \
                httpx.AsyncClient(base_url=child.base_url, timeout=30) as client:
            session = await sdk.create_or_attach_session({"sessionScope": "thread"})
            sid = session.session_id
            outcome: dict[str, Any] = {}

            async def wait_long() -> None:
                try:
                    await sdk.prompt(sid, _prompt("/sleep 60s long")["prompt"])
                except DaemonTurnError as exc:
                    outcome["error"] = exc

            async with anyio.create_task_group() as tg:
                tg.start_soon(wait_long)
                await read_events(client, sid, lambda e: e["type"] == "session_update",
                                  last_event_id=0)   # the long turn is running
                queued = await sdk.prompt_nonblocking(sid, _prompt("queued")["prompt"])
                gate.open = anyio.Event()   # reconnects wait for the restart
                await anyio.to_thread.run_sync(child.kill)
                await anyio.to_thread.run_sync(child.start)
                gate.open.set()
            error = outcome["error"]
            assert error.code == "server_restarted"
            events = await read_events(client, sid, _is("turn_complete", queued.prompt_id),
                                       last_event_id=0)
            assert [e["data"]["code"] for e in events if e["type"] == "turn_error"] == [
                "server_restarted"]
    finally:
        child.stop()


async def test_a_permission_pending_at_the_kill_is_cancelled(tmp_path: Path,
                                                             store_name: str) -> None:
    """Policy ``fail``: the turn that asked is gone, so its permission request is
    resolved as cancelled (``server_restarted``) and the turn fails visibly."""
    child = ServeProcess(tmp_path, *_flags(tmp_path, store_name)).start()
    try:
        async with httpx.AsyncClient(base_url=child.base_url, timeout=10) as client:
            created = (await client.post("/session", json={"sessionScope": "thread"})).json()
            sid = created["sessionId"]
            asked = (await client.post(f"/session/{sid}/prompt",
                                       json=_prompt("/permission go"))).json()
            seen = await read_events(client, sid, lambda e: e["type"] == "permission_request",
                                     last_event_id=0)
            request_id = seen[-1]["data"]["requestId"]
        child.kill()
        child.start()
        async with httpx.AsyncClient(base_url=child.base_url, timeout=10) as client:
            after = await read_events(client, sid, _is("turn_error", asked["promptId"]),
                                      last_event_id=_ids(seen)[-1], epoch=created["eventEpoch"])
            resolved = [e for e in after if e["type"] == "permission_resolved"]
            assert [(e["data"]["requestId"], e["data"]["outcome"], e["data"]["reason"])
                    for e in resolved] == [(request_id, {"outcome": "cancelled"},
                                            "server_restarted")]
            vote = await client.post(f"/permission/{request_id}",
                                     json={"outcome": {"outcome": "selected",
                                                       "optionId": "allow_once"}})
            assert vote.status_code == 404
    finally:
        child.stop()


async def test_continue_runs_the_interrupted_turn_again(tmp_path: Path,
                                                        store_name: str) -> None:
    """Policy ``continue``: the turn that was running at the kill runs again under its
    prompt id (the reference agent came back empty, so it gets its prompt again), its
    echo marked ``acp-server/continued``; its old permission request is cancelled and
    asked anew, and once answered the turn completes, then the queued prompt runs."""
    child = ServeProcess(tmp_path, *_flags(tmp_path, store_name),
                         "--session-on-restart", "continue").start()
    try:
        async with httpx.AsyncClient(base_url=child.base_url, timeout=10) as client:
            created = (await client.post("/session", json={"sessionScope": "thread"})).json()
            sid = created["sessionId"]
            asked = (await client.post(f"/session/{sid}/prompt",
                                       json=_prompt("/permission go"))).json()
            queued = (await client.post(f"/session/{sid}/prompt",
                                        json=_prompt("queued"))).json()
            seen = await read_events(client, sid, lambda e: e["type"] == "permission_request",
                                     last_event_id=0)
            old_request = seen[-1]["data"]["requestId"]
        child.kill()
        child.start()
        async with httpx.AsyncClient(base_url=child.base_url, timeout=10) as client:
            after = await read_events(client, sid, lambda e: e["type"] == "permission_request",
                                      last_event_id=_ids(seen)[-1],
                                      epoch=created["eventEpoch"])
            assert [(e["type"], e["data"].get("reason")) for e in after
                    if e["type"] in ("permission_resolved", "turn_error")] == [
                ("permission_resolved", "server_restarted")]
            echo = [e for e in after if e["type"] == "session_update"
                    and e["data"]["update"]["sessionUpdate"] == "user_message_chunk"]
            assert [(e["promptId"], e["data"]["update"]["content"]["text"],
                     e["data"]["update"]["_meta"]["acp-server/continued"]) for e in echo] == [
                (asked["promptId"], "/permission go", {"reason": "server_restarted"})]
            new_request = after[-1]["data"]["requestId"]
            assert new_request != old_request and after[-1]["promptId"] == asked["promptId"]
            vote = await client.post(f"/permission/{new_request}", json={
                "outcome": {"outcome": "selected", "optionId": "allow_once"}})
            assert vote.status_code == 200, vote.text
            rest = await read_events(client, sid, _is("turn_complete", queued["promptId"]),
                                     last_event_id=_ids(after)[-1],
                                     epoch=created["eventEpoch"])
            assert [e["promptId"] for e in rest if e["type"] in ("turn_complete", "turn_error")
                    ] == [asked["promptId"], queued["promptId"]]
            assert [e["data"]["stopReason"] for e in rest if e["type"] == "turn_complete"] == [
                "end_turn", "end_turn"]
            loaded = (await client.post(f"/session/{sid}/load", json={})).json()
            terminals = {t["promptId"]: t["terminal"] for t in loaded["promptTerminals"]}
            assert terminals[asked["promptId"]] == terminals[queued["promptId"]] == "completed"
    finally:
        child.stop()


async def test_a_cancel_acknowledged_before_the_kill_ends_its_prompt_cancelled(
        tmp_path: Path, store_name: str) -> None:
    """The journal holds the cancel (committed: readers saw it) and not the turn's end
    (an agent that ignores ``session/cancel``, within the grace): after ``kill -9`` the
    prompt ends cancelled, not ``server_restarted``, and under ``continue`` it is not
    run again."""
    agent = tmp_path / "deaf-agent"
    agent.write_text(f"#!/bin/sh\nPYTHONPATH={Path(__file__).resolve().parents[2]} exec "
                     f"{sys.executable} -m tests.agents.fixture_agent --name deaf\n")
    agent.chmod(0o755)
    child = ServeProcess(tmp_path, *_flags(tmp_path, store_name), "--agent", str(agent),
                         "--session-on-restart", "continue").start()
    try:
        async with httpx.AsyncClient(base_url=child.base_url, timeout=10) as client:
            created = (await client.post("/session", json={"sessionScope": "thread"})).json()
            sid = created["sessionId"]
            asked = (await client.post(f"/session/{sid}/prompt",
                                       json=_prompt("gate never-made"))).json()
            pid = asked["promptId"]
            await read_events(client, sid, _is("session_update", pid), last_event_id=0)
            assert (await client.post(f"/session/{sid}/cancel")).status_code == 204
            seen = await read_events(client, sid, _is("prompt_cancelled", pid), last_event_id=0)
            assert not any(e["type"] in ("turn_complete", "turn_error") for e in seen)
        child.kill()
        child.start()
        async with httpx.AsyncClient(base_url=child.base_url, timeout=10) as client:
            after = await read_events(client, sid, lambda e: e["type"] in (
                "turn_complete", "turn_error") and e.get("promptId") == pid,
                last_event_id=_ids(seen)[-1], epoch=created["eventEpoch"])
            assert after[-1]["type"] == "turn_complete", after[-1]
            assert after[-1]["data"]["stopReason"] == "cancelled"
            assert not any(e["type"] == "session_update" for e in after)   # not run again
            loaded = (await client.post(f"/session/{sid}/load", json={})).json()
            assert {t["promptId"]: t["terminal"] for t in loaded["promptTerminals"]}[pid] \
                == "cancelled"
    finally:
        child.stop()


async def test_a_branch_restored_keeps_the_conversation_it_was_made_from(
        tmp_path: Path, store_name: str) -> None:
    """A branch's agent side has its parent's turns; after ``kill -9`` the reference
    agent comes back through ``session/new`` seeded with the journal's transcript,
    which now starts with the parent's conversation at the branch (its record keeps
    it), then the branch's own turns."""
    child = ServeProcess(tmp_path, *_flags(tmp_path, store_name)).start()
    try:
        async with httpx.AsyncClient(base_url=child.base_url, timeout=10) as client:
            sid = (await client.post("/session", json={"sessionScope": "thread"})
                   ).json()["sessionId"]
            first = (await client.post(f"/session/{sid}/prompt",
                                       json=_prompt("remember banana"))).json()
            await read_events(client, sid, _is("turn_complete", first["promptId"]),
                              last_event_id=0)
            answer = await client.post(f"/session/{sid}/branch", json={})
            assert answer.status_code == 201, answer.text
            branch = answer.json()
            bid = branch["sessionId"]
            own = (await client.post(f"/session/{bid}/prompt", json=_prompt("hello"))).json()
            await read_events(client, bid, _is("turn_complete", own["promptId"]),
                              last_event_id=0)
        child.kill()
        child.start()
        async with httpx.AsyncClient(base_url=child.base_url, timeout=10) as client:
            asked = (await client.post(f"/session/{bid}/prompt",
                                       json=_prompt("/history x"))).json()
            events = await read_events(client, bid, _is("turn_complete", asked["promptId"]),
                                       last_event_id=0)
            said = "".join(e["data"]["update"]["content"]["text"] for e in events
                           if e["type"] == "session_update" and e.get("promptId")
                           == asked["promptId"] and e["data"]["update"]["sessionUpdate"]
                           == "agent_message_chunk")
            assert said.index("remember banana") < said.index("user: hello"), said
    finally:
        child.stop()
