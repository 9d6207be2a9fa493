"""A session's event bus: ids from 1, an epoch per bus, a bounded ring, replay, and
bounded subscriber queues.

    bus = EventBus(ring_size=8000, max_subscribers=64)
    bus.publish(TURN_COMPLETE, TurnComplete(session_id=sid, stop_reason="end_turn",
                                            prompt_id=pid), prompt_id=pid)

    subscription = bus.subscribe(last_event_id=12, epoch=bus.epoch)
    async for event in subscription:   # replayed events, replay_complete, then live
        send(wire.envelope(event))

Contracts:

* ``publish`` and ``subscribe`` are synchronous: no event is published between a
  subscriber's replay snapshot and its first live event, so nothing is missed or
  doubled.
* Without a cursor a subscriber gets live events only. With one it gets every ring
  event after the cursor, then ``replay_complete``. When the cursor cannot be
  honoured it first gets ``state_resync_required`` (``epoch_reset`` for a foreign
  epoch or a cursor ahead of the bus, ``ring_evicted`` when events after the cursor
  are gone, ``replay_budget_exceeded`` when the replay is over its byte budget) and
  then whatever the ring still holds.
* Each event is encoded once, at ``publish`` (``bridge.wire.envelope``, kept on the
  event); its length is the event's ``size``, what the bounds below count.
* A subscriber's queue is a ``bridge.fifo.BoundedFifo``: it holds at most
  ``max_queued`` frames, and at most ``max_queued_bytes`` bytes besides its newest
  frame (so one frame larger than the byte bound reaches a
  reader that reads). At 75 % of either bound the subscriber gets one
  ``slow_client_warning`` (re-armed below 37.5 %); past a bound it gets
  ``client_evicted`` and its stream ends. A slow reader never blocks ``publish``.
* Flow control: a publisher that can wait (the in-process agent's updates, the
  prompt echo) awaits ``wait_for_readers()`` between events. It waits while a reader
  holds half of either bound or more, until that reader drains below half, but at
  most ``FLOW_WAIT_S`` in all: a reader that has not drained by then is ``stalled``
  and not waited for again until it does (it is warned and evicted as above). So a
  reader that keeps up is never evicted by a burst, and readers that stopped cost a
  publisher ``FLOW_WAIT_S`` once, however many they are.
"""

from __future__ import annotations

import itertools
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

import anyio

from bridge import events as ev
from bridge import wire
from bridge.errors import SubscriberLimitExceededError
from bridge.events import Event
from bridge.fifo import BoundedFifo
from bridge.wakeup import Wakeup

REPLAY_BUDGET_BYTES = 8 * 1024 * 1024
FLOW_WAIT_S = 0.5


class Subscription:
    """An async iterator of ``Event`` frames for one reader. ``close()`` ends it.

    ``epoch`` is the bus epoch its event ids belong to; ``wakeup`` (optional) is set
    whenever a frame arrives or the subscription ends, for a reader that waits on
    several sources at once."""

    def __init__(self, bus: EventBus, max_queued: int, max_queued_bytes: int,
                 wakeup: Wakeup | None = None) -> None:
        self._bus = bus
        self.epoch = bus.epoch
        # Bus events are counted; replayed history and control frames take no room.
        self._fifo: BoundedFifo[Event] = BoundedFifo(max_queued, max_queued_bytes,
                                                     wakeup=wakeup)
        self.max_queued = max_queued
        self.max_queued_bytes = max_queued_bytes
        self._warned = False
        self.last_queued_id = 0
        self.evicted_reason: str | None = None
        self.stalled = False   # did not drain within FLOW_WAIT_S: publishers do not wait
        self._drained = Wakeup()

    # -- reader side -------------------------------------------------------------
    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Event:
        if not await self.wait_ready():
            raise StopAsyncIteration
        event = self.receive_nowait()
        assert event is not None
        return event

    async def wait_ready(self) -> bool:
        """Wait until a frame is ready (``True``) or the stream has ended (``False``).
        Consumes nothing, so it may be cancelled (e.g. by a heartbeat timeout)."""
        return await self._fifo.wait()

    def receive_nowait(self) -> Event | None:
        """The next frame if one is ready, else ``None``."""
        event = self._fifo.get_nowait()
        if event is not None and event.id is not None:
            if self._warned and self._below_rearm():
                self._warned = False
            if not self.half_full():
                self.stalled = False
                self._drained.set()
        return event

    @property
    def ready(self) -> bool:
        """A frame is queued."""
        return len(self._fifo) > 0

    @property
    def ended(self) -> bool:
        return self._fifo.ended

    def close(self) -> None:
        self._bus._detach(self)
        self._end()

    # -- bus side ------------------------------------------------------------------
    def half_full(self) -> bool:
        return (self._fifo.items * 2 >= self.max_queued
                or self._fifo.nbytes * 2 >= self.max_queued_bytes)

    async def wait_drained(self, deadline: float) -> bool:
        """Wait until the queue is below half of its bounds; ``False`` if the reader
        did not drain by ``deadline`` (it is then ``stalled``)."""
        with anyio.move_on_at(deadline):
            while not self._fifo.closed and not self.stalled and self.half_full():
                await self._drained.wait()
            return True
        self.stalled = True
        return False

    def _end(self) -> None:
        self._fifo.close()
        self._drained.set()

    def _below_rearm(self) -> bool:
        return (self._fifo.items * 8 < self.max_queued * 3
                and self._fifo.nbytes * 8 < self.max_queued_bytes * 3)

    def _push(self, event: Event) -> None:
        fifo = self._fifo
        if fifo.closed:
            return
        backlog = fifo.nbytes   # the byte bound applies to what precedes the newest
        if not fifo.put_nowait(event, event.size):
            self._evict("queue_overflow" if fifo.overflow() == "items" else "queue_bytes_overflow")
            return
        self.last_queued_id = event.id  # type: ignore[assignment]  # bus events have ids
        if not self._warned and (fifo.items * 4 >= self.max_queued * 3
                                 or backlog * 4 >= self.max_queued_bytes * 3):
            self._warned = True
            fifo.put_uncounted(Event(None, ev.SLOW_CLIENT_WARNING, ev.SlowClientWarning(
                queue_size=fifo.items, max_queued=self.max_queued,
                last_event_id=self.last_queued_id, queued_bytes=fifo.nbytes,
                max_queued_bytes=self.max_queued_bytes, threshold=0.75)))

    def _evict(self, reason: str) -> None:
        self.evicted_reason = reason
        self._bus._detach(self)
        if self._bus.on_evict is not None:
            self._bus.on_evict()
        fifo = self._fifo
        fifo.put_uncounted(Event(None, ev.CLIENT_EVICTED, ev.ClientEvicted(
            reason=reason, dropped_after=self.last_queued_id, queue_size=fifo.items,
            max_queued=self.max_queued, queued_bytes=fifo.nbytes,
            max_queued_bytes=self.max_queued_bytes)))
        self._end()


class EventBus:
    def __init__(self, *, ring_size: int = 8000, max_subscribers: int = 64,
                 max_queued: int = 256, max_queued_bytes: int = 2 * 1024 * 1024,
                 flow_wait_s: float = FLOW_WAIT_S, session_id: str = "",
                 on_evict: Callable[[], None] | None = None,
                 epoch: str | None = None) -> None:
        """``epoch``: the epoch to continue (a restored session's); a fresh one by
        default."""
        self.flow_wait_s = flow_wait_s
        self.epoch = epoch or str(uuid.uuid4())
        self.on_evict = on_evict   # called once per evicted subscriber
        self.session_id = session_id
        self._ring: deque[Event] = deque(maxlen=ring_size)
        self._last_id = 0
        self._subscribers: list[Subscription] = []
        self.max_subscribers = max_subscribers
        self.max_queued = max_queued
        self.max_queued_bytes = max_queued_bytes
        self.closed = False

    @property
    def last_event_id(self) -> int:
        return self._last_id

    @property
    def subscriber_count(self) -> int:
        return len(self._subscribers)

    @property
    def earliest_available_id(self) -> int:
        return self._ring[0].id if self._ring else self._last_id + 1  # type: ignore[return-value]

    def ring_events(self) -> list[Event]:
        """The events the ring still holds, oldest first."""
        return list(self._ring)

    def publish(self, type_: str, data: Any, *, prompt_id: str | None = None,
                originator_client_id: str | None = None) -> Event | None:
        """Store and fan out one event. After ``close()`` it is dropped (``None``)."""
        if self.closed:
            return None
        self._last_id += 1
        event = Event(self._last_id, type_, data, prompt_id=prompt_id,
                      originator_client_id=originator_client_id)
        event.size = len(wire.envelope(event))   # encoded once, here, for every door
        self._ring.append(event)
        for subscriber in tuple(self._subscribers):
            subscriber._push(event)
        return event

    async def wait_for_readers(self) -> None:
        """Flow control between events (see the module contracts): one wait of at
        most ``flow_wait_s`` (default ``FLOW_WAIT_S``) whatever the number of slow
        readers."""
        deadline: float | None = None
        for subscriber in tuple(self._subscribers):
            if subscriber.stalled or not subscriber.half_full():
                continue
            if deadline is None:
                deadline = anyio.current_time() + self.flow_wait_s
            await subscriber.wait_drained(deadline)

    def subscribe(self, *, last_event_id: int | None = None, epoch: str | None = None,
                  max_queued: int | None = None, wakeup: Wakeup | None = None) -> Subscription:
        if len(self._subscribers) >= self.max_subscribers:
            raise SubscriberLimitExceededError(self.session_id, self.max_subscribers)
        subscription = Subscription(self, max_queued or self.max_queued, self.max_queued_bytes,
                                    wakeup)
        if last_event_id is not None:
            for frame in self._replay_frames(last_event_id, epoch):
                subscription._fifo.put_uncounted(frame)
        if self.closed:
            subscription._end()
        else:
            self._subscribers.append(subscription)
        return subscription

    def close(self) -> None:
        """End every subscription (after they drain what is queued)."""
        self.closed = True
        subscribers, self._subscribers = self._subscribers, []
        for subscriber in subscribers:
            subscriber._end()

    def _detach(self, subscription: Subscription) -> None:
        try:
            self._subscribers.remove(subscription)
        except ValueError:
            pass

    def _replay_frames(self, cursor: int, epoch: str | None) -> list[Event]:
        earliest = self.earliest_available_id
        frames: list[Event] = []
        resync: tuple[str, str | None] | None = None
        if epoch is not None and epoch != self.epoch:
            resync = ("epoch_reset", "epoch_mismatch")
            replay = list(self._ring)
        elif cursor > self._last_id:
            resync = ("epoch_reset", None)
            replay = list(self._ring)
        elif cursor + 1 < earliest:
            resync = ("ring_evicted", None)
            replay = list(self._ring)
        else:
            replay = list(itertools.islice(self._ring, cursor + 1 - earliest, None))
        total = sum(event.size for event in replay)
        if total > REPLAY_BUDGET_BYTES:   # keep the newest events that fit the budget
            start = 0
            while start < len(replay) and total > REPLAY_BUDGET_BYTES:
                total -= replay[start].size
                start += 1
            replay = replay[start:]
            resync = ("replay_budget_exceeded", None)
        if resync is not None:
            frames.append(Event(None, ev.STATE_RESYNC_REQUIRED, ev.StateResyncRequired(
                reason=resync[0], detail=resync[1], last_delivered_id=cursor,
                earliest_available_id=replay[0].id if replay else self._last_id + 1)))  # type: ignore[arg-type]
        frames.extend(replay)
        last_replayed = replay[-1].id if replay else min(cursor, self._last_id)
        frames.append(Event(None, ev.REPLAY_COMPLETE, ev.ReplayComplete(
            last_replayed_event_id=last_replayed, last_event_id=last_replayed,  # type: ignore[arg-type]
            replayed_count=len(replay))))
        return frames
