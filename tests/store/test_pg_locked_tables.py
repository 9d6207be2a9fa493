"""A PostgreSQL table locked by another session while real ``acp-server serve``
processes run on it: the test's own connection holds ``LOCK TABLE … IN ACCESS
EXCLUSIVE MODE`` (nothing reads or writes the table meanwhile; ``--store-busy-timeout-ms``
short) and releases it later.

* ``tasks`` locked under one instance running a task: every LMSP request that needs the
  table answers 503 ``store_unavailable`` after the busy timeout (it hung for as long as
  the lock was held: every statement waited without a bound, and the instance's one
  writer with it); the session door, which needs no ``tasks``, goes on answering (a
  session created, a prompt accepted); once the lock is gone the periodic lease
  renewal renews the task's lease again and a new task runs, by itself.
* ``tasks`` locked under two instances, a session owned by the first with a prompt
  running: the owner's session leases go on being renewed while the lock is held, so
  the other instance never adopts the session (before, the owner's renewal waited
  behind its task writes, the lease expired, and the second instance, once it could
  write, took the session over while the first still ran its turn: two runners).
* ``session_leases`` locked: a session created answers 503 ``store_unavailable``, not a
  hang; once released the session door serves again.
* A task whose lease expired while its owner was paused, recovered by the other
  instance: the owner, resumed, stops its turn of it (the lease loop asks which of its
  running tasks were taken over), so it is not run twice at once.
* ``schema_version`` locked at a start (the schema check waits for it): the start says
  why and is tried again (503 meanwhile) as for any store outage, then starts (it
  waited without a bound, silent).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.agents.gated import gated_agent
from tests.harness import ServeProcess
from tests.lmsp import stores
from tests.store.segment_rows import stored_events

pytestmark = pytest.mark.slow

WAIT_S = 30   # a bound against a hang, never a timing
BUSY = ["--store-busy-timeout-ms", "500"]
TASK_LEASES = ["--store-lease-ms", "3000", "--store-renew-ms", "300"]
SESSION_LEASES = ["--session-lease-ttl-ms", "3000", "--session-lease-renew-ms", "300"]


def _until(condition: Callable[[], Any], why: str) -> Any:
    deadline = time.monotonic() + WAIT_S
    while not (found := condition()):
        assert time.monotonic() < deadline, why
        time.sleep(0.02)
    return found


@contextmanager
def _locked(url: str, table: str) -> Iterator[None]:
    """``table`` held in ACCESS EXCLUSIVE mode by the test's own connection."""
    with psycopg.connect(url) as conn:
        conn.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        try:
            yield
        finally:
            conn.rollback()


def _url(tmp_path: Path, name: str) -> str:
    if not stores.postgres_dsn():
        pytest.skip(stores.SKIP_POSTGRES)
    return stores.postgres_url_for(tmp_path, name)


def _create(http: httpx.Client, text: str) -> httpx.Response:
    return http.post("/lmsp/v1/tasks", json={"type": "response", "on_restart": "fail",
                                             "input": {"model": "reference", "input": text}})


def _status(http: httpx.Client, task_id: str) -> str:
    return str(http.get(f"/lmsp/v1/tasks/{task_id}").json()["status"])


def _unavailable(answer: httpx.Response) -> None:
    """The door's own 503 for a store that cannot serve now."""
    assert answer.status_code == 503, answer.text
    assert answer.headers.get("retry-after"), answer.headers
    body = answer.json()
    assert "store_unavailable" in (body.get("code"), body.get("type"),
                                   body.get("error", {}).get("code")
                                   if isinstance(body.get("error"), dict) else None), body


def test_locked_tasks_answer_503_and_the_lease_loop_comes_back(tmp_path: Path) -> None:
    url = _url(tmp_path, "tasks")
    with ServeProcess(tmp_path, "--store", url, *BUSY, *TASK_LEASES) as child, \
            psycopg.connect(url, autocommit=True) as db:
        http = child.http
        http.timeout = httpx.Timeout(WAIT_S)
        long = _create(http, "/sleep 600s held").json()["id"]
        _until(lambda: _status(http, long) == "running", "the long task never ran")
        sid = http.post("/session", json={"sessionScope": "thread"}).json()["sessionId"]
        with _locked(url, "tasks"):
            _unavailable(_create(http, "hello"))
            _unavailable(http.get(f"/lmsp/v1/tasks/{long}"))
            made = http.post("/session", json={"sessionScope": "thread"})
            assert made.status_code == 200, made.text
            prompted = http.post(f"/session/{sid}/prompt",
                                 json={"prompt": [{"type": "text", "text": "hello"}]})
            assert prompted.status_code == 202, prompted.text
            _until(lambda: "lmsp lease renewal/recovery skipped" in child.stderr_text(),
                   "the lease loop never said why it skipped")
        released = db.execute("SELECT lease_expires_at FROM tasks WHERE id = %s",
                              (long,)).fetchone()[0]
        _until(lambda: db.execute("SELECT lease_expires_at FROM tasks WHERE id = %s",
                                  (long,)).fetchone()[0] > released,
               "the lease loop never renewed the running task's lease again")
        after = _create(http, "hello again")
        assert after.status_code == 202, after.text
        _until(lambda: _status(http, after.json()["id"]) == "succeeded",
               "a task created after the lock never ran")
        assert _status(http, long) == "running"   # still this instance's, never recovered
        http.post(f"/lmsp/v1/tasks/{long}/cancel")
        _until(lambda: _status(http, long) == "cancelled", "the long task never ended")
        assert "Traceback" not in child.stderr_text(), child.stderr_text()[-4000:]


def test_locked_tasks_do_not_let_a_session_be_adopted_from_its_running_owner(
        tmp_path: Path) -> None:
    url = _url(tmp_path, "adopt")
    gate = tmp_path / "gate-open"
    for name in "ab":
        (tmp_path / name).mkdir()
    flags = ["--store", url, *BUSY, *TASK_LEASES, *SESSION_LEASES,
             "--session-on-restart", "continue", "--agent", str(gated_agent(tmp_path))]
    with ServeProcess(tmp_path / "a", *flags) as owner, \
            ServeProcess(tmp_path / "b", *flags) as other, \
            psycopg.connect(url, autocommit=True) as db:
        http = owner.http
        sid = http.post("/session", json={"sessionScope": "thread"}).json()["sessionId"]
        assert http.post(f"/session/{sid}/prompt", json={
            "prompt": [{"type": "text", "text": f"gate {gate}"}]}).status_code == 202

        def lease() -> tuple[str, int, float]:
            row = db.execute("SELECT instance, token, expires_at FROM session_leases "
                             "WHERE session_id = %s", (sid,)).fetchone()
            return row[0], int(row[1]), float(row[2])

        instance, token, expires = lease()
        with _locked(url, "tasks"):
            def renewed_past() -> bool:
                now = lease()
                assert now[:2] == (instance, token), \
                    f"the session was taken over while its owner ran its turn: {now}"
                return now[2] > expires + 3   # renewed past a whole TTL after the lock
            _until(renewed_past, "the owner's session lease was not renewed under the lock")
        gate.touch()
        def turns() -> int:
            return sum(1 for e in stored_events(db.execute, sid, "%s")
                       if e[1] == "turn_complete")

        _until(lambda: turns() >= 1, "the turn never ended")
        assert lease()[:2] == (instance, token)
        assert turns() == 1   # the one turn ran once, on its owner
        assert other.http.get(f"/session/{sid}/status").status_code == 200
        for child in (owner, other):
            assert "Traceback" not in child.stderr_text(), child.stderr_text()[-4000:]


def test_locked_session_leases_answer_503_then_serve_again(tmp_path: Path) -> None:
    url = _url(tmp_path, "leases")
    with ServeProcess(tmp_path, "--store", url, *BUSY, *SESSION_LEASES) as child:
        http = child.http
        http.timeout = httpx.Timeout(WAIT_S)
        with _locked(url, "session_leases"):
            _unavailable(http.post("/session", json={"sessionScope": "thread"}))
        _until(lambda: http.post("/session", json={"sessionScope": "thread"}
                                 ).status_code == 200, "sessions never made again")
        assert "Traceback" not in child.stderr_text(), child.stderr_text()[-4000:]


def test_a_start_whose_schema_is_locked_says_so_then_starts(tmp_path: Path) -> None:
    url = _url(tmp_path, "schema")
    with ServeProcess(tmp_path, "--store", url, *BUSY):   # the schema made
        pass
    child = ServeProcess(tmp_path, "--store", url, *BUSY, "--port", "0")
    with _locked(url, "schema_version"):
        child.spawn()
        try:
            _until(lambda: "lock timeout; answering 503" in child.stderr_text()
                   or child.process.poll() is not None,   # type: ignore[union-attr]
                   "the start never said why it waits")
            assert child.returncode is None, child.stderr_text()[-4000:]
        except BaseException:
            child.kill()
            raise
    try:   # the same process (``with child`` would start another one)
        child.wait_listening()
        assert child.http.get("/health").status_code == 200
        assert "Traceback" not in child.stderr_text(), child.stderr_text()[-4000:]
    finally:
        child.stop()


@pytest.mark.parametrize("on_restart", ["retry", "fail"])
def test_a_task_recovered_elsewhere_stops_on_the_instance_that_lost_it(
        tmp_path: Path, on_restart: str) -> None:
    """The owner paused (``SIGSTOP``) while its task's lease is made to expire (the
    store's data moved, not waited for): the other instance recovers the task, per its
    ``on_restart``: runs it again (``retry``) or fails it (``fail``, the default); the
    owner, resumed, stops its own turn of it (before, it ran on for as long as the turn
    lasted, its runner slot taken: two runners of one task, or a turn of a task
    already failed)."""
    url = _url(tmp_path, "lost")
    for name in "ab":
        (tmp_path / name).mkdir()
    flags = ["--store", url, *BUSY, *TASK_LEASES, "--max-running-tasks", "1"]
    recovered = {"retry": "status = 'running' AND owner IS DISTINCT FROM %s",
                 "fail": "status = 'failed' AND %s::text IS NOT NULL"}[on_restart]
    with ServeProcess(tmp_path / "a", *flags) as owner, \
            psycopg.connect(url, autocommit=True) as db:
        http = owner.http
        answer = http.post("/lmsp/v1/tasks", json={
            "type": "response", "on_restart": on_restart,
            "input": {"model": "reference", "input": "/sleep 600s held"}})
        task = answer.json()["id"]
        _until(lambda: _status(http, task) == "running", "the task never ran")
        mine = db.execute("SELECT owner FROM tasks WHERE id = %s", (task,)).fetchone()[0]
        with ServeProcess(tmp_path / "b", *flags) as other:
            os.kill(owner.pid, signal.SIGSTOP)
            try:
                db.execute("UPDATE tasks SET lease_expires_at = 0 WHERE id = %s", (task,))
                _until(lambda: db.execute(f"SELECT {recovered} FROM tasks WHERE id = %s",
                                          (mine, task)).fetchone()[0],
                       "the other instance never recovered the task")
            finally:
                os.kill(owner.pid, signal.SIGCONT)
            _until(lambda: "its lease was lost" in owner.stderr_text(),
                   "the instance that lost the task never stopped its turn")
            if on_restart == "retry":
                # the other instance's one slot runs the task; the next one can only run
                # on the first instance, once its stale turn of the task is stopped
                after = _create(other.http, "hello")
                assert after.status_code == 202, after.text
                _until(lambda: _status(http, after.json()["id"]) == "succeeded",
                       "the instance that lost the task never freed its slot")
                assert _status(other.http, task) == "running"   # untouched by the stale turn
                other.http.post(f"/lmsp/v1/tasks/{task}/cancel")
                _until(lambda: _status(http, task) == "cancelled", "the task never ended")
        if on_restart == "fail":   # the other gone: only the first instance's slot runs it
            failed = http.get(f"/lmsp/v1/tasks/{task}").json()
            assert failed["status"] == "failed", failed   # as recovered: not rewritten
            after = _create(http, "hello")
            assert after.status_code == 202, after.text
            _until(lambda: _status(http, after.json()["id"]) == "succeeded",
                   "the instance that lost the task never freed its slot")
        for child in (owner, other):
            assert "Traceback" not in child.stderr_text(), child.stderr_text()[-4000:]


def test_a_locked_task_row_leaves_the_other_leases_renewed(tmp_path: Path) -> None:
    """One running task's row held ``FOR UPDATE`` by another session: the lease loop
    renews the instance's other tasks all the same (one statement renewed them all, so
    it waited, then failed, for every task: their leases expired, free for another
    instance to recover while they ran here); once released, that one is renewed too."""
    url = _url(tmp_path, "row")
    with ServeProcess(tmp_path, "--store", url, *BUSY, *TASK_LEASES) as child, \
            psycopg.connect(url, autocommit=True) as db, psycopg.connect(url) as holder:
        http = child.http
        held, free = (_create(http, f"/sleep 600s {name}").json()["id"] for name in "ab")
        for task in (held, free):
            _until(lambda: _status(http, task) == "running", "a task never ran")

        def lease(task: str) -> float:
            return float(db.execute("SELECT lease_expires_at FROM tasks WHERE id = %s",
                                    (task,)).fetchone()[0])

        holder.execute("SELECT 1 FROM tasks WHERE id = %s FOR UPDATE", (held,))
        at_lock = lease(free)
        _until(lambda: lease(free) > at_lock, "the unlocked task's lease was not renewed")
        at_release = lease(held)
        holder.rollback()
        _until(lambda: lease(held) > at_release, "the locked task's lease never renewed")
        for task in (held, free):
            assert _status(http, task) == "running"
            http.post(f"/lmsp/v1/tasks/{task}/cancel")
            _until(lambda: _status(http, task) == "cancelled", "a task never ended")
        assert "Traceback" not in child.stderr_text(), child.stderr_text()[-4000:]


def test_a_locked_row_of_another_instance_does_not_hold_up_a_start(tmp_path: Path) -> None:
    """At start-up the recovery waits (bounded) for a locked row of this instance's own
    (a task left running by its previous run), never for another instance's: a task of
    a dead instance, its lease expired, held ``FOR UPDATE`` by a maintenance session,
    is skipped as the periodic recovery skips it, the start goes on, and the task is
    recovered once the lock is gone (before, the start failed on the lock and was
    tried again, answering 503, for as long as the lock was held)."""
    url = _url(tmp_path, "theirs")
    for name in "ab":
        (tmp_path / name).mkdir()
    flags = ["--store", url, *BUSY, *TASK_LEASES]
    dead = ServeProcess(tmp_path / "a", *flags).start()
    task = _create(dead.http, "/sleep 600s left running").json()["id"]
    _until(lambda: _status(dead.http, task) == "running", "the task never ran")
    dead.kill()
    with psycopg.connect(url, autocommit=True) as db:
        db.execute("UPDATE tasks SET lease_expires_at = 0 WHERE id = %s", (task,))
    with psycopg.connect(url) as maintenance:
        maintenance.execute("SELECT id FROM tasks WHERE id = %s FOR UPDATE", (task,))
        with ServeProcess(tmp_path / "b", *flags) as survivor:   # listening: started
            assert survivor.http.get("/health").status_code == 200
            assert "cannot start" not in survivor.stderr_text(), survivor.stderr_text()
            assert _status(survivor.http, task) == "running"   # skipped, not waited for
            maintenance.rollback()   # the lock goes: the periodic recovery takes it
            _until(lambda: _status(survivor.http, task) == "failed",
                   "the task was never recovered")
            assert "Traceback" not in survivor.stderr_text(), survivor.stderr_text()[-4000:]
