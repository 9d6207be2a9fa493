"""Live fan-out of committed events to in-process subscribers.

    with hub.watch(task_id) as watch:       # register BEFORE reading the store
        rows = await store.read_events(task_id, cursor, 256)
        ...
        fresh = watch.take(last)            # contiguous events after ``last`` or None
        await watch.wait(15)                # woken by the next publish

Contracts: ``publish`` is called by the store after COMMIT only (so anything a
subscriber sees can be replayed), with a commit's events, of one task or of several
(a recovery): each watch gets those of its task. A watch keeps at most ``WINDOW`` recent events;
when they are not contiguous with what the subscriber has (a gap, or it fell behind),
``take`` answers ``None`` and the subscriber re-reads the store — notifications are
hints, the store is the truth. Tasks without watchers cost nothing. ``poke`` (events
committed by another instance, or the polling fallback) makes the next ``take``
answer ``None``: the subscriber re-reads the store by sequence number.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Iterator

import anyio

from acp_server.store.tasks import CommittedEvent

WINDOW = 512


class Watch:
    __slots__ = ("recent", "stale", "_wakeup")

    def __init__(self) -> None:
        self.recent: deque[CommittedEvent] = deque(maxlen=WINDOW)
        self.stale = False
        self._wakeup = anyio.Event()

    def poke(self) -> None:
        """Something may have been committed elsewhere: re-read the store."""
        self.stale = True
        self._wakeup.set()

    def push(self, events: list[CommittedEvent]) -> None:
        self.recent.extend(events)
        self._wakeup.set()

    def take(self, last: int) -> list[CommittedEvent] | None:
        """Events with seq > ``last``, if the window holds them without a gap."""
        if self.stale:
            self.stale = False
            return None
        recent = self.recent
        if not recent or recent[-1].seq <= last:
            return []
        out = [e for e in recent if e.seq > last]
        expected = last + 1
        for event in out:
            if event.seq != expected:
                return None
            expected += 1
        return out

    async def wait(self, timeout: float) -> bool:
        """``True`` when woken by a publish, ``False`` on timeout."""
        with anyio.move_on_after(timeout):
            await self._wakeup.wait()
            self._wakeup = anyio.Event()
            return True
        return False


class Hub:
    def __init__(self) -> None:
        self._watches: dict[str, set[Watch]] = {}

    def publish(self, events: list[CommittedEvent]) -> None:
        if not events:
            return
        task_id = events[0].task_id
        if any(event.task_id != task_id for event in events):
            by_task: dict[str, list[CommittedEvent]] = {}
            for event in events:   # one commit of several tasks (a recovery)
                by_task.setdefault(event.task_id, []).append(event)
            for task_id, own in by_task.items():
                self._push(task_id, own)
            return
        self._push(task_id, events)

    def _push(self, task_id: str, events: list[CommittedEvent]) -> None:
        watches = self._watches.get(task_id)
        if watches:
            for watch in watches:
                watch.push(events)

    @contextlib.contextmanager
    def watch(self, task_id: str) -> Iterator[Watch]:
        watch = Watch()
        self._watches.setdefault(task_id, set()).add(watch)
        try:
            yield watch
        finally:
            watches = self._watches[task_id]
            watches.discard(watch)
            if not watches:
                del self._watches[task_id]

    def poke(self, task_id: str) -> None:
        for watch in self._watches.get(task_id, ()):
            watch.poke()

    def watched(self) -> list[str]:
        return list(self._watches)

    def close(self) -> None:
        """Wake every watcher (shutdown); they see the service closed and end."""
        for watches in self._watches.values():
            for watch in watches:
                watch.push([])

    def watchers(self, task_id: str) -> int:
        return len(self._watches.get(task_id, ()))
