"""A fault-injecting store: the real SQLite or PostgreSQL store, told to fail on demand.

    store = faulty(tmp_path)                  # the store ``store_name`` selected
    store.faults.on()                         # every batch and read fails as the engine would
    store.faults.off()                        # the engine answers again
    store.faults.land_then_fail()             # the next batch commits, then fails (its
                                              # answer lost), the later ones fail till off
    store.faults.land_then_fail(when)         # the next batch for which when() is true
    store.faults.on_at("succeeded")           # on when a task moves to that state, so
                                              # its turn ends in the outage, whatever the
                                              # machine's load (no race with a sleep)
    gate = store.faults.hold_at("succeeded")  # that move waits (a slow commit) until
    await store.faults.holding.wait()         # the test opens the gate: the task stays
    gate.set()                                # 'running' as long as the test needs it
    hold = CommitHold(store)                  # any store: the next journal batch armed
    hold.arm(); ...; await wait_until(hold.entered.is_set); ...; hold.release()

The failure is the engine's own exception type raised where the engine raises it (a
write batch, a read), so the store's classification, health and the doors' 503 are
what a real outage gets. Used where a real fault (a tmpfs, a cluster restart) cannot be
staged, and to make the timing of a fault deterministic. A hold is a commit that takes
as long as the test wants: the task's move waits at the gate (its final deltas ride in
that commit, so a reader sees the stream stay open, silent, until the gate opens);
nothing is refused.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import psycopg

from acp_server.store.postgres import PostgresTaskStore
from acp_server.store.sqlite import SqliteTaskStore
from acp_server.store.tasks import TaskStore
from tests.lmsp import stores


class Faults:
    def __init__(self, make: Callable[[], BaseException]) -> None:
        self.make = make
        self.active = False
        self.refused_writes = 0   # batches refused while on
        self.refused_reads = 0
        self.armed_for: str | None = None
        self.held_at: str | None = None
        self.gate: anyio.Event | None = None
        self.holding: anyio.Event | None = None
        self.landing = False   # ``land_then_fail``
        self.landing_when: Callable[[], bool] | None = None

    def hold_at(self, state: str) -> anyio.Event:
        """Every ``transition`` to ``state`` waits until the returned gate is set;
        ``holding`` is set once one waits there (call from the test's event loop)."""
        self.held_at, self.gate, self.holding = state, anyio.Event(), anyio.Event()
        return self.gate

    def on(self) -> None:
        self.active = True

    def land_then_fail(self, when: Callable[[], bool] | None = None) -> None:
        """The next batch (the next one for which ``when()`` is true, called in the
        writer's thread as the batch starts) commits, then fails as if its answer was
        lost (a connection dropped after COMMIT: the outcome unknown to the store); the
        batches after it fail until ``off``."""
        self.landing, self.landing_when = True, when

    def on_at(self, state: str) -> None:
        """On from the first ``transition`` of a task to ``state`` (that one refused)."""
        self.armed_for = state

    def off(self) -> None:
        self.active = False


def journal_batch(batch: list[Any]) -> bool:
    """A write batch the session journal waits on (its ops report their outcome)."""
    return any(op.on_done is not None for op in batch)


class CommitHold:
    """A commit in flight for as long as the test wants: once armed, the next write
    batch of ``store`` for which ``when(batch)`` is true (called in the writer's thread;
    by default the session journal's) waits in the writer's thread, ``entered`` set,
    until ``release``. Nothing is refused; the batch then runs as it would have."""

    def __init__(self, store: Any, when: Callable[[list[Any]], bool] = journal_batch
                 ) -> None:
        self.gate, self.entered = threading.Event(), threading.Event()
        self.armed = False
        run_batch = store._run_batch

        def held(index: int, batch: list[Any]) -> None:
            if self.armed and when(batch):
                self.armed = False
                self.entered.set()
                self.gate.wait()
            run_batch(index, batch)

        store._run_batch = held

    def arm(self) -> None:
        self.armed = True

    def release(self) -> None:
        self.gate.set()


class _Faulty:
    faults: Faults

    def _run_batch(self, index: int, batch: list[Any]) -> None:
        when = self.faults.landing_when
        if self.faults.landing and (when is None or when()):
            self.faults.landing = False
            super()._run_batch(index, batch)  # type: ignore[misc]
            self.faults.refused_writes += 1
            self.faults.active = True
            raise self.faults.make()   # committed: only its answer is lost
        if self.faults.active:
            self.faults.refused_writes += 1
            raise self.faults.make()
        super()._run_batch(index, batch)  # type: ignore[misc]

    async def transition(self, task_id: str, from_states: Any, to_state: str,
                         finish: Any = None, *, now: float) -> Any:
        if self.faults.armed_for == to_state:
            self.faults.armed_for = None
            self.faults.on()
        if self.faults.held_at == to_state and self.faults.gate is not None:
            assert self.faults.holding is not None
            self.faults.holding.set()
            await self.faults.gate.wait()
        return await super().transition(  # type: ignore[misc]
            task_id, from_states, to_state, finish, now=now)

    async def _read(self, fn: Callable[[Any], Any]) -> Any:
        if self.faults.active:
            self.faults.refused_reads += 1
            error = self.faults.make()

            def fail(conn: Any) -> Any:
                raise error

            return await super()._read(fail)  # type: ignore[misc]
        return await super()._read(fn)  # type: ignore[misc]


class FaultySqlite(_Faulty, SqliteTaskStore):
    pass


class FaultyPostgres(_Faulty, PostgresTaskStore):
    pass


def faulty(tmp: Path, *, state_dir: Path | None = None) -> Any:
    """The selected store (``tests.lmsp.stores.current``) with ``faults``; ``state_dir``
    (PostgreSQL): where its instance id is kept, so a store opened again on it after a
    stop is the same instance (its sessions restored at start)."""
    if stores.current["name"] == "postgres":
        store: Any = FaultyPostgres(stores.postgres_url_for(tmp, "faulty"),
                                    lease_s=stores.TEST_LEASE_S, renew_s=stores.TEST_RENEW_S,
                                    poll_s=stores.TEST_POLL_S,
                                    state_dir=None if state_dir is None else str(state_dir))
        store.faults = Faults(lambda: psycopg.OperationalError(
            "server closed the connection unexpectedly"))
    else:
        store = FaultySqlite(f"sqlite:///{tmp}/faulty.sqlite3")
        store.faults = Faults(lambda: sqlite3.OperationalError("database or disk is full"))
    return store


__all__ = ["Faults", "TaskStore", "faulty"]
