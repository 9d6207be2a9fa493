"""The one bounded FIFO: items queued for one reader, bounded in items and in bytes.

    fifo: BoundedFifo[bytes] = BoundedFifo(max_items=256, max_bytes=2 << 20)
    if not fifo.put_nowait(frame, len(frame)):   # past a bound: the producer decides
        ...                                      # (the bus evicts, a door drops)
    fifo.put_uncounted(control_frame)            # takes no room (replay, control frames)

    while await fifo.wait():                     # the reader; never consumes
        item = fifo.get_nowait()

Used by the session bus's subscriptions (``bridge.bus``) and by the ``/acp`` door's
reply streams, so both bound their readers the same way.

Contracts:

* ``put_nowait(item, size)`` counts the item and its ``size``; it is refused
  (``False``, nothing queued) once ``max_items`` counted items are queued, or once
  more than ``max_bytes`` bytes are queued before it. So one item larger than the
  byte bound still reaches a reader that reads, and a reader's backlog is at most
  ``max_bytes`` plus its newest item. ``None`` turns a bound off.
* ``put_uncounted(item)`` queues an item that takes no room and is never refused
  (until ``close()``): replayed history, stream-control frames.
* Items leave in order, only through ``get_nowait()`` or ``take_all()``; ``taken``
  counts them, so ``taken + len(fifo)`` is the number of items ever put: a reader
  that merges several sources can tell what was queued before something else.
  ``wait()`` consumes nothing, so cancelling it (a heartbeat timeout, a client gone)
  loses no item.
* After ``close()`` nothing is accepted; the reader still gets what is queued, then
  ``wait()`` answers ``False``.
* ``wakeup`` (a ``bridge.wakeup.Wakeup``, else the FIFO's own) is set on every put
  and on ``close()``: a reader of several sources passes one shared wake-up to each.
* ``low_water`` (a ``Wakeup``, optional) is set when a counted item leaves and the
  FIFO is below half of both bounds (``half_full()`` false) and on ``close()``: a
  producer that can wait (flow control) waits on it, until ``below_low_mark()``.
* Everything but ``wait()`` is synchronous: producers never block. A subclass adds a
  producer policy on top (``bridge.bus.Subscription``: warn, then evict).
* One FIFO serves every bounded reader queue, so its per-item cost is the hot path of
  every event stream: one call to put, one to get, no allocation beyond the entry.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

from bridge.wakeup import Wakeup

T = TypeVar("T")

_UNCOUNTED = -1


class BoundedFifo(Generic[T]):
    __slots__ = ("max_items", "max_bytes", "items", "nbytes", "closed", "taken", "_entries",
                 "_sizes", "_ready", "_low")

    def __init__(self, max_items: int | None, max_bytes: int | None, *,
                 wakeup: Wakeup | None = None, low_water: Wakeup | None = None) -> None:
        self.max_items = max_items
        self.max_bytes = max_bytes
        self.items = 0          # counted items queued
        self.nbytes = 0         # their bytes
        self.closed = False
        self.taken = 0          # items that left, counted or not: taken + len() were put
        # Items and their sizes side by side (no tuple per item: nothing for the cyclic
        # garbage collector to track on the hot path).
        self._entries: deque[T] = deque()
        self._sizes: deque[int] = deque()
        self._ready = wakeup if wakeup is not None else Wakeup()
        self._low = low_water

    def half_full(self) -> bool:
        """Half of either bound or more is taken."""
        return ((self.max_items is not None and self.items * 2 >= self.max_items)
                or (self.max_bytes is not None and self.nbytes * 2 >= self.max_bytes))

    def below_low_mark(self) -> bool:
        """At three eighths of both bounds or below: where a producer that waited for
        this reader goes on (flow control's hysteresis, ``bridge.bus``)."""
        return ((self.max_items is None or self.items * 8 <= self.max_items * 3)
                and (self.max_bytes is None or self.nbytes * 8 <= self.max_bytes * 3))

    def __len__(self) -> int:
        """Every queued item, counted or not."""
        return len(self._entries)

    # -- producers -----------------------------------------------------------------
    def overflow(self) -> str | None:
        """The bound a new counted item would break: ``"items"``, ``"bytes"`` or
        ``None`` when it fits."""
        if self.max_items is not None and self.items >= self.max_items:
            return "items"
        if self.max_bytes is not None and self.nbytes > self.max_bytes:
            return "bytes"
        return None

    def put_nowait(self, item: T, size: int) -> bool:
        # overflow() inlined: this runs once per event per subscriber
        if self.closed or (self.max_items is not None and self.items >= self.max_items) \
                or (self.max_bytes is not None and self.nbytes > self.max_bytes):
            return False
        self._entries.append(item)
        self._sizes.append(size)
        self.items += 1
        self.nbytes += size
        ready = self._ready
        if ready._event is not None:   # Wakeup.waiting, without the call: the hot path
            ready.set()
        return True

    def put_uncounted(self, item: T) -> bool:
        if self.closed:
            return False
        self._entries.append(item)
        self._sizes.append(_UNCOUNTED)
        self._ready.set()
        return True

    def close(self) -> None:
        self.closed = True
        self._ready.set()
        if self._low is not None:
            self._low.set()

    # -- the reader ------------------------------------------------------------------
    def get_nowait(self) -> T | None:
        """The next item, or ``None`` when none is queued."""
        if not self._entries:
            return None
        item = self._entries.popleft()
        size = self._sizes.popleft()
        self.taken += 1
        if size != _UNCOUNTED:
            self.items -= 1
            self.nbytes -= size
            low = self._low
            if low is not None and low._event is not None and not self.half_full():
                low.set()   # (Wakeup.waiting without the call: the hot path)
        return item

    def take_all(self) -> list[T]:
        """Every queued item, in order; the FIFO is left empty (and still open)."""
        items = list(self._entries)
        self.taken += len(items)
        self._entries.clear()
        self._sizes.clear()
        self.items = self.nbytes = 0
        if self._low is not None:
            self._low.set()
        return items

    @property
    def ended(self) -> bool:
        """Closed and drained: nothing more will come."""
        return self.closed and not self._entries

    async def wait(self) -> bool:
        """``True`` when an item is ready; ``False`` when closed and drained."""
        while not self._entries:
            if self.closed:
                return False
            await self._ready.wait()
        return True


__all__ = ["BoundedFifo"]
