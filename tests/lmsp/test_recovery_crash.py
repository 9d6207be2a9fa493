"""LMSP start-up recovery killed while its store is locked, with real processes: a real
``acp-server serve`` (SQLite and PostgreSQL) holds tasks finished, running (``/sleep``,
``on_restart`` ``fail`` and ``retry``) and queued (one with an ``Idempotency-Key``), with
subscribers part-way through their streams; it is killed with SIGKILL; the next start
finds the store locked by the test and is killed again while it waits:

* PostgreSQL: the test holds ``LOCK TABLE task_events IN EXCLUSIVE MODE`` (writes
  wait, reads do not), so the recovery runs until its first event insert: it has
  selected and locked its rows and updated a task (its backend holds ``RowExclusiveLock``
  on ``tasks``, ``pg_locks``) and waits for ``task_events``. The test waits for exactly
  that, kills the child, releases the lock and waits until the orphaned backend is gone
  (it rolls back).
* SQLite: the test holds ``BEGIN IMMEDIATE``. Every start-up write needs SQLite's one
  write lock (the schema check at open, then the recovery's ``BEGIN IMMEDIATE``, which
  takes it before it reads anything), so the start waits at its first; with
  ``--store-busy-timeout-ms`` short the test waits until the child said so (its
  ``cannot start`` line) and kills it. (A SQLite transaction cannot be caught part-way
  from outside; one killed part-way is rolled back by the WAL.)

A third start must keep every promise of docs/lmsp.md: each task acknowledged before
the first kill is listed once, nothing else; the ``fail`` task running at the kill
failed once (``server_restarted``), the ``retry`` one ran once more (two
``response.in_progress``, not three), queued ones ran in creation order, the keyed one
answers its key, the finished one is unchanged; every task's events are numbered from 0
without a gap, its terminal event once; every subscriber resumed from its cursor
(``Last-Event-ID`` or ``starting_after``) got exactly the rest; nothing answered 5xx.

The second test holds the lock until the child has said why it cannot start (a warning
line, then 503 ``store_unavailable`` on the LMSP door while it waits and tries again,
never a silent hang nor a traceback), then releases it: the same child starts and
recovers. The third (PostgreSQL) holds the row of a task running at the kill while the
server starts again: once released, the task is recovered (not skipped and then renewed
for ever by the instance that no longer runs it).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx
import pytest

from tests.harness import ServeProcess, free_port
from tests.lmsp import stores

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

API = "/lmsp/v1"
WAIT_S = 30   # a bound against a hang, never a timing


# -- the store's lock, held by the test ---------------------------------------------------
class Lock:
    """The store locked from outside the server (see the module docstring)."""

    def __init__(self, store_name: str, url: str,
                 table: str = "task_events IN EXCLUSIVE MODE") -> None:
        """``table``: what PostgreSQL's ``LOCK TABLE`` takes."""
        self.store_name, self.url, self.table = store_name, url, table
        self.conn: Any = None

    def take(self) -> None:
        if self.store_name == "postgres":
            import psycopg

            self.conn = psycopg.connect(self.url)
            self.conn.execute(f"LOCK TABLE {self.table}")
        else:
            self.conn = sqlite3.connect(self.url.removeprefix("sqlite:///"),
                                        isolation_level=None)
            self.conn.execute("BEGIN IMMEDIATE")

    def release(self) -> None:
        self.conn.rollback() if self.store_name == "postgres" else self.conn.execute("ROLLBACK")
        self.conn.close()

    def recovery_blocked(self) -> int | None:
        """PostgreSQL: the backend that updated ``tasks`` and waits for ``task_events``."""
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT w.pid FROM pg_locks w JOIN pg_locks h ON h.pid = w.pid "
                "WHERE NOT w.granted AND w.relation = 'task_events'::regclass "
                "AND h.granted AND h.relation = 'tasks'::regclass "
                "AND h.mode = 'RowExclusiveLock'").fetchone()
        return None if row is None else int(row[0])

    def backend_alive(self, pid: int) -> bool:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s",
                               (pid,)).fetchone()
        return bool(row and row[0])


async def until(check: Callable[[], Any], why: str) -> Any:
    """``check()`` (run on a thread) until it is truthy, within ``WAIT_S``."""
    with anyio.fail_after(WAIT_S):
        while True:
            found = await anyio.to_thread.run_sync(check)
            if found:
                return found
            await anyio.sleep(0.02)
    raise AssertionError(why)   # pragma: no cover - fail_after raised


# -- the client's side --------------------------------------------------------------------
def frames(text: str) -> list[tuple[int, str]]:
    found, frame = [], {}
    for line in text.split("\n"):
        if not line:
            if "data" in frame:
                found.append((int(frame["id"]), frame["event"]))
            frame = {}
        elif not line.startswith(":") and ":" in line:
            name, _, value = line.partition(":")
            frame[name] = value[1:] if value.startswith(" ") else value
    return found


class Client:
    def __init__(self, base_url: str) -> None:
        self.http = httpx.AsyncClient(base_url=base_url, timeout=WAIT_S,
                                      event_hooks={"response": [self._record]})
        self.statuses: list[tuple[str, int]] = []

    async def _record(self, response: httpx.Response) -> None:
        self.statuses.append((response.request.url.path, response.status_code))

    async def create(self, text: str, policy: str, key: str | None = None) -> str:
        answer = await self.http.post(
            f"{API}/tasks", headers={"Idempotency-Key": key} if key else {},
            json={"type": "response", "on_restart": policy,
                  "input": {"model": "reference", "input": text}})
        assert answer.status_code in (200, 202), answer.text
        return str(answer.json()["id"])

    async def get(self, task_id: str) -> dict[str, Any]:
        answer = await self.http.get(f"{API}/tasks/{task_id}")
        assert answer.status_code == 200, answer.text
        return answer.json()  # type: ignore[no-any-return]

    async def until(self, task_id: str, *statuses: str) -> dict[str, Any]:
        with anyio.fail_after(WAIT_S):
            while (task := await self.get(task_id))["status"] not in statuses:
                await anyio.sleep(0.02)
        return task

    async def listed(self) -> dict[str, dict[str, Any]]:
        answer = await self.http.get(f"{API}/tasks", params={"limit": 100})
        assert answer.status_code == 200 and not answer.json()["has_more"], answer.text
        return {t["id"]: t for t in answer.json()["data"]}

    async def events(self, task_id: str, cursor: int | None = None, *, by_query: bool = False,
                     until: str | None = None) -> list[tuple[int, str]]:
        """The task's stream from ``cursor``: until the event ``until`` (then dropped), or
        until the server ends it (the task's end)."""
        headers, params = {}, {}
        if cursor is not None and by_query:
            params["starting_after"] = str(cursor)
        elif cursor is not None:
            headers["Last-Event-ID"] = str(cursor)
        seen: list[tuple[int, str]] = []
        with anyio.fail_after(WAIT_S):
            async with self.http.stream("GET", f"{API}/tasks/{task_id}/events",
                                        headers=headers, params=params) as stream:
                assert stream.status_code == 200, await stream.aread()
                frame: dict[str, str] = {}
                async for line in stream.aiter_lines():
                    if not line:
                        if "data" in frame:
                            seen.append((int(frame["id"]), frame["event"]))
                            if frame["event"] == until:
                                return seen
                        frame = {}
                    elif not line.startswith(":") and ":" in line:
                        name, _, value = line.partition(":")
                        frame[name] = value[1:] if value.startswith(" ") else value
        return seen

    async def full_read(self, task_id: str) -> list[tuple[int, str]]:
        answer = await self.http.get(f"{API}/tasks/{task_id}/events")
        assert answer.status_code == 200, answer.text
        return frames(answer.text)


# -- the test -----------------------------------------------------------------------------
def _serve(tmp_path: Path, store_name: str, busy_ms: int = 500) -> tuple[ServeProcess, str]:
    flags = ["--port", str(free_port()), "--max-running-tasks", "2",
             "--store-busy-timeout-ms", str(busy_ms)]
    if store_name == "postgres":
        url = stores.postgres_url_for(tmp_path, "recovery")
        flags += ["--store", url, *stores.lease_flags()]
    else:
        url = f"sqlite:///{tmp_path / 'lmsp.db'}"
        flags += ["--store", url]
    return ServeProcess(tmp_path, *flags), url


class Before:
    """What the first run acknowledged, and what its subscribers read."""

    def __init__(self) -> None:
        self.ids: dict[str, str] = {}                   # name -> task id
        self.read: dict[str, list[tuple[int, str]]] = {}   # name -> frames read so far
        self.finished: dict[str, Any] = {}


async def _first_run(child: ServeProcess) -> Before:
    """F finished; A (``fail``) and B (``retry``) running; C, D (long, ``retry``) and E
    (keyed) queued behind them; subscribers of A, B and C part-way."""
    before = Before()
    await anyio.to_thread.run_sync(child.start)
    client = Client(child.base_url)
    try:
        ids = before.ids
        ids["F"] = await client.create("/chunks 3 finished", "fail")
        before.finished = await client.until(ids["F"], "succeeded")
        ids["A"] = await client.create("/sleep 60s running fail", "fail")
        ids["B"] = await client.create("/sleep 60s running retry", "retry")
        await client.until(ids["A"], "running")
        await client.until(ids["B"], "running")
        ids["C"] = await client.create("/chunks 3 queued", "fail")
        ids["D"] = await client.create("/sleep 60s queued retry", "retry")
        ids["E"] = await client.create("/chunks 3 queued keyed", "fail", key="recovery-key")
        for name in "CDE":
            assert (await client.get(ids[name]))["status"] == "queued"
        before.read["A"] = await client.events(ids["A"], until="response.in_progress")
        before.read["B"] = await client.events(ids["B"], until="response.in_progress")
        before.read["C"] = await client.events(ids["C"], until="response.created")
        assert all(before.read.values()), before.read
        assert not [s for s in client.statuses if s[1] >= 500], client.statuses
    finally:
        await client.http.aclose()
    await anyio.to_thread.run_sync(child.kill)
    return before


async def _killed_while_blocked(child: ServeProcess, lock: Lock, store_name: str) -> None:
    """The second start, killed while the store's lock holds it (module docstring)."""
    await anyio.to_thread.run_sync(lock.take)
    try:
        await anyio.to_thread.run_sync(child.spawn)
        if store_name == "postgres":
            pid = await until(lock.recovery_blocked, "the recovery blocked inside")
        else:
            await until(lambda: "cannot start" in child.stderr_text(), "the start blocked")
        assert child.returncode is None, child.stderr_text()
        await anyio.to_thread.run_sync(child.kill)
    finally:
        await anyio.to_thread.run_sync(lock.release)
    if store_name == "postgres":   # its transaction rolled back: nothing of it holds on
        await until(lambda: not lock.backend_alive(pid), "the killed backend gone")


async def _check_third_start(child: ServeProcess, before: Before) -> None:
    await anyio.to_thread.run_sync(child.start)
    client = Client(child.base_url)
    ids = before.ids
    resumed: dict[str, list[tuple[int, str]]] = {}

    async def resume(name: str, by_query: bool) -> None:
        resumed[name] = await client.events(ids[name], before.read[name][-1][0],
                                            by_query=by_query)

    try:
        assert (await client.http.get("/health")).status_code == 200
        listed = await client.listed()
        assert set(listed) == set(ids.values()), (listed, ids)
        a = await client.get(ids["A"])
        assert a["status"] == "failed" and a["error"]["code"] == "server_restarted", a
        async with anyio.create_task_group() as tg:
            tg.start_soon(resume, "A", False)
            tg.start_soon(resume, "B", True)
            tg.start_soon(resume, "C", False)
            # B (requeued) and C were first in line; C ends, then D runs
            await client.until(ids["C"], "succeeded")
            for name in "BD":   # long ones: cancelled once running again
                await client.until(ids[name], "running")
                if name == "B":   # in creation order: E waits behind B and D
                    assert (await client.get(ids["E"]))["status"] == "queued"
                cancel = await client.http.post(f"{API}/tasks/{ids[name]}/cancel")
                assert cancel.status_code in (200, 202), cancel.text
                await client.until(ids[name], "cancelled")
            await client.until(ids["E"], "succeeded")
        replay = await client.http.post(
            f"{API}/tasks", headers={"Idempotency-Key": "recovery-key"},
            json={"type": "response", "on_restart": "fail",
                  "input": {"model": "reference", "input": "/chunks 3 queued keyed"}})
        assert replay.status_code in (200, 202) and replay.json()["id"] == ids["E"], replay.text
        assert await client.get(ids["F"]) == before.finished
        assert set(await client.listed()) == set(ids.values())
        for name, task_id in ids.items():
            events = await client.full_read(task_id)
            assert [i for i, _ in events] == list(range(len(events))), (name, events)
            terminal = [e for _, e in events if e in ("response.completed",
                                                      "response.failed",
                                                      "response.cancelled")]
            assert len(terminal) == 1, (name, events)
            runs = sum(e == "response.in_progress" for _, e in events)
            assert runs == {"A": 1, "B": 2, "F": 1, "C": 1, "D": 1, "E": 1}[name], (name, events)
            if name in resumed:
                assert before.read[name] + resumed[name] == events, (name, resumed[name])
        assert not [s for s in client.statuses if s[1] >= 500], client.statuses
    finally:
        await client.http.aclose()


# Drives child processes from the client side only: one event loop suffices.
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_recovery_killed_while_the_store_is_locked_loses_and_repeats_nothing(
        tmp_path: Path, store_name: str) -> None:
    # PostgreSQL: the recovery stays blocked until the kill (the bound is not reached);
    # SQLite: the start says it is blocked once the bound is reached
    child, url = _serve(tmp_path, store_name, 60_000 if store_name == "postgres" else 500)
    try:
        before = await _first_run(child)
        await _killed_while_blocked(child, Lock(store_name, url), store_name)
        await _check_third_start(child, before)
        assert "Traceback" not in child.stderr_text(), child.stderr_text()
    finally:
        await anyio.to_thread.run_sync(child.stop)


# Drives child processes from the client side only: one event loop suffices.
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_start_waiting_for_a_locked_store_says_so_and_answers_503(
        tmp_path: Path, store_name: str) -> None:
    child, url = _serve(tmp_path, store_name)
    # PostgreSQL: the tasks table itself, reads too (the recovery's first statement, and
    # the release of the leases when the failed start closes the store, wait)
    lock = Lock(store_name, url, "tasks IN ACCESS EXCLUSIVE MODE")
    try:
        before = await _first_run(child)
        await anyio.to_thread.run_sync(lock.take)
        try:
            await anyio.to_thread.run_sync(child.spawn)
            await until(lambda: "cannot start" in child.stderr_text(), "a line saying why")
            async with httpx.AsyncClient(base_url=child.base_url, timeout=WAIT_S) as client:
                answer = await client.get(f"{API}/tasks")   # in the backlog until answered
                assert answer.status_code == 503, answer.text
                assert answer.json()["code"] == "store_unavailable", answer.text
            assert child.returncode is None, child.stderr_text()
        finally:
            await anyio.to_thread.run_sync(lock.release)
        await anyio.to_thread.run_sync(child.wait_listening)
        client = Client(child.base_url)
        try:
            a = await client.get(before.ids["A"])
            assert a["status"] == "failed" and a["error"]["code"] == "server_restarted", a
            assert set(await client.listed()) == set(before.ids.values())
        finally:
            await client.http.aclose()
        assert "Traceback" not in child.stderr_text(), child.stderr_text()
    finally:
        await anyio.to_thread.run_sync(child.stop)


# Drives child processes from the client side only: one event loop suffices.
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_task_whose_row_is_locked_at_the_restart_is_still_recovered(
        tmp_path: Path) -> None:
    """PostgreSQL: another session holds the row of a task running at the kill (the
    killed run's own backend not gone yet, another instance's transaction) while the
    server starts again. The task is its own (same state dir, same instance): it must
    still be recovered once the lock goes, not skipped and then renewed for ever as if
    this run ran it."""
    url = stores.postgres_url_or_skip(tmp_path, "recovery")
    child = ServeProcess(tmp_path, "--port", str(free_port()), "--store", url,
                         "--store-busy-timeout-ms", "60000", *stores.lease_flags())
    try:
        await anyio.to_thread.run_sync(child.start)
        client = Client(child.base_url)
        try:
            task_id = await client.create("/sleep 60s running fail", "fail")
            await client.until(task_id, "running")
        finally:
            await client.http.aclose()
        await anyio.to_thread.run_sync(child.kill)

        import psycopg

        holder = await anyio.to_thread.run_sync(psycopg.connect, url)
        try:
            xid = (await anyio.to_thread.run_sync(lambda: holder.execute(
                "SELECT id, pg_current_xact_id()::text FROM tasks WHERE id = %s FOR UPDATE",
                (task_id,)).fetchone()))[1]

            def waits_for_the_row() -> bool:
                with psycopg.connect(url, autocommit=True) as conn:
                    return conn.execute(
                        "SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype = "
                        "'transactionid' AND transactionid::text = %s", (xid,)
                    ).fetchone() != (0,)

            listening = anyio.Event()

            async def start() -> None:
                await anyio.to_thread.run_sync(child.wait_listening)
                listening.set()

            async with anyio.create_task_group() as tg:
                await anyio.to_thread.run_sync(child.spawn)
                tg.start_soon(start)
                # the start waits for the row, or (skipping it) listens: either way
                with anyio.fail_after(WAIT_S):
                    while not listening.is_set() and not await anyio.to_thread.run_sync(
                            waits_for_the_row):
                        await anyio.sleep(0.02)
                await anyio.to_thread.run_sync(holder.rollback)
        finally:
            await anyio.to_thread.run_sync(holder.close)
        client = Client(child.base_url)
        try:
            task = await client.until(task_id, "failed", "cancelled", "succeeded")
            assert task["status"] == "failed", task
            assert task["error"]["code"] == "server_restarted", task
            events = await client.full_read(task_id)
            assert [e for _, e in events].count("response.failed") == 1, events
            assert not [s for s in client.statuses if s[1] >= 500], client.statuses
        finally:
            await client.http.aclose()
    finally:
        await anyio.to_thread.run_sync(child.stop)


# Drives child processes from the client side only: one event loop suffices.
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_sigterm_stops_a_start_waiting_for_a_locked_store(
        tmp_path: Path, store_name: str) -> None:
    """SIGTERM while the start waits for the lock: the process exits 0 once the wait in
    progress returns (bounded by ``--store-busy-timeout-ms``), with its one line."""
    child, url = _serve(tmp_path, store_name)
    lock = Lock(store_name, url, "tasks IN ACCESS EXCLUSIVE MODE")
    await _first_run(child)
    await anyio.to_thread.run_sync(lock.take)
    try:
        await anyio.to_thread.run_sync(child.spawn)
        await until(lambda: "cannot start" in child.stderr_text(), "a line saying why")
        status = await anyio.to_thread.run_sync(lambda: child.stop(WAIT_S))
    finally:
        await anyio.to_thread.run_sync(lock.release)
        await anyio.to_thread.run_sync(child.kill)
    assert status == 0, child.stderr_text()
    assert "received SIGTERM while starting: stopping" in child.stderr_text()
    assert "Traceback" not in child.stderr_text(), child.stderr_text()
