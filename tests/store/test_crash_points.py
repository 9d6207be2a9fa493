"""Kill points the other restart tests do not reach (``kill -9`` of a real ``acp-server
serve`` on SQLite and on PostgreSQL, started again on the same state): each kill waits
on a condition seen from outside (an event on the stream), never on time.

* ``--session-on-restart continue``, killed again during the continued turn: the turn
  is continued once, never again: the second restart fails it ``server_restarted``
  (no crash loop on a turn that brings the server down), one terminal per prompt, and
  a reader resuming across both restarts sees no gap and no duplicate.
* our SDK (``DaemonClient.prompt``) waiting on that turn across both restarts reports
  its ``server_restarted`` failure once the second start fails it.
* killed again right after a start, while the prompts queued at the first kill run
  (the second one has reached its agent): every acknowledged prompt reaches the agent
  at most once (policy ``fail``), each ends once, the last one runs.
* ``continue`` with an agent that dies at every ``session/load``: the interrupted turn
  fails ``server_restarted`` and the prompt queued behind it ``session_not_restorable``
  (the documented terminals), no loop.
* ``/acp`` ``session/set_mode`` answered, then ``kill -9``: after the restart the
  session's mode is the one acknowledged (an agent that forgot it, as a new process
  does, is asked again), in the agent's own turns and in ``/load``'s ``state``.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import anyio
import anyio.to_thread
import httpx
import pytest

from tests.agents import fixture_command
from acp_server.client import DaemonClient
from acp_server.client.errors import DaemonTurnError
from tests.acp_http.wsclient import ws_connect
from tests.harness import ServeProcess
from tests.store.test_session_restart import _flags, _Gate, _ids, _is, _prompt, read_events

pytestmark = pytest.mark.anyio

CONTINUED = "acp-server/continued"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"   # the client side only; the server is its own process


def _terminals(events: list[dict]) -> list[tuple[str, str]]:
    return [(e["promptId"], e["type"]) for e in events
            if e["type"] in ("turn_complete", "turn_error")]


def _echoes(events: list[dict]) -> list[tuple[str, object]]:
    return [(e["promptId"], e["data"]["update"].get("_meta", {}).get(CONTINUED))
            for e in events if e["type"] == "session_update"
            and e["data"]["update"]["sessionUpdate"] == "user_message_chunk"]


async def test_a_continued_turn_killed_again_is_not_continued_twice(
        tmp_path: Path, store_name: str) -> None:
    child = ServeProcess(tmp_path, *_flags(tmp_path, store_name),
                         "--session-on-restart", "continue").start()
    try:
        async with httpx.AsyncClient(base_url=child.base_url, timeout=10) as client:
            created = (await client.post("/session", json={"sessionScope": "thread"})).json()
            sid, epoch = created["sessionId"], created["eventEpoch"]
            held = (await client.post(f"/session/{sid}/prompt",
                                      json=_prompt("/sleep 60s"))).json()["promptId"]
            queued = (await client.post(f"/session/{sid}/prompt",
                                        json=_prompt("after"))).json()["promptId"]
            seen = await read_events(client, sid, _is("session_update", held), last_event_id=0)
        child.kill()
        child.start()
        async with httpx.AsyncClient(base_url=child.base_url, timeout=10) as client:
            # the continued turn has started again (its marked echo): kill it there
            second = await read_events(client, sid, lambda e: bool(_echoes([e])),
                                       last_event_id=_ids(seen)[-1], epoch=epoch)
            assert _echoes(second) == [(held, {"reason": "server_restarted"})]
        child.kill()
        child.start()
        async with httpx.AsyncClient(base_url=child.base_url, timeout=10) as client:
            third = await read_events(client, sid, _is("turn_complete", queued),
                                      last_event_id=_ids(second)[-1], epoch=epoch)
            assert not [e for e in third if e["type"] == "state_resync_required"]
            assert _echoes(third) == [(queued, None)]   # the held turn did not run again
            assert _terminals(third) == [(held, "turn_error"), (queued, "turn_complete")]
            assert [e["data"]["code"] for e in third if e["type"] == "turn_error"] == [
                "server_restarted"]
            every = _ids(seen) + _ids(second) + _ids(third)
            assert every == list(range(1, len(every) + 1))   # no gap, no duplicate
            loaded = (await client.post(f"/session/{sid}/load", json={})).json()
            assert [(t["promptId"], t["terminal"]) for t in loaded["promptTerminals"]] == [
                (held, "failed"), (queued, "completed")]
    finally:
        child.stop()


async def test_our_sdk_across_two_restarts_of_a_continued_turn(tmp_path: Path,
                                                               store_name: str) -> None:
    child = ServeProcess(tmp_path, *_flags(tmp_path, store_name),
                         "--session-on-restart", "continue").start()
    gate = _Gate()
    try:
        async with DaemonClient(child.base_url, transport=gate) as sdk, \
                httpx.AsyncClient(base_url=child.base_url, timeout=10) as client:
            session = await sdk.create_or_attach_session({"sessionScope": "thread"})
            sid = session.session_id
            outcome: dict[str, DaemonTurnError] = {}

            async def wait_long() -> None:
                try:
                    await sdk.prompt(sid, _prompt("/sleep 60s long")["prompt"])
                except DaemonTurnError as exc:
                    outcome["error"] = exc

            with anyio.fail_after(40):   # continued again, it would end in 60 s
                await _twice(child, client, gate, sid, wait_long)
            assert outcome["error"].code == "server_restarted"
    finally:
        child.stop()


async def _twice(child: ServeProcess, client: httpx.AsyncClient, gate: _Gate, sid: str,
                 wait_long: object) -> None:
    """Kill while ``wait_long`` waits on the running turn, restart, kill again once the
    continued turn has started, restart; the SDK's requests wait for the last start."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(wait_long)  # type: ignore[arg-type]
        seen = await read_events(client, sid, lambda e: bool(_echoes([e])),
                                 last_event_id=0)
        gate.open = anyio.Event()   # reconnects wait for the restart
        await anyio.to_thread.run_sync(child.kill)
        await anyio.to_thread.run_sync(child.start)
        await read_events(client, sid, lambda e: bool(_echoes([e])),
                          last_event_id=_ids(seen)[-1])   # continued: kill again
        await anyio.to_thread.run_sync(child.kill)
        await anyio.to_thread.run_sync(child.start)
        gate.open.set()


def _agent(*flags: str) -> list[str]:
    return ["--agent", shlex.join(fixture_command("fx", *flags))]


async def test_killed_again_while_the_queued_prompts_rerun_each_runs_at_most_once(
        tmp_path: Path, store_name: str) -> None:
    record = tmp_path / "prompts.txt"
    child = ServeProcess(tmp_path, *_flags(tmp_path, store_name),
                         *_agent("--record-prompts", str(record))).start()
    said = [f"gate {tmp_path / 'never-1'}", f"gate {tmp_path / 'never-2'}", "three"]
    try:
        async with httpx.AsyncClient(base_url=child.base_url, timeout=10) as client:
            created = (await client.post("/session", json={"sessionScope": "thread"})).json()
            sid, epoch = created["sessionId"], created["eventEpoch"]
            pids = [(await client.post(f"/session/{sid}/prompt", json=_prompt(text))
                     ).json()["promptId"] for text in said]
            seen = await read_events(client, sid, _is("session_update", pids[0]),
                                     last_event_id=0)
            seen += await read_events(client, sid, _is("pending_prompt_added", pids[2]),
                                      last_event_id=_ids(seen)[-1])
        child.kill()
        child.start()
        async with httpx.AsyncClient(base_url=child.base_url, timeout=10) as client:
            second = await read_events(client, sid, _is("session_update", pids[1]),
                                       last_event_id=_ids(seen)[-1], epoch=epoch)
        with anyio.fail_after(20):
            while said[1] not in record.read_text():   # it reached the agent: kill there
                await anyio.sleep(0.02)
        child.kill()
        child.start()
        async with httpx.AsyncClient(base_url=child.base_url, timeout=10) as client:
            third = await read_events(client, sid, _is("turn_complete", pids[2]),
                                      last_event_id=_ids(second)[-1], epoch=epoch)
            every = seen + second + third
            assert _terminals(every) == [(pids[0], "turn_error"), (pids[1], "turn_error"),
                                         (pids[2], "turn_complete")]
            ids = _ids(every)
            assert ids == list(range(1, len(ids) + 1))
            loaded = (await client.post(f"/session/{sid}/load", json={})).json()
            assert [t["terminal"] for t in loaded["promptTerminals"]] == [
                "failed", "failed", "completed"]
        assert record.read_text().splitlines() == said   # each reached the agent once
    finally:
        child.stop()


async def test_continue_with_an_agent_that_dies_at_every_load(tmp_path: Path,
                                                              store_name: str) -> None:
    deaths = tmp_path / "loads.txt"
    child = ServeProcess(tmp_path, *_flags(tmp_path, store_name), "--session-on-restart",
                         "continue", *_agent("--die-at-load", str(deaths),
                                             "--die-times", "1000")).start()
    try:
        async with httpx.AsyncClient(base_url=child.base_url, timeout=10) as client:
            created = (await client.post("/session", json={"sessionScope": "thread"})).json()
            sid, epoch = created["sessionId"], created["eventEpoch"]
            held = (await client.post(f"/session/{sid}/prompt", json=_prompt(
                f"gate {tmp_path / 'never'}"))).json()["promptId"]
            queued = (await client.post(f"/session/{sid}/prompt",
                                        json=_prompt("after"))).json()["promptId"]
            seen = await read_events(client, sid, _is("pending_prompt_added", queued),
                                     last_event_id=0)
        child.kill()
        child.start()
        async with httpx.AsyncClient(base_url=child.base_url, timeout=10) as client:
            after = await read_events(client, sid, lambda e: e.get("promptId") == queued
                                      and e["type"] in ("turn_error", "turn_complete"),
                                      last_event_id=_ids(seen)[-1], epoch=epoch)
            assert [(e["promptId"], e["data"]["code"]) for e in after
                    if e["type"] == "turn_error"] == [(held, "server_restarted"),
                                                      (queued, "session_not_restorable")]
            assert _echoes(after) == []   # neither reached the agent
            again = await client.post(f"/session/{sid}/prompt", json=_prompt("more"))
            assert again.status_code == 409, again.text
        assert len(deaths.read_text().splitlines()) == 2   # asked, restarted, asked once more
    finally:
        child.stop()


async def _acp_call(ws: object, rpc_id: int, method: str, params: dict) -> dict:
    await ws.send_json({"jsonrpc": "2.0", "id": rpc_id, "method": method,  # type: ignore[attr-defined]
                        "params": params})
    with anyio.fail_after(20):
        while True:
            message = await ws.receive_json()  # type: ignore[attr-defined]
            if message.get("id") == rpc_id and "method" not in message:
                assert "result" in message, message
                return message["result"]  # type: ignore[no-any-return]


async def test_a_mode_set_before_the_kill_is_the_sessions_after_it(
        tmp_path: Path, store_name: str) -> None:
    child = ServeProcess(tmp_path, *_flags(tmp_path, store_name), *_agent("--modes")).start()
    try:
        async with ws_connect(child.base_url, "/acp") as ws:
            await _acp_call(ws, 1, "initialize", {"protocolVersion": 1})
            made = await _acp_call(ws, 2, "session/new", {"cwd": str(tmp_path),
                                                          "mcpServers": []})
            sid = made["sessionId"]
            assert made["modes"]["currentModeId"] == "ask"
            assert await _acp_call(ws, 3, "session/set_mode",
                                   {"sessionId": sid, "modeId": "code"}) == {}
            child.kill()   # at once after the answer: acknowledged
        child.start()
        async with httpx.AsyncClient(base_url=child.base_url, timeout=10) as client:
            loaded = (await client.post(f"/session/{sid}/load", json={})).json()
            assert loaded["state"]["modes"]["currentModeId"] == "code", loaded["state"]
            asked = (await client.post(f"/session/{sid}/prompt", json=_prompt("mode"))).json()
            done = await read_events(client, sid, _is("turn_complete", asked["promptId"]),
                                     last_event_id=loaded["lastEventId"])
            said = [e["data"]["update"]["content"]["text"] for e in done
                    if e["type"] == "session_update"
                    and e["data"]["update"]["sessionUpdate"] == "agent_message_chunk"]
            assert said == ["mode: code"]
    finally:
        child.stop()


async def test_a_mode_set_through_rest_before_the_kill_is_kept_too(
        tmp_path: Path, store_name: str) -> None:
    """qwen's ``POST /session/{id}/approval-mode`` keeps what it set as ``/acp``'s
    ``session/set_mode`` does (one path for every door's setters), and its
    ``approval_mode_changed`` event, committed before the answer, is replayed after
    the kill."""
    child = ServeProcess(tmp_path, *_flags(tmp_path, store_name), *_agent("--modes")).start()
    try:
        async with httpx.AsyncClient(base_url=child.base_url, timeout=10) as client:
            sid = (await client.post("/session", json={"cwd": str(tmp_path)})).json()["sessionId"]
            answer = await client.post(f"/session/{sid}/approval-mode", json={"mode": "code"})
            assert answer.status_code == 200, answer.text
            assert answer.json()["previous"] == "ask"
        child.kill()   # at once after the answer: acknowledged
        child.start()
        async with httpx.AsyncClient(base_url=child.base_url, timeout=10) as client:
            loaded = (await client.post(f"/session/{sid}/load", json={})).json()
            assert loaded["state"]["modes"]["currentModeId"] == "code", loaded["state"]
            seen = await read_events(client, sid,
                                     lambda e: e["type"] == "approval_mode_changed",
                                     last_event_id=0)
            assert seen[-1]["data"] == {"sessionId": sid, "previous": "ask", "next": "code",
                                        "persisted": False}
    finally:
        child.stop()
