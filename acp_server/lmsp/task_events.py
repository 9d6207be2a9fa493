"""A task's committed events as a stream: what ``GET /lmsp/v1/tasks/{id}/events``
(and a response's stream) sends.

    async for rows in batches(store, hub, task_id, last=-1, keepalive_s=15, closed=stop):
        if not rows:
            ...                   # a keep-alive is due
        for event in rows: ...    # in order, each once; the last batch ends with the
                                  # terminal event

Contracts (``LmspService.open_events`` checks the cursor first: §6.4):

* Batches of consecutive committed events after ``last`` (a sequence number, ``-1``
  for all), read ``PAGE`` at a time from the store, then from the live ``hub`` as
  they commit (the watch is registered before the first read: nothing committed in
  between is missed); ``[]`` when ``keepalive_s`` passed with nothing new.
* The iteration ends after the batch holding the terminal event, when ``closed`` is
  set (the service stops), or when the task went away while streaming (deleted, or
  its events after ``last`` purged): a client that comes back with its cursor gets
  the 404 or 410.
* A store outage never ends the stream: it waits for the store (a capped backoff,
  keep-alives meanwhile) and reads on from where it was.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Literal

import anyio

from acp_server.lmsp.wire import TERMINAL_EVENTS
from acp_server.store.errors import Backoff, StoreUnavailableError
from acp_server.store.hub import Hub
from acp_server.store.tasks import TERMINAL, CommittedEvent, TaskStore

PAGE = 256


async def batches(store: TaskStore, hub: Hub, task_id: str, last: int, *,
                  keepalive_s: float, closed: anyio.Event
                  ) -> AsyncIterator[list[CommittedEvent]]:
    """See the module contract."""
    backoff = Backoff(0.05, 5.0)
    with hub.watch(task_id) as watch:   # registered before the first read
        rows: list[CommittedEvent] | None = None
        while not closed.is_set():
            from_store = rows is None
            if rows is None:
                try:
                    rows = await store.read_events(task_id, last, PAGE)
                except StoreUnavailableError:   # the stream waits for the store
                    if not await watch.wait(backoff.next()):
                        yield []   # a keep-alive meanwhile
                    continue
                backoff.reset()
            for i, event in enumerate(rows):
                if event.type in TERMINAL_EVENTS:
                    yield rows[:i + 1]
                    return
            if rows:
                yield rows
                last = rows[-1].seq
            if from_store and len(rows) == PAGE:
                rows = None
                continue
            if from_store and not rows:
                after = await _after_an_empty_read(store, task_id, last)
                if after == "gone":
                    return   # deleted, or its events purged, while streaming
                if after == "finished":
                    rows = None   # it ended since that read: its last events
                    continue
            rows = watch.take(last)
            if rows == []:
                if not await watch.wait(keepalive_s):
                    yield []
                rows = watch.take(last)


async def _after_an_empty_read(store: TaskStore, task_id: str, last: int
                               ) -> Literal["gone", "finished", "live"]:
    """What a read with nothing after ``last`` means. ``gone``: deleted while
    streaming (``DELETE /responses/{id}``), or finished with its events after ``last``
    purged (retention); the stream ends. ``finished``: it ended, and wrote its last
    events, between that read and this one (another instance runs it, or a notice
    came late): read them. ``live``: wait for the next events."""
    try:
        record = await store.get_task(task_id)
        if record is None:
            return "gone"
        if record.status not in TERMINAL or last >= record.next_seq - 1:
            return "live"
        # finished, so every event is committed: none after ``last`` is a purge
        return "finished" if await store.read_events(task_id, last, 1) else "gone"
    except StoreUnavailableError:
        return "live"   # the next read tells
