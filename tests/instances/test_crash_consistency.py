"""Seeded crash consistency of sessions across instances (issue #24): two or three real
``acp-server serve`` instances (the reference agent) on one PostgreSQL store behind a
real HAProxy run a workload the seed picks, through the balancer; at the seed's
moments one instance (the seed's: a session's owner or not) is killed with SIGKILL,
maybe with a prompt in flight, and started again later on the same port, state dir and
store. Then, every instance up and every queue drained, the promises of
docs/deployment.md and docs/rest.md are checked at once::

    pytest tests/instances/test_crash_consistency.py                          # CI's seeds
    ACP_FLEET_CRASH_SEEDS=40 pytest tests/instances/test_crash_consistency.py     # 0..39
    ACP_FLEET_CRASH_SEEDS=40:80 pytest tests/instances/test_crash_consistency.py  # 40..79
    ACP_FLEET_CRASH_SEED=12 pytest tests/instances/test_crash_consistency.py  # replay one

The seed also picks the fleet: 2 or 3 instances, ``--session-on-restart`` ``fail`` or
``continue``, and HAProxy's affinity (round robin, cookie, or the session id hashed).
The workload, the fleet and the model are in ``fleet_workload.py``. The kill points are
counts of operations, never times; what was running at a kill is not predicted, so
every checker holds whatever ran when:

* no session whose create was answered 200 is lost: every instance answers its status,
  lists it, and loads it under the epoch it was made with; no other session exists but
  one per create whose answer never came (``check_sessions``);
* every prompt answered 202 has exactly one terminal, in the stream and in ``/load``'s
  ``promptTerminals`` on every instance alike: ``completed``, ``cancelled``, or
  ``failed`` with ``server_restarted`` (the prompt running on an instance killed under
  it; ``continue``: it runs again); they end in the order they were accepted, as far
  as a client can know it (one whose 202 came before another was sent ends first; a
  prompt in flight at a kill, sent again, races the operations after it); a prompt
  whose answer was lost is sent again under its ``promptId`` until one comes, and
  still has exactly one terminal (200 once it has ended); one never answered within
  the wait has one terminal or none; no other prompt ends (``check_prompts``);
* every instance streams the same events, ids 1..N without a gap (``check_streams``);
* every reader, resumed by ``Last-Event-ID`` across kills and its own drops, saw
  exactly the events after its start, none twice, none missing, under the session's
  epoch, and no resync (``check_readers``);
* nothing answered 500 (or any 5xx but the documented 503s with their ``code`` in the
  door's shape); HAProxy answered only for a request out while an instance was killed
  (``check_no_5xx``).

A failure names the seed, the fleet and the operations. The client side only drives
child processes; each seed runs on one anyio backend (asyncio for even seeds, trio for
odd ones), so both are covered without paying for every seed twice.
"""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx
import pytest

from tests.harness.haproxy import SKIP, haproxy_binary
from tests.harness.seeds import seeds
from tests.instances.fleet_workload import (
    LOST,
    MOVING,
    REFUSED,
    SETTLING,
    WAIT_S,
    Answer,
    Fleet,
    Model,
    Workload,
    workspace_of,
)
from tests.lmsp import stores
from tests.store.test_crash_consistency import full_read

pytestmark = [pytest.mark.anyio, pytest.mark.slow,
              pytest.mark.skipif(haproxy_binary() is None, reason=SKIP),
              pytest.mark.skipif(not stores.postgres_dsn(), reason=stores.SKIP_POSTGRES)]

# CI's seeds (about 15 s each on a quiet machine).
CI_SEEDS = (0, 1, 2)


def _seeds() -> list[int]:
    return seeds("ACP_FLEET_CRASH", CI_SEEDS)


@pytest.mark.parametrize(("seed", "anyio_backend"), [
    pytest.param(seed, ("asyncio", "trio")[seed % 2], id=f"seed{seed}") for seed in _seeds()])
async def test_a_seeded_fleet_workload_survives_kill_9(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    count, policy = rng.choice((2, 3)), rng.choice(("fail", "continue"))
    affinity = rng.choice(("none", "cookie", "hash"))
    fleet = Fleet(tmp_path, stores.postgres_url_for(tmp_path, "fleet"), count, policy,
                  affinity)
    model = Model()
    try:
        await fleet.start()
        async with Workload(model, fleet, rng) as work:
            ops = rng.randint(8, 16)
            await work.run(ops, _kills(rng, ops, count))
            await work.drain()
            await _check(work, model, fleet, policy)
    except BaseException as exc:
        log = "\n  ".join(model.log)
        raise AssertionError(
            f"seed {seed} ({count} instances, --session-on-restart {policy}, affinity "
            f"{affinity}; replay: ACP_FLEET_CRASH_SEED={seed}) failed: {exc!r}\n"
            f"operations:\n  {log}") from exc
    finally:
        await anyio.to_thread.run_sync(fleet.stop)


def _kills(rng: random.Random, ops: int, count: int) -> list[tuple[int, int, int]]:
    """One to three kills ``(at, victim, back)``, one instance down at a time: back
    before the next kill (``back == ops``: at the drain)."""
    kills, at = [], rng.randint(1, ops // 2)
    for _ in range(rng.choice((1, 2, 3))):
        if at >= ops:
            break
        back = min(ops, at + rng.randint(1, 4))
        kills.append((at, rng.randrange(count), back))
        at = back + rng.randint(0, 2)
    return kills


async def _check(work: Workload, model: Model, fleet: Fleet, policy: str) -> None:
    fulls = await check_streams(fleet, model)
    await check_sessions(fleet, model)
    await check_prompts(fleet, model, fulls, policy)
    await check_readers(model, fulls)
    check_no_5xx(model.answers)


# -- reads on every instance directly ------------------------------------------------------
def _clients(fleet: Fleet) -> list[httpx.AsyncClient]:
    return [httpx.AsyncClient(base_url=c.base_url, timeout=WAIT_S) for c in fleet.children]


# -- the checkers ---------------------------------------------------------------------------
async def check_streams(fleet: Fleet, model: Model) -> dict[str, list[dict[str, Any]]]:
    """Every instance replays the same events of each session, ids 1..N, no resync."""
    fulls: dict[str, list[dict[str, Any]]] = {}
    clients = _clients(fleet)
    try:
        for session in model.sessions.values():
            reads = [await full_read(client, session.session_id, {"eventEpoch": session.epoch})
                     for client in clients]
            first = reads[0]
            ids = [e.get("id") for e in first]
            assert ids == list(range(1, len(ids) + 1)), f"{session.session_id}: ids {ids}"
            for n, other in enumerate(reads[1:], 1):
                assert other == first, (f"{session.session_id}: instance {n} streams "
                                        f"otherwise than instance 0")
            fulls[session.session_id] = first
    finally:
        for client in clients:
            await client.aclose()
    return fulls


async def check_sessions(fleet: Fleet, model: Model) -> None:
    """Every session answered 200 is live on every instance (status, listing, load
    under its epoch); nothing else is listed but what an unanswered create made."""
    workspace = workspace_of(fleet)
    clients = _clients(fleet)
    try:
        for n, client in enumerate(clients):
            for session in model.sessions.values():
                status = await client.get(f"/session/{session.session_id}/status")
                assert status.status_code == 200, (n, session.session_id, status.text)
                assert status.json()["eventEpoch"] == session.epoch, (n, status.json())
            listed: set[str] = set()
            with anyio.fail_after(WAIT_S):   # others' sessions: at most a poll behind
                while not set(model.sessions) <= listed:
                    response = await client.get(f"/workspace/{workspace}/sessions",
                                                params={"size": 100})
                    assert response.status_code == 200, response.text
                    listed = {s["sessionId"] for s in response.json()["sessions"]}
                    if not set(model.sessions) <= listed:
                        await anyio.sleep(0.1)
            extra = listed - set(model.sessions)
            assert len(extra) <= model.unknown_creates, (
                f"instance {n} lists sessions no answer made: {sorted(extra)}")
    finally:
        for client in clients:
            await client.aclose()


def _ends(full: list[dict[str, Any]]) -> list[tuple[str, str, str | None]]:
    """(promptId, type, stopReason or error code) of every turn end, in stream order."""
    return [(e["promptId"], e["type"], e["data"].get("stopReason") or e["data"].get("code"))
            for e in full if e["type"] in SETTLING]


def _texts(full: list[dict[str, Any]]) -> dict[str, str]:
    """Each prompt's text (its echo, the first ``user_message_chunk``) -> its id."""
    texts: dict[str, str] = {}
    for e in full:
        update = e["data"].get("update", {}) if e["type"] == "session_update" else {}
        if update.get("sessionUpdate") == "user_message_chunk":
            texts.setdefault(update["content"].get("text", ""), e["promptId"])
    return texts


_TERMINAL = {("turn_complete", "end_turn"): "completed",
             ("turn_complete", "cancelled"): "cancelled",
             ("turn_error", "server_restarted"): "failed"}


async def check_prompts(fleet: Fleet, model: Model, fulls: dict[str, list[dict[str, Any]]],
                        policy: str) -> None:
    """Each accepted prompt ends once, in acceptance order (a prompt answered before
    another was sent ends before it), as documented; the stream and ``promptTerminals``
    agree on every instance; a prompt whose answer never came (found by its text) ends
    once or never ran; no other prompt ends."""
    clients = _clients(fleet)
    try:
        for session in model.sessions.values():
            full = fulls[session.session_id]
            texts = _texts(full)
            known = {p.prompt_id for p in session.accepted()}
            for prompt in session.unknown():   # taken or not: its text says
                prompt.prompt_id = texts.get(prompt.text)
            maybe = {p.prompt_id for p in session.unknown() if p.prompt_id is not None}
            ends = _ends(full)
            ended = [pid for pid, _, _ in ends]
            assert len(ended) == len(set(ended)), f"a prompt ended twice: {ends}"
            assert set(ended) <= known | maybe, (
                f"prompts no 202 acknowledged ended: {set(ended) - known - maybe}")
            missing = known - set(ended)
            assert not missing, f"{session.session_id}: accepted prompts never ended: {missing}"
            by_id = {p.prompt_id: p for p in session.prompts if p.prompt_id in set(ended)}
            for before, after in itertools.combinations(ended, 2):   # acceptance order?
                first, second = by_id[before], by_id[after]
                assert second.answered is None or second.answered > first.sent, (
                    f"{session.session_id}: {after} ended after {before}, but its 202 came "
                    f"before {before} was sent: ended {ends}")
            kinds = {pid: _TERMINAL.get((kind, reason)) for pid, kind, reason in ends}
            odd = {pid: end for pid, end in zip(ended, ends) if kinds[pid] is None}
            assert not odd, f"{session.session_id}: undocumented ends {odd}"
            if policy == "continue":   # nothing fails: the interrupted turn runs again
                assert "failed" not in kinds.values(), ends
            for n, client in enumerate(clients):
                load = await client.post(f"/session/{session.session_id}/load", json={})
                assert load.status_code == 200, (n, load.text)
                body = load.json()
                assert body["eventEpoch"] == session.epoch, (n, body["eventEpoch"])
                terminals = [(t["promptId"], t["terminal"], t.get("errorCode"))
                             for t in body["promptTerminals"]]
                want = sorted((pid, kind, "server_restarted" if kind == "failed" else None)
                              for pid, kind in kinds.items())
                assert sorted(terminals) == want, (
                    f"instance {n}: promptTerminals {terminals} != the stream's {want}")
    finally:
        for client in clients:
            await client.aclose()


async def check_readers(model: Model, fulls: dict[str, list[dict[str, Any]]]) -> None:
    """Each reader caught up; across its connections it saw exactly the full read's
    events after its start, under the session's epoch, and no resync."""
    for reader in model.readers:
        full = fulls[reader.session_id]
        last = full[-1]["id"] if full else 0
        await reader.wait_for(lambda r=reader, n=last: r.last_id() >= n,
                              f"{reader.name} caught up")
        reader.stop()
        resyncs = [f for f in reader.frames if f["type"] == "state_resync_required"]
        assert not resyncs, f"{reader.name}: {resyncs}"
        epochs = {e for e in reader.epochs if e is not None}
        assert epochs <= {model.sessions[reader.session_id].epoch}, (reader.name, epochs)
        got = [e["id"] for e in reader.seen]
        want = [e["id"] for e in full if e["id"] > reader.start]
        assert got == want, f"{reader.name} (from {reader.start}): ids {got} != {want}"
        for mine, theirs in zip(reader.seen, [e for e in full if e["id"] > reader.start]):
            assert mine == theirs, f"{reader.name}: {mine} != {theirs}"


def check_no_5xx(answers: list[Answer]) -> None:
    """No instance answered 500 or any 5xx but a documented 503 in the REST door's
    shape; HAProxy answered only for a request out when an instance was killed."""
    for answer in answers:
        if answer.balancer:
            assert answer.spanned_kill, f"the balancer answered outside a kill: {answer}"
            continue
        if answer.status < 500:
            continue
        assert answer.status == 503, f"a {answer.status}: {answer}"
        body = json.loads(answer.body)
        assert set(body) >= {"error", "code"} and body["code"] in MOVING | REFUSED | LOST, answer
