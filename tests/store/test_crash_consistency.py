"""Seeded crash consistency of durable sessions (issue #23): a real ``acp-server serve``
on SQLite and on PostgreSQL runs a workload the seed picks, is killed with SIGKILL after
the seed's number of acknowledged operations (maybe with one more request in flight),
and is started again on the same state dir and database; then every promise of
docs/operations.md "What survives a restart" is checked at once::

    pytest tests/store/test_crash_consistency.py                       # CI's seeds per store
    ACP_CRASH_SEEDS=200 pytest tests/store/test_crash_consistency.py   # seeds 0..199 per store
    ACP_CRASH_SEEDS=200:400 pytest tests/store/test_crash_consistency.py   # seeds 200..399
    ACP_CRASH_SEED=1234 pytest tests/store/test_crash_consistency.py   # replay one seed

The workload and its model are in ``crash_workload.py``: create, attach the default
session, prompts (short ones that end, ``/sleep 60s`` and ``/permission`` ones that hold
the head of the queue until the kill), cancel, allow, drop a queued prompt, branch,
DELETE, and SSE readers that record every envelope and the epoch of each connection.
The kill point is a count of operations, never a time: before the kill every session is
in the stable state the model predicts, so what was settled, running and queued is known.
Every third seed runs under ``--session-on-restart continue`` (the running turn runs
again, its echo marked ``acp-server/continued``), the others under the default ``fail``.
Three seeds in five (``_with_acp``) add ``/acp`` operations over the WebSocket
(``crash_acp.py``: new, prompt, cancel, a permission answer, close, delete, a close
frame 1000, a prompt in flight; after the restart a load by cursor), agent deaths
(``/crash``: every session closed and kept) and a cancel, allow or drop as the request
in flight (``settle_flight``: it went through or not, nothing else moved). One seed in
four (``_write_behind``) runs under ``--session-write-behind`` (``crash_window.py``: a
session busy at the kill resyncs, a quiet one resumes exactly).

The invariants, one checker each: nothing answered 5xx (``check_no_5xx``); every
session whose create, attach or branch was answered exists and loads under its epoch, a
deleted one stays deleted, and no other session exists but the one a request in flight
may have made, whole (``check_sessions``); every accepted prompt is accounted for, in
its order: its pre-kill end, ``server_restarted`` for the one running (``continue``: it
runs again), queued ones run after the restart (``check_prompts``); every reader that
reconnects with ``Last-Event-ID`` and its epoch gets exactly the rest: its envelopes
are the fresh full read's, no gap, no duplicate, no resync (``check_readers``;
write-behind: ``check_window_readers``); the default session is the default again
(``check_default``); a session closed but kept (a close frame 1000, an agent death, an
idle timeout: ``_idle_flags``' seeds) is not live, and ``/load`` brings it back, a new
life with its conversation (``check_closed``); an ``/acp`` load by cursor gets only
what followed (``check_acp_loads``). A failure names the seed and the operations.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx
import pytest

from acp_server.rest.workspace import workspace_id
from tests.harness import ServeProcess
from tests.harness.seeds import seeds
from tests.store.crash_acp import AcpOps, check_acp_loads
from tests.store.crash_window import (
    check_window_readers,
    last_after_resync,
    pin_markers,
    resynced,
)
from tests.store.crash_workload import (
    WAIT_S,
    Answer,
    Model,
    Session,
    Workload,
    permission_request_id,
    prompt_body,
    settled_in,
    started_in,
)
from tests.store.test_session_restart import _flags
from tests.store.test_write_behind import _store_of

pytestmark = pytest.mark.anyio

# CI's seeds (about 3 s each): 20 and 21 (REST only) end with a DELETE in flight at the
# kill, the workload that found a 204 answered before the removal committed
# (test_delete_crash.py); 19 (--session-write-behind 3) has an /acp permission answer,
# /acp sessions and an agent death (its sessions reloaded after the restart); 27
# (--session-write-behind 1) a session busy at the kill (it resyncs) with an /acp prompt
# queued; 25 an idle-timeout close; 32 a cancel in flight at the kill.
CI_SEEDS = (19, 20, 21, 25, 27, 32)


def _seeds() -> list[int]:
    return seeds("ACP_CRASH", CI_SEEDS)


# Each seed runs on one client backend (asyncio for even seeds, trio for odd): both are
# covered without paying for every seed twice (the server is its own process either way).
@pytest.mark.parametrize(("seed", "anyio_backend"), [
    pytest.param(seed, ("asyncio", "trio")[seed % 2], id=f"seed{seed}") for seed in _seeds()])
async def test_a_seeded_workload_survives_kill_9(tmp_path: Path, store_name: str,
                                                 seed: int) -> None:
    model = Model(workspace_id(str(tmp_path)), policy=_policy(seed))
    try:
        await _crash_and_check(tmp_path, store_name, seed, model)
    except BaseException as exc:
        ops = "\n  ".join(model.log)
        raise AssertionError(f"seed {seed} on {store_name}, --session-on-restart "
                             f"{model.policy} (replay: ACP_CRASH_SEED={seed}) "
                             f"failed: {exc!r}\noperations:\n  {ops}") from exc


def _with_acp(seed: int) -> bool:
    """Whether a seed's workload has ``/acp`` operations too (three seeds in five; not
    0, 1, 20, 21, whose REST-only workloads CI keeps)."""
    return seed % 5 >= 2


def _idle_flags(seed: int) -> list[str]:
    """Seeds without ``/acp`` whose ``seed % 3 == 1`` (1, 10, 16, 25, …) run with a short
    idle timeout before the kill (idle closes join the choices), the default after."""
    if _with_acp(seed) or seed % 3 != 1:
        return []
    return ["--session-idle-timeout-ms", "1500", "--session-reap-interval-ms", "50"]


def _write_behind(seed: int) -> int:
    """The ``--session-write-behind`` window of a seed (one in four: 1, 3 or 64
    events), else 0."""
    return (1, 3, 64)[seed // 4 % 3] if seed % 4 == 3 else 0


def _policy(seed: int) -> str:
    """The restart policy a seed runs under (every third seed ``continue``), apart from
    its workload's random stream."""
    return "continue" if seed % 3 == 2 else "fail"


async def _crash_and_check(tmp_path: Path, store_name: str, seed: int, model: Model) -> None:
    rng = random.Random(seed)
    flags = _flags(tmp_path, store_name)
    model.window = _write_behind(seed)
    child = ServeProcess(tmp_path, *flags, "--session-on-restart", model.policy,
                         "--session-write-behind", str(model.window), *_idle_flags(seed))
    await anyio.to_thread.run_sync(child.start)
    try:
        async with Workload(model, child.base_url, rng) as work:
            acp = AcpOps(work, str(tmp_path)) if _with_acp(seed) else None
            work.extended = acp is not None
            work.idle = bool(_idle_flags(seed))
            if acp is not None:
                await acp.open()
                work.acp = acp
            await work.run(rng.randint(2, 14))
            if model.window:
                await pin_markers(model, _store_of(tmp_path, flags))
            flight = await work.start_in_flight()
            if model.window and flight is not None and flight.session_id in model.sessions:
                model.sessions[flight.session_id].marker = None   # it may set it
            await anyio.to_thread.run_sync(child.kill)
            with anyio.fail_after(WAIT_S):   # every stream saw the kill
                for reader in model.readers:
                    await reader.wait_for(lambda _, r=reader: r.ended, "the kill")
            for session in model.sessions.values():
                session.killed_at = model.primary(session.session_id).last_id()
        if _idle_flags(seed):   # a later flag wins: the default timeout after the restart
            child.flags = (*child.flags, "--session-idle-timeout-ms", "1800000")
        await anyio.to_thread.run_sync(child.start)
        async with Workload(model, child.base_url, rng) as after:
            fulls = await _after_restart(after, model)
            if acp is not None:
                await check_acp_loads(after, model, acp, fulls)
            await check_closed(after, model)
    finally:
        await anyio.to_thread.run_sync(child.stop)


async def _after_restart(work: Workload, model: Model) -> dict[str, list[dict[str, Any]]]:
    """Reconnect the readers, drive what was queued to its end, then check."""
    listed = await _listed(work.client, model.workspace)
    flight = model.in_flight
    await settle_flight(work, model)
    if flight is not None and flight.op == "delete" and flight.session_id in model.sessions \
            and (flight.answered(204) or flight.session_id not in listed):
        model.sessions[flight.session_id].deleted = True   # it went through
    live = model.live()
    for session in live:
        for reader in model.readers:
            if reader.session_id == session.session_id:
                work.resume(reader, epoch=session.epoch)
    for session in live:
        await _drive(work, model, session)
    loads: dict[str, dict[str, Any]] = {}
    fulls: dict[str, list[dict[str, Any]]] = {}
    for session_id in [*[s.session_id for s in live], *sorted(set(listed) - set(model.sessions))]:
        response = await work.client.post(f"/session/{session_id}/load", json={})
        assert response.status_code == 200, (session_id, response.text)
        loads[session_id] = response.json()
        fulls[session_id] = await full_read(work.client, session_id, loads[session_id])
    for session in live:
        if model.window and resynced(session, loads[session.session_id]):
            session.new_epoch = loads[session.session_id]["eventEpoch"]
    for reader in model.readers:
        if reader.session_id in loads:
            last = loads[reader.session_id]["lastEventId"]
            reached = (last_after_resync if model.sessions[reader.session_id].new_epoch
                       else lambda seen, r=reader: r.last_id())
            await reader.wait_for(lambda seen, f=reached, n=last: f(seen) >= n,
                                  f"{reader.name} reconnected up to {last}")
    check_sessions(model, listed, loads)
    for session in live:
        check_prompts(model, session, loads[session.session_id], fulls[session.session_id])
        if session.new_epoch is not None:
            check_window_readers(model, session, fulls[session.session_id], model.window,
                                 session.new_epoch)
        else:
            check_readers(model, session, fulls[session.session_id])
    await check_deleted(work.client, model)
    await check_extra_sessions_whole(work, model, set(listed) - set(model.sessions))
    await check_default(work.client, model)
    check_no_5xx(model.responses)
    return fulls


async def settle_flight(work: Workload, model: Model) -> None:
    """A cancel, allow or drop in flight at the kill either went through (its prompt's
    terminal, ``cancelled`` or ``completed``, is in ``/load``'s ``promptTerminals`` at
    once) or did not (the prompt is as the model had it: running at the kill, or
    queued: a short one may have run already, restored by that ``/load``). The docs promise neither, answered or not; nothing else moved (the
    prompt was its session's only one, or a queued one)."""
    flight = model.in_flight
    if flight is None or flight.prompt is None:
        return
    session = model.sessions[flight.session_id]
    loaded = await work.client.post(f"/session/{session.session_id}/load", json={})
    assert loaded.status_code == 200, loaded.text
    terminals = {t["promptId"]: t for t in loaded.json()["promptTerminals"]}
    terminal = terminals.get(flight.prompt.prompt_id)
    through = "completed" if flight.op == "allow" else "cancelled"
    if terminal is not None and terminal["terminal"] == through:
        flight.prompt.outcome = through
        session.settled.append(flight.prompt.prompt_id)
        model.log.append(f"  ({flight.op} went through)")
    else:   # the prompt running at the kill failed; a queued short one may have run
        ran = ("failed", "server_restarted") if flight.op != "drop" else ("completed", None)
        assert terminal is None or (terminal["terminal"], terminal.get("errorCode")) == ran, (
            terminal)


async def _drive(work: Workload, model: Model, session: Session) -> None:
    """The prompt running at the kill fails (``continue``: runs again); the queued ones
    run, in order: a long one is cancelled once it started, a permission is allowed once
    asked."""
    reader = model.primary(session.session_id)
    pending = session.pending()
    if pending and model.policy == "fail":
        await reader.wait_for(lambda seen: settled_in(seen, pending[0].prompt_id),
                              "the running prompt's end")
        pending = pending[1:]
    for prompt in pending:
        await reader.wait_for(lambda seen, p=prompt: started_in(seen, p, session.killed_at)
                              or settled_in(seen, p.prompt_id), f"{prompt.text} started")
        if prompt.kind == "long" and not settled_in(reader.seen, prompt.prompt_id):
            answer = await work.client.post(f"/session/{session.session_id}/cancel")
            assert answer.status_code == 204, answer.text
        elif prompt.kind == "perm" and not settled_in(reader.seen, prompt.prompt_id):
            request_id = permission_request_id(reader.seen, prompt.prompt_id)
            answer = await work.client.post(f"/permission/{request_id}", json={
                "outcome": {"outcome": "selected", "optionId": "allow_once"}})
            assert answer.status_code == 200, answer.text
        await reader.wait_for(lambda seen, p=prompt: settled_in(seen, p.prompt_id),
                              f"{prompt.text} ended")
    # A prompt in flight at the kill that the server took: a short one, it ends alone.
    flight = model.in_flight
    if flight is not None and flight.op == "prompt" and flight.session_id == session.session_id:
        queue = await work.client.get(f"/session/{session.session_id}/pending-prompts")
        for item in _pending_ids(queue.json()):
            await reader.wait_for(lambda seen, p=item: settled_in(seen, p), f"{item} ended")


def _pending_ids(body: Any) -> list[str]:
    items = body.get("pendingPrompts", body) if isinstance(body, dict) else body
    return [item["promptId"] for item in items]


async def _listed(client: httpx.AsyncClient, workspace: str) -> list[str]:
    response = await client.get(f"/workspace/{workspace}/sessions", params={"size": 100})
    assert response.status_code == 200, response.text
    body = response.json()
    assert "nextCursor" not in body or not body["nextCursor"], body   # one page holds them
    return [s["sessionId"] for s in body["sessions"]]


async def full_read(client: httpx.AsyncClient, session_id: str,
                    loaded: dict[str, Any]) -> list[dict[str, Any]]:
    """A new reader's whole replay from id 0 (up to ``replay_complete``)."""
    seen: list[dict[str, Any]] = []
    headers = {"Last-Event-ID": "0", "X-Qwen-Event-Epoch": loaded["eventEpoch"]}
    with anyio.fail_after(WAIT_S):
        async with client.stream("GET", f"/session/{session_id}/events",
                                 headers=headers) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    envelope = json.loads(line[len("data: "):])
                    if envelope["type"] == "replay_complete":
                        return seen
                    seen.append(envelope)
    raise AssertionError(f"the full read of {session_id} ended without replay_complete")


# -- the checkers -------------------------------------------------------------------------
def check_no_5xx(responses: list[Answer]) -> None:
    failed = [a for a in responses if a.status >= 500]
    assert not failed, f"5xx answers: {failed}"


def check_sessions(model: Model, listed: list[str], loads: dict[str, dict[str, Any]]) -> None:
    """Answered creates exist (listed, loadable, same epoch); deleted ones are gone; an
    unanswered one exists only if a create or branch was in flight, at most one."""
    flight = model.in_flight
    expected = {s.session_id for s in model.live()}   # an in-flight DELETE that went
    missing = expected - set(listed)                  # through is marked deleted
    assert not missing, f"acknowledged sessions lost: {sorted(missing)}"
    for session_id in expected & set(listed):
        if model.sessions[session_id].new_epoch is not None:
            continue   # write-behind: resynced, as its marker said (crash_window.py)
        assert loads[session_id]["eventEpoch"] == model.sessions[session_id].epoch, (
            f"{session_id}: epoch changed across the restart")
    deleted = {s.session_id for s in model.sessions.values() if s.deleted}
    assert not deleted & set(listed), f"deleted sessions came back: {deleted & set(listed)}"
    extra = set(listed) - set(model.sessions)
    creating = flight is not None and flight.op in ("create", "branch")
    assert len(extra) <= (1 if creating else 0), f"sessions no answer made: {sorted(extra)}"
    if creating and flight is not None and flight.answered(200, 201):
        assert flight.body["sessionId"] in listed, "an answered in-flight create was lost"


def _terminals(events: list[dict[str, Any]]) -> list[tuple[str, str, str | None]]:
    """(promptId, type, stopReason or error code) of every turn end, in stream order."""
    return [(e["promptId"], e["type"], e["data"].get("stopReason") or e["data"].get("code"))
            for e in events if e["type"] in ("turn_complete", "turn_error")]


def check_prompts(model: Model, session: Session, loaded: dict[str, Any],
                  full: list[dict[str, Any]]) -> None:
    """Every accepted prompt ended once, in order: those settled before the kill as they
    did, the running one with ``server_restarted``, the queued ones after the restart."""
    pending = session.pending()
    expected: list[tuple[str, str, str | None]] = []
    for prompt_id in session.settled:
        prompt = next(p for p in session.prompts if p.prompt_id == prompt_id)
        expected.append((prompt_id, "turn_complete",
                         "end_turn" if prompt.outcome == "completed" else "cancelled"))
    if pending and model.policy == "fail":
        expected.append((pending[0].prompt_id, "turn_error", "server_restarted"))
    for prompt in pending[1:] if model.policy == "fail" else pending:
        expected.append((prompt.prompt_id, "turn_complete",
                         "cancelled" if prompt.kind == "long" else "end_turn"))
    seen = _terminals(full)
    flight = model.in_flight
    if (flight is not None and flight.op == "prompt" and flight.session_id == session.session_id
            and seen[len(expected):]):
        # Taken before the kill: it ran after the others (or was running at the kill).
        assert len(seen) == len(expected) + 1, seen
        assert seen[-1][2] in ("end_turn", "server_restarted"), seen[-1]
        if flight.answered(202) or (flight.body or {}).get("via") == "acp":
            assert seen[-1][0] == flight.body["promptId"]
        seen = seen[:-1]
    elif flight is not None and flight.op == "prompt" and flight.answered(202) \
            and flight.session_id == session.session_id:
        raise AssertionError(f"the in-flight prompt answered 202 never ended: {flight.body}")
    assert seen == expected, f"{session.session_id}: turn ends {seen}, expected {expected}"
    terminals = {t["promptId"]: t for t in loaded["promptTerminals"]}
    for prompt_id, kind, reason in expected:
        terminal = terminals.get(prompt_id)
        assert terminal is not None, f"{prompt_id} has no entry in promptTerminals"
        want = {"end_turn": "completed", "cancelled": "cancelled",
                "server_restarted": "failed"}[reason or ""]
        assert terminal["terminal"] == want, (prompt_id, terminal, want)
        if want == "failed":
            assert terminal["errorCode"] == "server_restarted", terminal
    if pending and pending[0].kind == "perm":   # the ask open at the kill: cancelled
        asked = [e for e in full if e["type"] == "permission_request"
                 and e.get("promptId") == pending[0].prompt_id]
        request_id = asked[0]["data"]["requestId"]
        resolved = [e["data"] for e in full if e["type"] == "permission_resolved"
                    and e["data"]["requestId"] == request_id]
        assert [(r["outcome"], r.get("reason")) for r in resolved] == [
            ({"outcome": "cancelled"}, "server_restarted")], resolved
    if pending and model.policy == "continue":   # the interrupted turn's echo is marked
        echoes = [e["data"]["update"] for e in full if e["type"] == "session_update"
                  and e.get("promptId") == pending[0].prompt_id
                  and e["id"] > session.killed_at
                  and e["data"]["update"]["sessionUpdate"] == "user_message_chunk"]
        assert [u["_meta"].get("acp-server/continued") for u in echoes] == [
            {"reason": "server_restarted"}], echoes


def _with_ids(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e.get("id") is not None]


def check_readers(model: Model, session: Session, full: list[dict[str, Any]]) -> None:
    """Ids 1..N without a gap; each reader, across its connections, saw exactly the
    full read's envelopes, under the session's one epoch, and no resync."""
    ids = [e["id"] for e in _with_ids(full)]
    assert ids == list(range(1, len(ids) + 1)), f"{session.session_id}: ids {ids}"
    for reader in model.readers:
        if reader.session_id != session.session_id:
            continue
        resyncs = [e for e in reader.seen if e["type"] == "state_resync_required"]
        assert not resyncs, f"{reader.name}: {resyncs}"
        assert set(reader.epochs) == {session.epoch}, f"{reader.name}: epochs {reader.epochs}"
        got = _with_ids(reader.seen)
        got_ids = [e["id"] for e in got]
        assert got_ids == ids, f"{reader.name}: ids {got_ids} != the full read's {ids}"
        for mine, theirs in zip(got, _with_ids(full)):
            assert mine == theirs, f"{reader.name}: {mine} != {theirs}"


async def check_deleted(client: httpx.AsyncClient, model: Model) -> None:
    """A session whose DELETE was answered is gone: no status, no load."""
    for session in model.sessions.values():
        if session.deleted:
            status = await client.get(f"/session/{session.session_id}/status")
            assert status.status_code == 404, (session.session_id, status.text)
            load = await client.post(f"/session/{session.session_id}/load", json={})
            assert load.status_code == 404, (session.session_id, load.text)


async def check_closed(work: Workload, model: Model) -> None:
    """A session closed before the kill otherwise than by a deletion (its ``/acp``
    connection's close frame 1000) is not live after the restart, and ``POST
    /session/{id}/load`` brings it back: a new life (new epoch, ids from 1) that starts
    with the closed life's conversation, its ``session_update``s as they were."""
    for session in model.sessions.values():
        if not session.closed or session.deleted:
            continue
        sid = session.session_id
        status = await work.client.get(f"/session/{sid}/status")
        assert status.status_code == 404, (sid, status.text)
        load = await work.client.post(f"/session/{sid}/load", json={})
        assert load.status_code == 200, (sid, load.text)
        body = load.json()
        assert body["eventEpoch"] != session.epoch, (sid, "the new life kept the epoch")
        full = await full_read(work.client, sid, body)
        ids = [e["id"] for e in _with_ids(full)]
        assert ids == list(range(1, len(ids) + 1)), f"{sid}: the new life's ids {ids}"
        before = [e["data"]["update"] for e in model.primary(sid).seen
                  if e["type"] == "session_update"]
        after = [e["data"]["update"] for e in full if e["type"] == "session_update"]
        assert after == before, f"{sid}: the conversation {after} != the closed life's {before}"


async def check_extra_sessions_whole(work: Workload, model: Model, extra: set[str]) -> None:
    """A session made by the request in flight is whole: it loaded, and takes a prompt."""
    for session_id in extra:
        reader = work.add_reader(session_id)
        answer = await work.client.post(f"/session/{session_id}/prompt",
                                        json=prompt_body("/chunks 1 whole?"))
        assert answer.status_code == 202, answer.text
        prompt_id = answer.json()["promptId"]
        await reader.wait_for(lambda seen: settled_in(seen, prompt_id), "its prompt ended")
        assert _terminals(reader.seen)[-1] == (prompt_id, "turn_complete", "end_turn")


async def check_default(client: httpx.AsyncClient, model: Model) -> None:
    """The default session (if one was made and not deleted) is still the default."""
    default = model.sessions.get(model.default) if model.default else None
    if default is None or default.deleted or default.closed:
        return   # (a closed default: the docs do not say which session is the default)
    body = (await client.post("/session", json={})).json()
    assert (body["sessionId"], body["attached"]) == (default.session_id, True), body
