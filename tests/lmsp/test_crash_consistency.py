"""Seeded crash consistency of LMSP tasks and background responses: a real ``acp-server
serve`` on SQLite and on PostgreSQL runs a workload the seed picks, is killed with
SIGKILL after the seed's number of operations (maybe with one more request in flight:
a create, a burst of 2 to 6 concurrent creates, a cancel or a delete), and is started
again on the same port and store; then every promise of docs/lmsp.md (Durability,
Restarts, Idempotency, Events, Background mode) is checked at once. The second test
runs the same workloads with a long task always running at the first kill and kills
the restarted server again during its recovery, at the seed's moment: right after its
listening line, or once it has answered the seed's number of requests (never a time);
a third start then recovers what the two left::

    pytest tests/lmsp/test_crash_consistency.py                             # CI's seeds
    ACP_LMSP_CRASH_SEEDS=200 pytest tests/lmsp/test_crash_consistency.py    # seeds 0..199
    ACP_LMSP_CRASH_SEEDS=200:400 pytest tests/lmsp/test_crash_consistency.py  # 200..399
    ACP_LMSP_CRASH_SEED=1234 pytest tests/lmsp/test_crash_consistency.py    # replay one

The workload and its model are in ``crash_workload.py``. The kill point is a count of
operations, never a time: before the kill every task is in the state the model predicts
(finished, running or queued, FIFO into ``SLOTS`` slots). Three subscribers that read a
running long task's stream up to its ``response.in_progress`` (``follow_mid_stream``:
its events, twice, and its response's stream) and every other subscriber are resumed
live from their last cursor at every start (``resume_readers``: ``Last-Event-ID`` or
``starting_after``). A server killed during
its recovery is checked on each listing it answers (``check_recovering``: recovery ran
before it listened, it claims in creation order and nothing past what it may claim,
``mark_claimable``; an end it shows is kept). After the last restart the test settles
the request in flight (``settle_flight``: it went through whole, or not at all; each
create of a burst on its own, its task found by its unique text), replays every
``Idempotency-Key`` (``check_replays``), then drives what was left: a task running at
the first kill under ``fail`` ends ``failed`` (``server_restarted``) once; under
``retry`` it runs again (a second ``response.in_progress``, a third if the recovering
server ran it when killed); queued ones are claimed in creation order (``check_fifo``,
on each listing) and run: a short one ends ``succeeded``, a long one is cancelled once
running (a task that may have been claimed before a kill, by a cancel in flight that
freed a slot or by the recovering server, is ``maybe_claimed``: its restart rule
applies, or it runs now). Then, one checker each: every acknowledged task exists in its
expected state, a finished one unchanged, a deleted one gone (``check_tasks``); the
listing holds exactly those, plus at most one per create in flight
(``check_listing``); every task's events are numbered from 0 without a gap and end
with the event of its status, once (``check_events``); every subscriber got exactly the
events of its task across its connections, none lost, none twice, up to the terminal
event, and 204 from there (``check_readers``); nothing answered 5xx
(``check_no_5xx``). A failure names the seed and the operations.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx
import pytest

from tests.harness import ServeProcess, free_port
from tests.harness.seeds import seeds
from tests.lmsp import stores
from tests.lmsp.crash_workload import (
    API,
    SLOTS,
    TERMINAL,
    WAIT_S,
    Answer,
    InFlight,
    Model,
    Reader,
    Task,
    Workload,
)

pytestmark = pytest.mark.anyio

# CI's seeds (about 2 s each): 5 a burst of 2 creates in flight (one keyed, retried
# after the restart), two subscribers, ``retry`` tasks running and queued at the kill;
# 96 a cancel in flight answered before the kill, a subscriber; 105 subscribers, one of
# them on the task whose DELETE is in flight.
CI_SEEDS = (5, 96, 105)
# Killed again during its recovery, CI's seed: 3 three subscribers mid-way through a
# ``retry`` task running at the first kill, a create in flight; the restarted server,
# killed after 8 answers, was running the task again (so it runs a third time).
CI_RECOVERY_SEEDS = (3,)


def _seeds(ci_seeds: tuple[int, ...] = CI_SEEDS) -> list[int]:
    return seeds("ACP_LMSP_CRASH", ci_seeds)


# Each seed on one client backend (asyncio for even seeds, trio for odd): the server is
# its own process either way.
@pytest.mark.parametrize(("seed", "anyio_backend"), [
    pytest.param(seed, ("asyncio", "trio")[seed % 2], id=f"seed{seed}") for seed in _seeds()])
async def test_a_seeded_lmsp_workload_survives_kill_9(tmp_path: Path, store_name: str,
                                                      seed: int) -> None:
    await _seeded(tmp_path, store_name, seed, recovery_kill=False)


# The same workloads (a long task always running at the first kill, three subscribers
# mid-way through its stream), then the server killed again during its recovery.
@pytest.mark.parametrize(("seed", "anyio_backend"), [
    pytest.param(seed, ("asyncio", "trio")[seed % 2], id=f"seed{seed}")
    for seed in _seeds(CI_RECOVERY_SEEDS)])
async def test_a_seeded_lmsp_workload_survives_kill_9_during_its_recovery(
        tmp_path: Path, store_name: str, seed: int) -> None:
    await _seeded(tmp_path, store_name, seed, recovery_kill=True)


async def _seeded(tmp_path: Path, store_name: str, seed: int, recovery_kill: bool) -> None:
    model = Model()
    try:
        await _crash_and_check(tmp_path, store_name, seed, model, recovery_kill)
        if os.environ.get("ACP_LMSP_CRASH_VERBOSE"):   # the operations of a passing seed
            print(f"seed {seed} on {store_name}:\n  " + "\n  ".join(model.log))
    except BaseException as exc:
        ops = "\n  ".join(model.log)
        raise AssertionError(f"seed {seed} on {store_name} (replay: ACP_LMSP_CRASH_SEED="
                             f"{seed}) failed: {exc!r}\noperations:\n  {ops}") from exc


def _flags(tmp_path: Path, store_name: str) -> list[str]:
    flags = ["--port", str(free_port()), "--max-running-tasks", str(SLOTS)]
    if store_name == "postgres":
        return [*flags, "--store", stores.postgres_url_for(tmp_path, "crash"),
                *stores.lease_flags()]
    return [*flags, "--store", f"sqlite:///{tmp_path / 'lmsp.db'}"]


async def _crash_and_check(tmp_path: Path, store_name: str, seed: int, model: Model,
                           recovery_kill: bool) -> None:
    rng = random.Random(seed)
    child = ServeProcess(tmp_path, *_flags(tmp_path, store_name))
    await anyio.to_thread.run_sync(child.start)
    try:
        async with Workload(model, child.base_url, rng) as work:
            await work.run(rng.randint(3, 14))
            await work.follow_mid_stream(ensure=recovery_kill)
            await work.start_in_flight()
            await _kill(child, model)
        if recovery_kill:
            await _killed_during_recovery(child, model, random.Random(f"recovery {seed}"))
        await anyio.to_thread.run_sync(child.start)
        async with Workload(model, child.base_url, rng) as after:
            resume_readers(after, model)   # live, as the server recovers
            await _after_restart(after, model)
    finally:
        await anyio.to_thread.run_sync(child.stop)


async def _kill(child: ServeProcess, model: Model) -> None:
    """SIGKILL, then every subscriber's stream has seen it (or its task's end)."""
    model.kills += 1
    model.log.append("kill -9")
    await anyio.to_thread.run_sync(child.kill)
    await _readers_ended(model)


async def _readers_ended(model: Model) -> None:
    with anyio.fail_after(WAIT_S):
        for reader in model.readers:
            while not reader.ended:
                await anyio.sleep(0.01)


def resume_readers(work: Workload, model: Model) -> None:
    """Every subscriber again from its last cursor: its own form, else header and query
    by turns."""
    for index, reader in enumerate(model.readers):
        by_query = reader.by_query if reader.by_query is not None else index % 2 == 1
        work.subscribe(reader.task_id, reader.name, reader, reader.last_id(), by_query)


async def _killed_during_recovery(child: ServeProcess, model: Model,
                                  rng: random.Random) -> None:
    """Started again and killed again at the seed's moment of its recovery: right after
    its listening line, or once it has answered the seed's number of requests (the
    subscribers resumed live from their cursors; listings, each checked as it comes by
    ``check_recovering``). What it may have claimed before that kill is
    ``maybe_claimed`` (``mark_claimable``)."""
    mark_claimable(model)
    answers = rng.choice((0, 0, *range(1, 13)))
    model.log.append(f"start, then kill -9 after {answers} answers")
    await anyio.to_thread.run_sync(child.start)
    if answers == 0:
        await _kill(child, model)
        return
    killed, count = anyio.Event(), [0]

    def on_answer() -> None:   # at once, before any other answer is looked at
        count[0] += 1
        if count[0] == answers:
            assert child.process is not None
            child.process.kill()
            killed.set()

    async with Workload(model, child.base_url, rng, on_answer) as work:
        resume_readers(work, model)
        with anyio.fail_after(WAIT_S):
            async with anyio.create_task_group() as tg:
                tg.start_soon(_observe_recovery, work, model, killed)
                await killed.wait()
        await _kill(child, model)   # reaped; the streams have ended


async def _observe_recovery(work: Workload, model: Model, killed: anyio.Event) -> None:
    """Listings until the kill, each checked; the statuses it saw change, logged."""
    seen: dict[str, str] = {}
    try:
        while not killed.is_set():
            listed = await work.listed()
            check_recovering(listed, model)
            for task in model.in_state("queued", "running"):
                status = listed[task.task_id]["status"]
                if seen.get(task.task_id) != status:
                    model.log.append(f"  (recovering: {task.task_id} {status})")
                seen[task.task_id] = status
            await anyio.sleep(0.02)
    except httpx.TransportError:
        pass   # the kill


def _uncertain(model: Model) -> set[str]:
    """Tasks whose state at the first kill the request in flight leaves open: a
    cancel's task, and if it was running, the queued ones up to a long one (as
    ``settle_flight`` marks them)."""
    flight = model.in_flight
    if flight is None or flight.task is None or flight.op != "cancel":
        return set()
    uncertain = {flight.task.task_id}
    if flight.task.state == "running":
        uncertain.update(t.task_id for t in _next_claims(model))
    return uncertain


def _next_claims(model: Model) -> list[Task]:
    """What one slot freed may claim: the queued tasks up to a long one (each short
    one ends and frees it again)."""
    claims = []
    for queued in model.in_state("queued"):
        claims.append(queued)
        if queued.kind == "long":
            break
    return claims


def mark_claimable(model: Model) -> None:
    """What a restarted server may claim before it is killed again: the unfinished
    tasks in creation order (a ``retry`` one running at the kill is queued again, a
    ``fail`` one has failed) up to the ``SLOTS``-th long one sure to be queued (a long
    task runs until cancelled; a short one frees its slot). Those queued at the kill
    become ``maybe_claimed``; the rest stay queued until the next start."""
    uncertain, longs = _uncertain(model), 0
    for task in model.in_state("queued", "running"):
        if longs == SLOTS:
            return
        if task.state == "running" and task.policy == "fail":
            continue
        if task.state == "queued":
            task.maybe_claimed = True
        if task.kind == "long" and task.task_id not in uncertain:
            longs += 1


def check_recovering(listed: dict[str, dict[str, Any]], model: Model) -> None:
    """A listing of the restarted server before its second kill: recovery ran before
    it listened (a ``fail`` task running at the kill has failed, a ``retry`` one is
    queued or running again); every task it may not claim yet is queued, claims in
    creation order; an end it shows is remembered (``ended_seen``)."""
    uncertain = _uncertain(model)
    for task in model.in_state("queued", "running"):
        status = listed[task.task_id]["status"]
        if task.task_id in uncertain:
            pass
        elif task.state == "running":
            allowed = {"failed"} if task.policy == "fail" else {"queued", "loading", "running"}
            assert status in allowed, (f"{task.task_id} running at the kill, {task.policy}: "
                                       f"{status}")
        elif not task.maybe_claimed:
            assert status == "queued", f"{task.task_id} claimed past its turn: {status}"
        if status in TERMINAL:
            assert task.ended_seen in (None, status), (task, status)
            task.ended_seen = status
    check_fifo(listed, [t for t in model.in_state("queued") if t.task_id not in uncertain])


async def _after_restart(work: Workload, model: Model) -> None:
    extras = await settle_flight(work, model)
    await check_replays(work, model)
    await drive(work, model)
    for extra in extras:   # a create in flight, taken: it runs (or failed, if running)
        final = await work.until(extra.task_id, TERMINAL, "the in-flight task ended")
        assert final["status"] == "succeeded" or (
            final["status"] == "failed" and final["error"]["code"] == "server_restarted"), final
        extra.final, extra.state = final, final["status"]
    await check_tasks(work, model)
    await check_listing(work, model)
    await check_events(work, model)
    await check_readers(work, model)
    check_no_5xx(model.answers)


async def settle_flight(work: Workload, model: Model) -> list[Task]:
    """The request in flight at the kill went through whole or not at all: a create
    (each of a burst's) made one task or none (its key, replayed, answers that one or
    makes it; nothing else is listed), a cancel left the task cancelled or as it was, a
    delete left it gone or as it was. An answer that came (2xx) means it went through.
    The tasks the creates made, into the model (``state="flight"``)."""
    flight = model.in_flight
    if flight is None:
        return []
    if flight.creates:
        return await _settle_creates(work, model, flight.creates)
    task = flight.task
    assert task is not None
    answer = await work.client.get(f"{API}/tasks/{task.task_id}")
    if flight.op == "delete":
        if answer.status_code == 404:
            task.state = "deleted"
            model.log.append("  (the delete went through)")
        else:
            assert not flight.answered(200), "an answered delete did not hold"
            assert answer.status_code == 200 and answer.json() == task.final, answer.text
            model.log.append("  (the delete did not go through)")
        return []
    status = answer.json()["status"]
    if status in ("cancelling", "cancelled"):
        task.final = await work.until(task.task_id, TERMINAL, "the cancel in flight")
        assert task.final["status"] == "cancelled", task.final
        if task.state == "running":   # its slot was free before the kill
            for queued in _next_claims(model):
                queued.maybe_claimed = True
        task.state = "cancelled"
        model.log.append("  (the cancel went through)")
    else:
        assert not flight.answered(200), f"an answered cancel did not hold: {status}"
        model.log.append("  (the cancel did not go through)")
    return []


def _text(body: dict[str, Any]) -> str:
    return body["input"] if isinstance(body["input"], str) else body["input"]["input"]


async def _settle_creates(work: Workload, model: Model, creates: list[InFlight]
                          ) -> list[Task]:
    """Each create in flight made at most one task (found by its text, unique), an
    answered one made one, and its key retried answers that one (replayed) or makes it."""
    by_text = {_text(c.body or {}): c for c in creates}
    made: dict[int, str] = {}   # index in creates -> task id

    async def extras() -> dict[str, dict[str, Any]]:
        return {k: v for k, v in (await work.listed()).items() if k not in model.tasks}

    for task_id, listed in (await extras()).items():
        create = by_text.get(listed["input_text"])
        assert create is not None, f"a task no request made: {listed}"
        index = creates.index(create)
        assert index not in made, f"one create made two tasks: {made[index]}, {task_id}"
        made[index] = task_id
    ids = {}
    for index, create in enumerate(creates):
        if create.answered(200, 202):
            assert index in made, f"an answered in-flight create was lost: {create.answer}"
        if create.key is None:
            continue
        path = f"{API}/responses" if create.via == "response" else f"{API}/tasks"
        answer = await work.client.post(path, json=create.body,
                                        headers={"Idempotency-Key": create.key})
        assert answer.status_code in (200, 202), answer.text
        replayed = answer.headers.get("idempotent-replayed") == "true"
        assert replayed == (index in made), (made, index, answer.headers)
        ids[index] = answer.json()["id"]
        model.log.append(f"  (retried key {create.key}: replayed={replayed})")
    listed = await extras()
    for index, answered_id in ids.items():   # the retries' tasks, made or found
        task_id = next(k for k, v in listed.items() if answered_id in (k, v["response_id"]))
        assert made.setdefault(index, task_id) == task_id, (index, made, task_id)
    assert set(listed) == set(made.values()), (sorted(listed), made)
    tasks = []
    for index, task_id in sorted(made.items()):
        create = creates[index]
        task = Task(task_id, listed[task_id]["response_id"], "short", "fail", create.via,
                    create.body or {}, create.key, state="flight")
        model.tasks[task_id] = task
        tasks.append(task)
        model.log.append(f"  (create {index} went through: {task_id})")
    if not made:
        model.log.append("  (no create went through)")
    return tasks


async def check_replays(work: Workload, model: Model) -> None:
    """Every keyed create, replayed after the restart: the same task, marked replayed."""
    for task in model.tasks.values():
        if task.key is not None and task.state not in ("deleted", "flight"):
            await work.replay(task)


def _in_progress(seen: list[tuple[int, str, dict[str, Any]]]) -> int:
    return sum(1 for _, event, _ in seen if event == "response.in_progress")


async def drive(work: Workload, model: Model) -> None:
    """What the kill left unfinished, to its end by the documented rules."""
    running = model.in_state("running")
    for task in running:
        task.running_at_kill = True
        if task.policy == "fail":
            final = await work.until(task.task_id, TERMINAL, "the restart policy")
            assert final["status"] == "failed", final
            assert final["error"]["code"] == "server_restarted", final
            task.final, task.state = final, "failed"
    retried = {t.task_id for t in running if t.policy == "retry"}
    queue = [t for t in model.tasks.values()
             if t.state == "queued" or t.task_id in retried]   # creation order
    while queue:
        head = queue[0]
        if head.maybe_claimed:
            final = await _drive_maybe_claimed(work, head)
        elif head.kind == "short":
            final = await work.until(head.task_id, TERMINAL, "a queued short task ran")
            assert final["status"] == "succeeded", final
        else:
            follower = work.subscribe(head.task_id, f"follower of {head.task_id}")
            model.readers.remove(follower)
            runs = 2 if head.task_id in retried else 1
            await work.reader_at(follower, lambda seen, n=runs: _in_progress(seen) >= n,
                                 f"run {runs} of {head.task_id}")
            check_fifo(await work.listed(), [t for t in queue if t.task_id not in retried
                                             and not t.maybe_claimed])
            answer = await work.client.post(f"{API}/tasks/{head.task_id}/cancel")
            assert answer.status_code == 200, answer.text
            final = await work.until(head.task_id, TERMINAL, "its cancel after the restart")
            assert final["status"] == "cancelled", final
        head.final, head.state = final, final["status"]
        model.log.append(f"  (after the restart {head.task_id} {final['status']})")
        queue.pop(0)


async def _drive_maybe_claimed(work: Workload, task: Task) -> dict[str, Any]:
    """A task a cancel in flight may have let be claimed before the kill: claimed, it
    ended (short), or the restart rule applied (``fail``: failed ``server_restarted``);
    else it runs now, like any queued one (a long one is cancelled once running)."""
    restarted = {"succeeded"} if task.kind == "short" else set()
    if task.policy == "fail":
        restarted.add("failed")
    want = TERMINAL if task.kind == "short" else TERMINAL | {"running"}
    got = await work.until(task.task_id, want, "a task maybe claimed before the kill")
    if got["status"] == "running":
        answer = await work.client.post(f"{API}/tasks/{task.task_id}/cancel")
        assert answer.status_code == 200, answer.text
        got = await work.until(task.task_id, TERMINAL, "its cancel after the restart")
        assert got["status"] == "cancelled", got
    else:
        assert got["status"] in restarted, got
        if got["status"] == "failed":
            assert got["error"]["code"] == "server_restarted", got
    return got


def check_fifo(listed: dict[str, dict[str, Any]], queue: list[Task]) -> None:
    """Claims in creation order: no task still queued is older than one claimed."""
    statuses = [listed[t.task_id]["status"] for t in queue]
    if "queued" in statuses:
        later = statuses[statuses.index("queued"):]
        assert set(later) == {"queued"}, f"claimed out of order: {statuses}"


def check_no_5xx(answers: list[Answer]) -> None:
    failed = [a for a in answers if a.status >= 500]
    assert not failed, f"5xx answers: {failed}"


async def check_tasks(work: Workload, model: Model) -> None:
    """Every acknowledged task in its expected state; one finished before the kill is
    as it was (its result kept); a deleted one is gone, as task and as response."""
    for task in model.tasks.values():
        got = await work.client.get(f"{API}/tasks/{task.task_id}")
        response = await work.client.get(f"{API}/responses/{task.response_id}")
        if task.state == "deleted":
            assert (got.status_code, response.status_code) == (404, 404), task
            continue
        assert got.status_code == 200 and response.status_code == 200, (got.text,
                                                                         response.text)
        assert got.json() == task.final, (got.json(), task.final)
        want = {"succeeded": "completed", "failed": "failed", "cancelled": "cancelled"}
        assert response.json()["status"] == want[task.state], response.json()
        assert task.ended_seen in (None, task.state), (
            f"{task.task_id} ended {task.ended_seen}, then {task.state}")
        if task.state == "succeeded":
            assert response.json() == got.json()["response"], response.json()


async def check_listing(work: Workload, model: Model) -> None:
    """The listing holds every acknowledged task not deleted, and nothing else (the
    in-flight create's task, when it went through, is in ``model.tasks``)."""
    listed = await work.listed()
    kept = {t.task_id for t in model.tasks.values() if t.state != "deleted"}
    assert set(listed) == kept, (sorted(set(listed) - kept), sorted(kept - set(listed)))
    for task_id in kept:
        assert listed[task_id]["status"] == model.tasks[task_id].state, listed[task_id]


_LAST = {"succeeded": "response.completed", "failed": "response.failed",
         "cancelled": "response.cancelled"}


async def check_events(work: Workload, model: Model) -> None:
    """Numbered 0..n-1, ``response.created`` first, the terminal event of its status
    last and once; one ``response.in_progress`` per attempt that ran: a ``fail`` task
    has at most one (one if running at the first kill), a ``retry`` one running at the
    first kill two (three when the restarted server was killed again as it ran it)."""
    for task in model.tasks.values():
        if task.state == "deleted":
            continue
        frames = await work.full_read(task.task_id)
        assert [f[0] for f in frames] == list(range(len(frames))), frames
        assert [f[2]["sequence_number"] for f in frames] == [f[0] for f in frames]
        events = [f[1] for f in frames]
        assert events[0] == "response.created" and events[-1] == _LAST[task.state], events
        assert sum(e in _LAST.values() for e in events) == 1, events
        runs = _in_progress(frames)   # none if it ended before running (while loading)
        if task.running_at_kill and task.policy == "fail":
            assert runs == 1, events
        elif task.running_at_kill:   # exactly one more, or two with a second kill
            assert 2 <= runs <= min(1 + model.kills, 3), events
        elif task.policy == "fail":
            assert runs <= 1, events


async def check_readers(work: Workload, model: Model) -> None:
    """Each subscriber of before the kill, resumed live from its last cursor at every
    start (``resume_readers``), got exactly the events of its task, none lost, none
    twice, up to the terminal event; resumed once more from there: 204 (404 once the
    task was deleted)."""
    await _readers_ended(model)   # at their tasks' ends
    resume_readers(work, model)
    await _readers_ended(model)
    for reader in model.readers:
        if model.tasks[reader.task_id].state == "deleted":
            assert reader.statuses[-1] == 404, reader.statuses
            continue
        assert set(reader.statuses) <= {200, 204}, f"{reader.name}: {reader.statuses}"
        assert reader.statuses[-1] == 204, f"{reader.name}: {reader.statuses}"
        _assert_exactly(reader, await work.full_read(reader.task_id))


def _assert_exactly(reader: Reader, full: list[tuple[int, str, dict[str, Any]]]) -> None:
    ids = [f[0] for f in reader.seen]
    assert ids == [f[0] for f in full], f"{reader.name}: ids {ids}, the store's {full}"
    assert reader.seen == full, f"{reader.name}: {reader.seen} != {full}"
