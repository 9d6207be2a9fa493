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
  order, then the callers wake; ``on_transition`` gets each status a write moved a
  task to (``moves_of``), in the caller's task.
* ``open()`` (what ``async with store`` enters) connects, runs the writer loops and
  the engine's background work in one task group opened with ``async with``, and on
  the way out lets the loops drain what is queued before disconnecting.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any, Generic, Self, TypeVar, cast

import anyio
import anyio.abc

from acp_server.store.tasks import CommittedEvent, moves_of

MAX_BATCH = 256
QUEUE_SIZE = 4096

C = TypeVar("C")   # the engine's connection
T = TypeVar("T")


@dataclasses.dataclass(eq=False)
class Op:
    """One queued write: ``fn(conn, events_out, batch_state)`` and what came of it."""

    fn: Callable[..., Any]
    done: anyio.Event = dataclasses.field(default_factory=anyio.Event)
    result: Any = None
    error: BaseException | None = None
    events: list[CommittedEvent] = dataclasses.field(default_factory=list)
    bulk: Any = None   # engine-specific: an operation the batch may run in bulk


class GroupCommitStore(Generic[C]):
    """The writer, the reader pool and the lifecycle; engines fill in the hooks."""

    def __init__(self, *, on_commit: Callable[[list[CommittedEvent]], None] | None,
                 group_commit: bool, writers: int = 1, readers: int = 2) -> None:
        self.on_commit = on_commit
        self.writers = writers
        self.on_transition: Callable[[str], None] | None = None
        self.group_commit = group_commit
        self.commits = 0        # transactions committed (for the benchmark and tests)
        self._readers: deque[C] = deque()
        self._read_limiter = anyio.CapacityLimiter(readers)
        # the worker threads the writer loops (and an engine's listener) may hold
        self._write_limiter = anyio.CapacityLimiter(writers)
        self._send, self._receive = anyio.create_memory_object_stream[Op](QUEUE_SIZE)
        self._exit: contextlib.AsyncExitStack | None = None

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

    def _usable(self, conn: C) -> bool:
        """Whether a reader connection still works (else ``_reconnect`` replaces it)."""
        return True

    def _reconnect(self) -> C:
        """A new reader connection (a worker thread)."""
        raise NotImplementedError

    # -- lifecycle -----------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def open(self) -> AsyncIterator[Self]:
        await self._connect_all()
        try:
            async with anyio.create_task_group() as tg:
                for index in range(self.writers):
                    tg.start_soon(self._write_loop, index)
                await self._background(tg)
                try:
                    yield self
                finally:
                    with anyio.CancelScope(shield=True):
                        await self._closing()
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
        async for first in self._receive:   # shared by the writers; ends when closed
            batch = [first]
            while self.group_commit and len(batch) < MAX_BATCH:
                try:
                    batch.append(self._receive.receive_nowait())
                except (anyio.WouldBlock, anyio.EndOfStream):
                    break
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self._run_batch, index, batch,
                                               limiter=self._write_limiter)
            if self.on_commit is not None:
                for op in batch:
                    if op.error is None and op.events:
                        self.on_commit(op.events)
            for op in batch:
                op.done.set()

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
        if self.on_transition is not None:
            for status in moves_of(op.result):
                self.on_transition(status)
        return cast(T, op.result)

    async def _read(self, fn: Callable[[C], T]) -> T:
        async with self._read_limiter:
            conn = self._readers.popleft()
            try:
                if not self._usable(conn):
                    conn = await anyio.to_thread.run_sync(self._reconnect)
                return await anyio.to_thread.run_sync(fn, conn)
            finally:
                self._readers.append(conn)
