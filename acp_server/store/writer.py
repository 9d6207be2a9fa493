"""The group-commit writer both task stores share: one bounded queue of operations,
drained by writer loops that run each batch in one transaction on a worker thread.

    class MyStore(GroupCommitStore[Connection]):
        def _run_batch(self, index: int, batch: list[Op]) -> None: ...   # op.fn(conn, op.events)
        async def touch(self, task_id: str) -> int:
            return await self._write(lambda conn, out: touch_row(conn, task_id))

    async with MyStore(on_commit=hub.publish, group_commit=True) as store:   # ``open()``
        await store.touch("task_1")

Contracts:

* An operation is a function of the engine's connection; ``_write`` queues it and
  returns its result once the transaction that ran it has COMMITTED (or raises what
  it raised). The wait is shielded: a caller cancelled meanwhile does not abandon a
  write that may still land; ``timeout`` raises ``TimeoutError`` instead.
* After each batch ``on_commit`` gets every successful operation's events, in commit
  order, then the callers wake (an operation queued with ``submit`` instead has its
  ``on_done`` called there, with no task hop: the session journal's way); a hook
  that raises is logged and the writer goes on. A ``prepare`` that raises fails its
  own operation only (``op.error``, its caller woken), never the batch;
  ``_observe`` sees each result, in the caller's task (the task stores call
  ``on_transition`` with each status a write moved a task to).
* Each writer has one worker thread for the store's life (replaced only after a
  bug). It runs batch after batch while operations are queued: after each, one call
  into the event loop (``anyio.from_thread``) settles it and takes the next
  (``_settle_then_next``), so callers wake in the loop's next iteration and the next
  batch starts without a new hop to a thread. With nothing queued the thread parks (a future, no interpreter
  lock held) and the writer task receives the next operation and hands its batch to
  the parked thread: no new worker-thread call per commit (``to_thread.run_sync``
  cost two more loop iterations and two cross-thread wake-ups each time). Everything
  but the transaction itself (``prepare``, ``_settle``, ``on_done``) runs in the
  event loop.
* ``open()`` (what ``async with store`` enters) connects, runs the writer loops and
  the engine's background work in one task group opened with ``async with``, and on
  the way out lets the loops drain what is queued before disconnecting.
* Faults never end a loop. An engine error that means the store cannot serve now
  (``_unavailable`` says which: a lost connection, a full disk, a lock past the busy
  timeout, a deleted file) reaches the caller as ``StoreUnavailableError`` and marks
  ``health`` down; the next operation that succeeds marks it up. Whatever else an
  engine raises while running a batch fails that batch's operations, not the loop.
  A bug while settling a batch still wakes every caller (logged). A worker thread that
  ends (a bug in its hop into the loop) is replaced; the operations it held are
  settled with their own outcomes once their transaction ran, else fail with
  ``StoreUnavailableError`` ("not written", or "outcome unknown" mid-transaction). A
  ``BaseException`` in a batch (not an engine error) fails it with an unknown outcome
  and rolls back (``_abort``). A writer whose new thread fails too before settling a
  batch is gone: the other writers serve, and the last one fails what is queued at
  once. No caller, and no closing, waits for a writer that is gone.
* ``probe()`` answers ``None`` when the store serves, else why not (``/health?deep=1``),
  within its timeout even when the store hangs (``bounded``).
* An operation queued with ``durable=False`` (the session journal's) asks only to
  survive a crash of the server's process; a batch of nothing else may commit without
  flushing the disk (the SQLite engine does: ``synchronous=NORMAL``), a batch with one
  durable operation is flushed whole (``synchronous=FULL``, and in WAL mode that
  flush covers every commit before it too). PostgreSQL commits every batch durably.
* While a batch or a read runs on a worker thread, the interpreter's switch interval is
  lowered to ``switching.SWITCH_INTERVAL_S``; when no store work is on a thread any more, it is
  put back (``store_work``; a parked writer thread does no store work, and the writer
  leaves ``store_work`` on every path, a hook's bug or a cancellation included). The
  writer gives up the GIL in every statement (SQLite's step, a PostgreSQL round trip)
  and must win it back from the event loop, which under load holds it for up to the
  interval (5 ms by default): measured, a batch of 12 SQLite statements beside a busy
  loop takes 14 ms at 5 ms and 1.8 ms at 0.5 ms. This was the limit of the task
  throughput, not the fsync. Lowered for the whole life of the store, it cost every
  request that does not touch the store: an HTTP server thread (granian's) that needs
  the GIL per request was made to force a hand-off ten times as often (the server's CPU
  per refused prompt, measured under load: about 15 % more).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any, Generic, Self, TypeVar, cast

import anyio
import anyio.abc
import anyio.from_thread

from acp_server.store.bounded import BoundedCalls
from acp_server.store.errors import StoreHealth, StoreUnavailableError, first_line
from acp_server.store.switching import store_work
from acp_server.store.tasks import CommittedEvent

log = logging.getLogger("acp_server.store.writer")

MAX_BATCH = 256
QUEUE_SIZE = 4096



C = TypeVar("C")   # the engine's connection
T = TypeVar("T")


@dataclasses.dataclass(eq=False)
class _Held:
    """What a writer's thread holds: the batch handed to it and not yet settled, how
    far it got (``gathered``: not started, ``running``: in its transaction, ``ran``:
    each operation's outcome set), and whether ``store_work`` is entered for it."""

    batch: list[Op] = dataclasses.field(default_factory=list)
    stage: str = "gathered"
    working: bool = False
    failures: int = 0   # since the last batch settled
    gone: bool = False   # no thread any more: operations fail at once


@dataclasses.dataclass(eq=False)
class Op:
    """One queued write: ``fn(conn, events_out, batch_state)`` and what came of it."""

    fn: Callable[..., Any]
    done: anyio.Event = dataclasses.field(default_factory=anyio.Event)
    result: Any = None
    error: BaseException | None = None
    events: list[CommittedEvent] = dataclasses.field(default_factory=list)
    bulk: Any = None   # engine-specific: an operation the batch may run in bulk
    # ``submit``'s hooks, both called in the event loop: ``prepare()`` just before the
    # batch that carries the operation starts (so it can take what piled up while it
    # was queued), ``on_done(op)`` once that batch has settled (no task to wake).
    prepare: Callable[[], None] | None = None
    on_done: Callable[[Op], None] | None = None
    # ``False``: the operation needs its commit to survive the server's process (a
    # ``kill -9``), not the machine (a power loss); a batch of only such operations may
    # commit without waiting for the disk (SQLite: ``synchronous=NORMAL`` in WAL mode).
    # One durable operation in the batch makes the whole batch, and everything the
    # store committed before it, durable.
    durable: bool = True


class GroupCommitStore(Generic[C]):
    """The writer, the reader pool and the lifecycle; engines fill in the hooks."""

    def __init__(self, *, on_commit: Callable[[list[CommittedEvent]], None] | None,
                 group_commit: bool, writers: int = 1, readers: int = 2) -> None:
        self.on_commit = on_commit
        self.writers = writers
        self.group_commit = group_commit
        self.commits = 0        # transactions committed (for the benchmark and tests)
        self.synced_commits = 0   # of those, flushed to the disk before their callers woke
        self.health = StoreHealth()
        self._readers: deque[C] = deque()
        self._read_limiter = anyio.CapacityLimiter(readers)
        # a reservation of long-lived threads, not a pool to share: each writer loop
        # (and an engine's listener) holds its token for the store's whole life, so
        # nothing else may borrow from it (it would wait until the store closes)
        self._write_limiter = anyio.CapacityLimiter(writers)
        self._live_writers = writers   # writers with a thread (``_thread``'s ``gone``)
        self._send, self._receive = anyio.create_memory_object_stream[Op](QUEUE_SIZE)
        self._exit: contextlib.AsyncExitStack | None = None
        self.bounded = BoundedCalls()   # the operator's checks: never held by a hung store

    # -- hooks ---------------------------------------------------------------------
    async def _connect_all(self) -> None:
        """Open the connections (and the schema); undone by ``_disconnect_all``."""
        raise NotImplementedError

    def _disconnect_all(self) -> None:
        raise NotImplementedError

    def _run_batch(self, index: int, batch: list[Op]) -> None:
        """Writer ``index`` runs ``batch`` in one transaction (a worker thread),
        setting each operation's ``result`` or ``error`` and ``events``."""
        raise NotImplementedError

    async def _background(self, tg: anyio.abc.TaskGroup) -> None:
        """Start the engine's background work in ``tg`` (ready when this returns)."""

    async def _closing(self) -> None:
        """Last writes before the queue closes (shielded)."""

    def _stopping(self) -> None:
        """The queue is closed: tell the background work to end."""

    def _unavailable(self, exc: BaseException) -> str | None:
        """Why ``exc`` (raised by the engine) means the store cannot serve now, or
        ``None`` when it is the operation's own error (handed to the caller as is)."""
        return None

    def _observe(self, result: Any) -> None:
        """A write committed with ``result`` (in the caller's task)."""

    async def _ping(self) -> None:
        """A cheap round trip to the store (``probe``); raises when it cannot serve."""
        await self._read(lambda conn: None)

    def _before_read(self) -> None:
        """Raise ``StoreUnavailableError`` when no read can be served (a lost file)."""

    def _usable(self, conn: C) -> bool:
        """Whether a reader connection still works (else ``_reconnect`` replaces it)."""
        return True

    def _abort(self, index: int) -> None:
        """Writer ``index``'s batch ended with no engine error but a ``BaseException``
        (a worker thread): roll back whatever transaction it may have left open."""

    def _reconnect(self) -> C:
        """A new reader connection (a worker thread)."""
        raise NotImplementedError

    def _read_lost(self, conn: C, exc: BaseException) -> bool:
        """Whether a read that raised ``exc`` failed because ``conn`` broke (a restart,
        a killed backend): it is then run once more on a new connection (a read only
        SELECTs, so running it twice is harmless) before it is reported."""
        return False

    # -- lifecycle -----------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def open(self) -> AsyncIterator[Self]:
        await self._connect_all()
        try:
            async with anyio.create_task_group() as tg:
                try:
                    self._live_writers = self.writers
                    for index in range(self.writers):
                        tg.start_soon(self._write_loop, index)
                    self.bounded.tg = tg
                    await self._background(tg)
                    try:
                        yield self
                    finally:
                        with anyio.CancelScope(shield=True):
                            await self._closing()
                finally:   # also when the store's scope is cancelled or start-up failed
                    self.bounded.tg = None
                    self._send.close()   # the loops drain what is queued, then end
                    self._stopping()
        finally:
            self._disconnect_all()

    async def __aenter__(self) -> Self:
        stack = contextlib.AsyncExitStack()
        await stack.enter_async_context(self.open())
        self._exit = stack
        return self

    async def __aexit__(self, *exc: Any) -> None:
        stack, self._exit = self._exit, None
        assert stack is not None, "the store is not open"
        await stack.__aexit__(*exc)

    # -- the writer ----------------------------------------------------------------
    async def _write_loop(self, index: int) -> None:
        """Writer ``index``: its worker thread (``_run_batches``) for the store's life;
        whenever the thread is parked, the next operation queued (everything queued,
        ``_gather``) is handed to it. Ends once the queue is closed and drained. A
        thread that fails is replaced (``_thread``); once the writer has none, what is
        queued fails at once with ``StoreUnavailableError`` instead of waiting."""
        parked: list[concurrent.futures.Future[list[Op]]] = []
        idle = [anyio.Event()]   # set while the thread is parked (``parked[0]``)
        held = _Held()
        ended = False

        def park() -> concurrent.futures.Future[list[Op]]:   # the event loop
            waiter: concurrent.futures.Future[list[Op]] = concurrent.futures.Future()
            if ended:
                waiter.set_result([])   # the thread ends
            else:
                parked.append(waiter)
                idle[0].set()
            return waiter

        def unpark(waiter: concurrent.futures.Future[list[Op]]) -> None:
            if waiter in parked:
                parked.remove(waiter)

        def gone() -> None:   # no thread any more: the others serve, or fail fast
            held.gone = True
            self._live_writers -= 1
            idle[0].set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(self._thread, index, park, held, gone, unpark)
            # Shielded: a cancelled store still serves what its closing writes (the
            # leases' release) until ``open`` closes the queue; it always does.
            try:
                with anyio.CancelScope(shield=True):
                    while True:
                        await idle[0].wait()
                        if held.gone and self._live_writers > 0:
                            break   # another writer serves the queue
                        first = await self._receive.receive()   # shared by the writers
                        held.stage, held.batch = "gathered", []
                        try:
                            batch = self._gather(first, held.batch)
                        except Exception:   # noqa: BLE001 - a bug must not end the loop
                            log.exception("store writer %d: gathering a batch failed", index)
                            self._abandon(held)
                            continue
                        if not batch:   # every operation failed its ``prepare`` (settled)
                            continue
                        if held.gone:   # the last writer: no thread, fail fast
                            self._fail(batch, "the store's writer stopped")
                            continue
                        idle[0] = anyio.Event()
                        store_work.__enter__()   # left by ``_settle_then_next`` as it parks
                        held.working = True
                        parked.pop().set_result(batch)
            except anyio.EndOfStream:
                pass
            finally:   # closed and drained: the thread ends when it parks
                ended = True
                while parked:
                    parked.pop().set_result([])

    async def _thread(self, index: int,
                      park: Callable[[], concurrent.futures.Future[list[Op]]],
                      held: _Held, gone: Callable[[], None],
                      unpark: Callable[[concurrent.futures.Future[list[Op]]], None]) -> None:
        """Run writer ``index``'s worker thread until the queue is closed and drained.
        A thread that raises (a bug in settling: the engine's own errors fail their
        batch, not the thread) is logged, the batch it held is settled (``_abandon``)
        and a new thread takes over; one that fails again before settling a batch is
        not replaced (``gone``)."""
        with anyio.CancelScope(shield=True):   # ends when the queue is closed and drained
            while True:
                stale = park()
                try:
                    await anyio.to_thread.run_sync(self._run_batches, index, park, stale,
                                                   held, limiter=self._write_limiter)
                    return
                except BaseException:   # noqa: BLE001 - a bug must not hang the store
                    log.exception("store writer %d: its thread failed", index)
                    unpark(stale)   # a thread that died before taking it
                    self._abandon(held)
                    if held.failures:   # twice with no batch settled in between
                        gone()
                        return
                    held.failures += 1

    def _abandon(self, held: _Held) -> None:
        """The thread holding ``held`` failed (or gathering its next batch did): leave
        its store work and settle the operations of its batch not yet woken: with
        their own outcomes once the transaction ran, else failed (``outcome unknown``
        when it was running, ``not written`` when it never started)."""
        self._leave(held)
        batch, held.batch = held.batch, []
        lost = [op for op in batch if not op.done.is_set()]
        if not lost:
            return
        try:
            if held.stage == "ran":
                self._settle(lost)
            elif held.stage == "running":
                self._fail(lost, "the store's writer failed; the outcome is unknown")
            else:
                self._fail(lost, "the store's writer failed; not written")
        except Exception:   # noqa: BLE001 - the settling itself is what fails
            log.exception("store writer: settling an abandoned batch failed")
            self._wake([op for op in lost if not op.done.is_set()])

    def _fail(self, batch: list[Op], reason: str) -> None:
        for op in batch:
            op.result, op.events = None, []
            op.error = StoreUnavailableError(reason)
        self._settle(batch)

    def _gather(self, first: Op, batch: list[Op]) -> list[Op]:
        """``first`` and what else is queued (at most ``MAX_BATCH``), prepared (event
        loop), appended to ``batch`` as they are received (so an owner that sees this
        raise still holds them) and returned. An operation whose ``prepare`` raises is
        settled at once with that error and left out (the batch may end up empty)."""
        batch.append(first)
        while self.group_commit and len(batch) < MAX_BATCH:
            try:
                batch.append(self._receive.receive_nowait())
            except (anyio.WouldBlock, anyio.EndOfStream):
                break
        failed: list[Op] = []
        for op in batch:
            if op.prepare is not None:
                try:
                    op.prepare()
                except Exception as exc:   # noqa: BLE001 - fails this operation only
                    log.exception("store writer: a prepare hook failed")
                    op.error = exc
                    failed.append(op)
        if failed:
            self._settle(failed)
            batch[:] = [op for op in batch if op.error is None]
        return batch

    def _run_batches(self, index: int, park: Callable[[], concurrent.futures.Future[list[Op]]],
                     waiter: concurrent.futures.Future[list[Op]], held: _Held) -> None:
        """Writer ``index``'s worker thread: wait parked for a batch, run it, then have
        the event loop settle it and hand back the next one (``_settle_then_next``:
        one hop to the loop per batch, the callers wake in the loop's next iteration),
        or a future to park on when nothing is queued; ends on an empty batch (the
        queue closed)."""
        batch = waiter.result()
        while batch:
            held.stage = "running"
            try:
                self._run_batch(index, batch)
            except Exception as exc:   # noqa: BLE001 - the engine failed: so did the batch
                for op in batch:
                    op.result, op.error, op.events = None, exc, []
            except BaseException as exc:   # noqa: BLE001 - not the engine's: left open?
                self._abort(index)
                for op in batch:
                    op.result, op.events = None, []
                    op.error = StoreUnavailableError(
                        "the store's writer failed; the outcome is unknown")
                    op.error.__cause__ = exc
            held.stage = "ran"
            following = anyio.from_thread.run_sync(self._settle_then_next, batch, park, held)
            batch = following if isinstance(following, list) else following.result()

    def _settle_then_next(self, batch: list[Op],
                          park: Callable[[], concurrent.futures.Future[list[Op]]],
                          held: _Held) -> list[Op] | concurrent.futures.Future[list[Op]]:
        """Settle ``batch``, then the next batch if an operation is queued, else a
        future the thread parks on, its store work over (event loop). The thread's
        ``store_work`` is left on every path that does not hand it a batch."""
        try:
            self._settle(batch)
            held.failures = 0
            while True:
                held.stage, held.batch = "gathered", []
                try:
                    first = self._receive.receive_nowait()
                except (anyio.WouldBlock, anyio.EndOfStream):
                    break
                following = self._gather(first, held.batch)
                if following:
                    return following
        except BaseException:
            self._leave(held)
            raise
        self._leave(held)
        return park()

    @staticmethod
    def _leave(held: _Held) -> None:
        """The store work entered for ``held``'s thread is over (it parks, or failed)."""
        if held.working:
            held.working = False
            store_work.__exit__()

    def _settle(self, batch: list[Op]) -> None:
        """After a batch: errors classified, health, ``on_commit``, callers woken.
        Every caller is woken even when the rest raises (a bug: logged)."""
        try:
            self._outcomes(batch)
        except Exception:   # noqa: BLE001 - a bug must not leave a caller waiting
            log.exception("store writer: settling a batch failed")
        self._wake(batch)

    @staticmethod
    def _wake(batch: list[Op]) -> None:
        """Wake ``batch``'s callers: ``done`` set, then each ``on_done`` (logged)."""
        for op in batch:
            op.done.set()
            if op.on_done is not None:
                try:
                    op.on_done(op)
                except Exception:   # noqa: BLE001 - a hook's bug must not end the writer
                    log.exception("store writer: an on_done hook failed")

    def _outcomes(self, batch: list[Op]) -> None:
        """Errors classified, health, ``on_commit`` (``_settle``)."""
        down = None
        committed = False
        for op in batch:
            if op.error is None:
                committed = True
                if op.events and self.on_commit is not None:
                    try:
                        self.on_commit(op.events)
                    except Exception:   # noqa: BLE001 - a hook's bug must not end the writer
                        log.exception("store writer: the on_commit hook failed")
                continue
            reason = self.unavailable_reason(op.error)
            if reason is not None:
                down = reason
                if not isinstance(op.error, StoreUnavailableError):
                    cause, op.error = op.error, StoreUnavailableError(reason)
                    op.error.__cause__ = cause
        if down is not None:
            self.health.failed(down, write=True)
        elif committed:
            self.health.succeeded(write=True)

    def unavailable_reason(self, exc: BaseException) -> str | None:
        if isinstance(exc, StoreUnavailableError):
            return exc.reason
        try:
            return self._unavailable(exc)
        except Exception:   # noqa: BLE001 - a classifier bug must not end the writer
            return None

    def submit(self, op: Op) -> bool:
        """Queue ``op`` without waiting (its ``on_done`` tells the outcome); ``False``
        when the queue is full (``await self.send(op)`` then). Raises
        ``anyio.ClosedResourceError`` once the store is closing."""
        try:
            self._send.send_nowait(op)
        except anyio.WouldBlock:
            return False
        return True

    async def send(self, op: Op) -> None:
        """Queue ``op``, waiting for room (see ``submit``)."""
        await self._send.send(op)

    async def _write(self, fn: Callable[..., T], timeout: float | None = None,
                     bulk: Any = None) -> T:
        op = Op(fn, bulk=bulk)
        with anyio.move_on_after(timeout, shield=True) as scope:
            await self._send.send(op)
            await op.done.wait()   # shielded: the write happens anyway, see it through
        if scope.cancelled_caught:
            raise TimeoutError("the store did not commit in time")
        if op.error is not None:
            raise op.error
        self._observe(op.result)
        return cast(T, op.result)

    async def _read(self, fn: Callable[[C], T]) -> T:
        async with self._read_limiter, store_work:
            conn = self._readers.popleft()
            try:
                self._before_read()
                if not self._usable(conn):
                    conn = await anyio.to_thread.run_sync(self._reconnect)
                try:
                    result = await anyio.to_thread.run_sync(fn, conn)
                except Exception as exc:
                    if not self._read_lost(conn, exc):
                        raise
                    log.info("a read's connection was lost (%s); the read is retried "
                             "on a new one", first_line(exc))
                    conn = await anyio.to_thread.run_sync(self._reconnect)
                    result = await anyio.to_thread.run_sync(fn, conn)
            except Exception as exc:
                reason = self.unavailable_reason(exc)
                if reason is None:
                    raise
                self.health.failed(reason, write=False)
                if isinstance(exc, StoreUnavailableError):
                    raise
                raise StoreUnavailableError(reason) from exc
            finally:
                self._readers.append(conn)
        self.health.succeeded(write=False)
        return result

    async def probe(self, timeout: float = 2.0) -> str | None:
        """``None`` when the store answers within ``timeout`` and its last write did not
        fail; else the reason (``/health?deep=1``). A store down for its writes is
        asked again with an empty write, so a probe also sees it come back."""
        try:   # in the store's task group: a store that hangs holds no asker
            return await self.bounded.ask("probe", self._probe, timeout)
        except TimeoutError:
            return f"no answer within {timeout:g} s"

    async def _probe(self) -> str | None:
        try:
            if not self.health.up:
                await self._write(lambda *args: None)
            await self._ping()
        except StoreUnavailableError as exc:
            return exc.reason
        return self.health.reason
