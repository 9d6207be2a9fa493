"""One reader of a session's event bus (``bridge.bus``): a bounded queue of frames
with the bus's policy on top.

    subscription = bus.subscribe(last_event_id=12, epoch=bus.epoch)
    async for event in subscription:   # replayed events, replay_complete, then live
        send(event.encoded(frame))

Contracts (the bus's module docstring has the whole policy): bus events are counted
against ``max_queued`` and ``max_queued_bytes``, replayed history and control frames
take no room; a reader falling behind gets one ``slow_client_warning``, then
``client_evicted`` and nothing after. On a held bus (a durable journal) the reader is
fed from the ring as it reads (``_top_up``), released events only, in id order, with
no gap and no duplicate (``tests/bridge/test_bus_properties.py``). The bus's private
state is read here on purpose: the two are one mechanism split for size.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import anyio

from bridge import events as ev
from bridge.events import Event
from bridge.fifo import BoundedFifo
from bridge.wakeup import Wakeup

if TYPE_CHECKING:
    from bridge.bus import EventBus


class Subscription(BoundedFifo[Event]):
    """An async iterator of ``Event`` frames for one reader. ``close()`` ends it.

    A ``BoundedFifo`` of events with the bus's policy on top: bus events are counted,
    replayed history and control frames take no room; a reader falling behind is
    warned, then evicted. ``epoch`` is the bus epoch its event ids belong to;
    ``wakeup`` (optional) is set whenever a frame arrives or the subscription ends,
    for a reader that waits on several sources at once."""

    __slots__ = ("_bus", "epoch", "_warned", "last_queued_id", "evicted_reason", "stalled",
                 "skip_through", "next_id", "_evict_at")

    def __init__(self, bus: EventBus, max_queued: int, max_queued_bytes: int,
                 wakeup: Wakeup | None = None) -> None:
        super().__init__(max_queued, max_queued_bytes, wakeup=wakeup, low_water=Wakeup())
        self._bus = bus
        self.epoch = bus.epoch
        self._warned = False
        self.last_queued_id = 0
        self.evicted_reason: str | None = None
        self.stalled = False   # did not drain within FLOW_WAIT_S: publishers do not wait
        # Held events up to this id were replayed or are behind the reader's cursor
        # (a durable bus releases them later): not pushed again.
        self.skip_through = 0
        # A held bus's reader is fed from the ring (``_top_up``): the next id it needs.
        self.next_id = bus._released_id + 1
        ring = bus._ring.maxlen or 1   # ``evict_at``: fixed for the subscription's life
        self._evict_at = min(max_queued + ring // 4, ring)

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
    def _lagging(self) -> bool:
        return self._bus.hold and self.next_id <= self._bus._released_id

    async def wait(self) -> bool:
        if not self._entries and self._lagging():
            self._top_up()
        return await BoundedFifo.wait(self)

    def get_nowait(self) -> Event | None:
        event = BoundedFifo.get_nowait(self)
        if self.items * 4 <= self.max_items and self._lagging():  # type: ignore[operator]
            self._top_up()   # a held bus: fed from the ring as the reader reads
        if self.stalled:
            self._unstall_when_drained()
        return event

    def take(self, max_bytes: int) -> list[Event]:
        """Ready frames, in order, until their sizes reach ``max_bytes`` (at least one
        when any is ready): what ``get_nowait`` gives one by one (a held bus's reader
        topped up from the ring as it empties), in one call (an SSE write's batch)."""
        out: list[Event] = []
        total = 0
        entries, sizes = self._entries, self._sizes
        while total < max_bytes:
            if not entries:
                if self._lagging():
                    self._top_up()
                if not entries:
                    break
            event = entries.popleft()
            size = sizes.popleft()
            out.append(event)
            if size >= 0:   # counted (an uncounted frame: -1)
                self.items -= 1
                self.nbytes -= size
            total += event.size
        self.taken += len(out)
        if self.stalled:
            self._unstall_when_drained()
        low = self._low
        if low is not None and low._event is not None and not self.half_full():
            low.set()   # (Wakeup.waiting without the call, as get_nowait)
        return out

    wait_ready = wait
    receive_nowait = get_nowait

    @property
    def ready(self) -> bool:
        """A frame is queued."""
        if not self._entries and self._lagging():
            self._top_up()
        return bool(self._entries)

    def _top_up(self) -> None:
        """A held bus (``EventBus.hold``): released events from the ring, up to half of
        the bounds. A reader the ring has lapped is evicted (``queue_overflow``)."""
        bus = self._bus
        if self.closed:
            return
        earliest = bus.earliest_available_id
        if self.next_id < earliest:
            self._evict("queue_overflow")
            return
        ring, half_items, max_bytes = bus._ring, (self.max_queued + 1) // 2, self.max_queued_bytes
        end = bus._released_id + 1 - earliest
        # What fits below half the item bound, read from the ring's nearer end: a reader
        # follows close behind the newest event, and skipping the ring from its oldest
        # cost O(ring) per top-up (up to ~8,000 steps for ~64 events).
        while True:
            start = self.next_id - earliest
            stop = min(end, start + half_items - self.items)
            if stop <= start:
                return
            n = len(ring)
            if n - stop < start:
                events = list(itertools.islice(reversed(ring), n - stop, n - start))
                events.reverse()
            else:
                events = list(itertools.islice(ring, start, stop))
            for event in events:
                if self.nbytes * 2 >= max_bytes:   # half_full(), the byte bound
                    return
                self.next_id = event.id + 1  # type: ignore[operator]
                self._push(event)
                if self.closed:
                    return

    def _unstall_when_drained(self) -> None:
        """A ``stalled`` reader is waited for again once it drained to three eighths of
        its bound (where a waiting publisher goes on): one that trickles stays stalled,
        or a publisher would wait for it at every few events (``bridge.bus``). A held
        bus's reader is measured by its committed backlog, as it was stalled: what the
        journal has not committed is not the reader's to drain."""
        if (self.behind() * 8 <= self._evict_at * 3) if self._bus.hold \
                else self.below_low_mark():
            self.stalled = False

    def behind(self) -> int:
        """Released events this reader has not taken yet (a held bus)."""
        return self._bus._released_id - self.next_id + 1 + self.items

    def _flush_lag(self) -> None:
        """Everything released that it still lacks, uncounted (the bus stops holding or
        closes: bounded by the ring)."""
        bus = self._bus
        earliest = bus.earliest_available_id
        start = max(self.next_id, earliest)
        for event in itertools.islice(bus._ring, start - earliest,
                                      bus._released_id + 1 - earliest):
            if event.id > self.skip_through:  # type: ignore[operator]
                self.put_uncounted(event)
        self.next_id = bus._released_id + 1

    def close(self) -> None:
        self._bus._detach(self)
        BoundedFifo.close(self)

    # -- bus side ------------------------------------------------------------------
    async def wait_drained(self, deadline: float) -> bool:
        """Wait until the queue is down to three eighths of its bounds (it was half
        full: the reader took an eighth, not one frame); ``False`` if the reader did
        not by ``deadline`` (it is then ``stalled``)."""
        low = self._low
        assert low is not None
        with anyio.move_on_at(deadline):
            while not self.closed and not self.below_low_mark():
                await low.wait()
            return True
        self.stalled = True
        return False

    def _push(self, event: Event) -> None:
        if event.id <= self.skip_through:  # type: ignore[operator]
            return
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
            self._warn(self.items, self.max_queued, self.nbytes)

    def _warn(self, queue_size: int, max_queued: int, queued_bytes: int) -> None:
        """One ``slow_client_warning``; its ``threshold`` names the bound(s) at 75 %,
        as the peer's (``frames``, ``bytes`` or ``frames_and_bytes``; ``frames`` for a
        held reader warned before its eviction below both)."""
        self._warned = True
        frames = queue_size * 4 >= max_queued * 3
        nbytes = queued_bytes * 4 >= self.max_queued_bytes * 3
        threshold = "frames_and_bytes" if frames and nbytes else "bytes" if nbytes else "frames"
        self.put_uncounted(Event(None, ev.SLOW_CLIENT_WARNING, ev.SlowClientWarning(
            queue_size=queue_size, max_queued=max_queued, last_event_id=self.last_queued_id,
            queued_bytes=queued_bytes, max_queued_bytes=self.max_queued_bytes,
            threshold=threshold)))

    # -- a held bus: the backlog is what the reader has not taken of the ring ----------
    def evict_at(self) -> int:
        """A held bus: the backlog (``behind``) past which this reader is evicted, its
        queue plus a commit's worth (a quarter ring), at most the ring."""
        return self._evict_at

    def lag(self) -> int:
        """Published events this reader has not taken, committed or not (a held bus)."""
        return self._bus._last_id - self.next_id + 1 + self.items

    def _check_backlog(self, released: int) -> None:
        """A held bus, after a release of ``released`` events: one
        ``slow_client_warning`` once ``behind`` reaches 75 % of ``evict_at``, re-armed
        when the reader had drained below 37.5 % before a release (as the push mode
        does for its queue)."""
        behind, limit = self.behind(), self.evict_at()
        if self._warned and (behind - released) * 8 < limit * 3:
            self._warned = False
        if not self._warned and behind * 4 >= limit * 3:
            self._warn_held()

    def _warn_held(self) -> None:
        bus = self._bus
        earliest = bus.earliest_available_id
        backlog = itertools.islice(bus._ring, max(self.next_id - earliest, 0),
                                   max(bus._released_id + 1 - earliest, 0))
        self._warn(self.behind(), self.evict_at(),
                   self.nbytes + sum(event.size for event in backlog))

    def _evict(self, reason: str) -> None:
        if self._bus.hold and not self._warned and not self.closed:
            self._warn_held()   # a held reader is warned before it is evicted, always
        self.evicted_reason = reason
        self._bus._detach(self)
        if self._bus.on_evict is not None:
            self._bus.on_evict()
        self.put_uncounted(Event(None, ev.CLIENT_EVICTED, ev.ClientEvicted(
            reason=reason, dropped_after=self.last_queued_id, queue_size=self.items,
            max_queued=self.max_queued, queued_bytes=self.nbytes,
            max_queued_bytes=self.max_queued_bytes)))
        BoundedFifo.close(self)
