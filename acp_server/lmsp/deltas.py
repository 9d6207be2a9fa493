"""A running task's events, batched into the store's commits.

    writer = DeltaWriter(store, task_id, in_progress_event(record), clock=time.time)
    async with anyio.create_task_group() as tg:
        tg.start_soon(writer.run)
        await writer.add([delta, ...])   # blocks past MAX_PENDING waiting events
        writer.hold_tail = True          # the turn ended: keep the last ones back
        writer.close()                   # ``run`` returns once drained
    final_events = writer.tail           # for the final transition's commit

Contracts (``acp_server.lmsp.runner`` is its one user):

* The first commit is the opening transition ``loading`` → ``running`` (``opening``:
  ``response.in_progress``, with the deltas of that time), ``FLUSH_S`` after the prompt
  went out; then a commit at most ``FLUSH_S`` after the first pending event, or as soon
  as ``FLUSH_EVENTS`` are pending. A turn that ends sooner never opens: the final
  transition carries the opening (one commit for the whole turn); ``opened`` says which
  happened, ``lost`` that a cancel committed first (nothing more is written).
* At most ``MAX_PENDING`` events wait (``add`` blocks beyond that): what the store has
  not taken is kept, never dropped.
* With ``hold_tail`` set before ``close``, the events pending at the close are left in
  ``tail`` for the caller's next commit instead of a commit of their own.
* Each write waits for the store (``persist``): an outage never fails the task. The
  events are appended only while the task is ``running`` or ``cancelling``.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio

from acp_server.lmsp.wire import AnyEvent
from acp_server.store.errors import persist
from acp_server.store.tasks import Finish, TaskStore

FLUSH_S = 0.05
FLUSH_EVENTS = 64
MAX_PENDING = 4096


class DeltaWriter:
    """Batches the events of one task's turn; see the module contract."""

    def __init__(self, store: TaskStore, task_id: str, opening: AnyEvent,
                 clock: Callable[[], float]) -> None:
        self.store = store
        self.task_id = task_id
        self.clock = clock
        self.opening = opening
        self.opened = False     # ``running`` committed
        self.lost = False       # the opening transition lost (a cancel came first)
        self.pending: list[AnyEvent] = []
        self.closed = False
        # Set before ``close``: the events pending at close are left in ``tail`` for the
        # caller's next commit (the final transition) instead of a commit of their own.
        self.hold_tail = False
        self.tail: list[AnyEvent] = []
        # Made when ``run`` starts (a turn that ends first, the common case, never
        # waits on them): pending is not empty (or closed, or to open); FLUSH_EVENTS
        # pending (or closed); set after each flush (``add`` waits on it past
        # MAX_PENDING, which only a running writer drains).
        self._some: anyio.Event | None = None
        self._full: anyio.Event | None = None
        self._space: anyio.Event | None = None

    async def add(self, drafts: list[AnyEvent]) -> None:
        while len(self.pending) >= MAX_PENDING and self._space is not None:
            await self._space.wait()
        self.pending.extend(drafts)
        if self._some is not None and self._full is not None:
            self._some.set()
            if len(self.pending) >= FLUSH_EVENTS:
                self._full.set()

    def close(self) -> None:
        self.closed = True
        if self._some is not None and self._full is not None:
            self._some.set()
            self._full.set()

    async def run(self, due: bool = False) -> None:
        """``due``: the opening is already due (``Runner._pump``'s first ``FLUSH_S``
        passed, or ``FLUSH_EVENTS`` piled up, before this started): no first wait."""
        self._some, self._full, self._space = anyio.Event(), anyio.Event(), anyio.Event()
        self._some.set()   # the opening is due
        if self.closed or len(self.pending) >= FLUSH_EVENTS:
            self._full.set()
        while True:
            await self._some.wait()
            if not due:
                with anyio.move_on_after(FLUSH_S):
                    await self._full.wait()
            due = False
            batch, self.pending = self.pending, []
            self._some, self._full = anyio.Event(), anyio.Event()
            if self.closed:
                self._some.set()
                self._full.set()
            space, self._space = self._space, anyio.Event()
            space.set()
            if self.closed and self.hold_tail:
                self.tail = batch + self.pending
                return
            # kept until the store takes them (``add`` blocks past MAX_PENDING)
            await self.write(batch)
            if self.closed and not self.pending:
                return

    async def write(self, batch: list[AnyEvent]) -> None:
        """``batch`` committed: with the opening transition first if not made yet."""
        if self.lost:
            return
        if not self.opened:
            opening = Finish(events=[self.opening, *batch])
            won = await persist(lambda: self.store.transition(
                self.task_id, ("loading",), "running", opening, now=self.clock()),
                what=f"lmsp task {self.task_id} → running")
            self.opened, self.lost = won is not None, won is None
        elif batch:
            await persist(lambda: self.store.append_events(
                self.task_id, batch, ("running", "cancelling")),
                what=f"lmsp task {self.task_id}: events")
