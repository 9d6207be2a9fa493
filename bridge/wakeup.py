"""A re-armable wake-up: the one way a task here waits for "something changed".

    ready = Wakeup()

    # the waiter: check the condition, then wait, with no await in between
    while not queue:
        await ready.wait()

    # the producer
    queue.append(item)
    ready.set()

Contracts:

* ``wait()`` returns at the first ``set()`` after it began. Every task waiting then
  wakes; the wake-up is re-armed at once for the next change.
* Edge-triggered: a ``set()`` with nobody waiting is not remembered. Waiters check
  their condition first and wait only when it does not hold, with no ``await``
  between the check and the wait, so no change is lost on either anyio backend.
* ``wait()`` may be cancelled (a timeout, a heartbeat): it consumes nothing.
* ``set()`` is synchronous, cheap when nobody waits, and safe to call from any
  callback on the event loop.

It replaces the hand-written pattern "create an ``anyio.Event``, set it, replace it"
(the session FIFO worker, the bus's subscribers, the ``/acp`` streams). Where a
plain channel of items between two tasks is meant, use an anyio memory stream.
"""

from __future__ import annotations

import anyio


class Wakeup:
    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event: anyio.Event | None = None

    @property
    def waiting(self) -> bool:
        """Someone waits for the next ``set()``."""
        return self._event is not None

    def set(self) -> None:
        event = self._event
        if event is not None:
            self._event = None
            event.set()

    async def wait(self) -> None:
        event = self._event
        if event is None:
            event = self._event = anyio.Event()
        await event.wait()


__all__ = ["Wakeup"]
