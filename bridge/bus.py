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


class Subscription(BoundedFifo[Event]):
    """An async iterator of ``Event`` frames for one reader. ``close()`` ends it.

    A ``BoundedFifo`` of events with the bus's policy on top: bus events are counted,
    replayed history and control frames take no room; a reader falling behind is
    warned, then evicted. ``epoch`` is the bus epoch its event ids belong to;
    ``wakeup`` (optional) is set whenever a frame arrives or the subscription ends,
    for a reader that waits on several sources at once."""

    __slots__ = ("_bus", "epoch", "_warned", "last_queued_id", "evicted_reason", "stalled")

    def __init__(self, bus: EventBus, max_queued: int, max_queued_bytes: int,
                 wakeup: Wakeup | None = None) -> None:
        super().__init__(max_queued, max_queued_bytes, wakeup=wakeup, low_water=Wakeup())
        self._bus = bus
        self.epoch = bus.epoch
        self._warned = False
        self.last_queued_id = 0
        self.evicted_reason: str | None = None
        self.stalled = False   # did not drain within FLOW_WAIT_S: publishers do not wait

    @property
    def max_queued(self) -> int:
        return self.max_items  # type: ignore[return-value]

    @property
    def max_queued_bytes(self) -> int:
        return self.max_bytes  # type: ignore[return-value]

    # -- reader side -------------------------------------------------------------
    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Event:
        if not await self.wait():
            raise StopAsyncIteration
        event = self.get_nowait()
        assert event is not None
        return event

    # ``wait_ready()``: a frame is ready (``True``) or the stream has ended (``False``);
    # consumes nothing, so it may be cancelled (e.g. by a heartbeat timeout).
    # ``receive_nowait()``: the next frame if one is ready, else ``None``.
    wait_ready = BoundedFifo.wait
    receive_nowait = BoundedFifo.get_nowait

    @property
    def ready(self) -> bool:
        """A frame is queued."""
        return bool(self._entries)

    def close(self) -> None:
        self._bus._detach(self)
        BoundedFifo.close(self)

    # -- bus side ------------------------------------------------------------------
    async def wait_drained(self, deadline: float) -> bool:
        """Wait until the queue is below half of its bounds; ``False`` if the reader
        did not drain by ``deadline`` (it is then ``stalled``)."""
        low = self._low
        assert low is not None
        with anyio.move_on_at(deadline):
            while not self.closed and self.half_full():
                await low.wait()
            return True
        self.stalled = True
        return False

    def _push(self, event: Event) -> None:
        backlog = self.nbytes   # the byte bound applies to what precedes the newest
        if not self.put_nowait(event, event.size):
            if not self.closed:
                self._evict("queue_overflow" if self.overflow() == "items"
                            else "queue_bytes_overflow")
            return
        self.last_queued_id = event.id  # type: ignore[assignment]  # bus events have ids
        if self._warned:   # re-armed once below 37.5 % of both bounds
            if self.items * 8 < self.max_items * 3 and self.nbytes * 8 < self.max_bytes * 3:  # type: ignore[operator]
                self._warned = False
        elif self.items * 4 >= self.max_items * 3 or backlog * 4 >= self.max_bytes * 3:  # type: ignore[operator]
            self._warned = True
            self.put_uncounted(Event(None, ev.SLOW_CLIENT_WARNING, ev.SlowClientWarning(
                queue_size=self.items, max_queued=self.max_queued,
                last_event_id=self.last_queued_id, queued_bytes=self.nbytes,
                max_queued_bytes=self.max_queued_bytes, threshold=0.75)))

    def _evict(self, reason: str) -> None:
        self.evicted_reason = reason
        self._bus._detach(self)
        if self._bus.on_evict is not None:
            self._bus.on_evict()
        self.put_uncounted(Event(None, ev.CLIENT_EVICTED, ev.ClientEvicted(
            reason=reason, dropped_after=self.last_queued_id, queue_size=self.items,
            max_queued=self.max_queued, queued_bytes=self.nbytes,
            max_queued_bytes=self.max_queued_bytes)))
        BoundedFifo.close(self)


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
            if not subscriber.half_full():
                subscriber.stalled = False   # it drained: waited for again next time
                continue
            if subscriber.stalled:
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
                subscription.put_uncounted(frame)
        if self.closed:
            BoundedFifo.close(subscription)
        else:
            self._subscribers.append(subscription)
        return subscription

    def close(self) -> None:
        """End every subscription (after they drain what is queued)."""
        self.closed = True
        subscribers, self._subscribers = self._subscribers, []
        for subscriber in subscribers:
            BoundedFifo.close(subscriber)

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
