"""A bounded frame FIFO between producers (POST handlers, a bus pump) and one reader.

    buffer = FrameBuffer(limit=512)
    buffer.push(Frame(None, payload))        # direct reply: never blocks, False if dropped
    await buffer.put(frame)                  # the pump: waits while the buffer is full
    while await buffer.wait():               # the reader
        frame = buffer.pop()

Contracts:

* ``wait()`` never consumes: cancelling it (heartbeat timeout, client gone) loses no
  frame. A frame leaves the buffer only through ``pop()`` / ``take_all()``.
* ``put`` waits while ``limit`` frames are queued, so a slow reader slows the pump
  (whose bus subscription then applies its own bound). ``push`` may use
  ``DIRECT_HEADROOM`` more, so replies are not crowded out by bus traffic; past
  that a pushed frame is dropped and counted.
* After ``close()`` nothing is accepted; the reader still gets what is queued, then
  ``wait()`` answers ``False``.
* ``nbytes`` counts the payload bytes queued. ``put`` also waits while ``max_bytes``
  or more are queued; ``push`` drops a frame (counted) once ``max_bytes`` are
  queued before it (a frame larger than the bound is accepted into an empty
  buffer). The HTTP door refuses new requests before that happens
  (``AcpConnection.replies_full``).
* ``appended`` / ``taken`` count the frames that entered and left, ``written`` those
  the reader reports written (``sent``); ``changed()`` returns after the next
  append, pop, report or close (or ``notify()``), so a producer can wait until the
  reader has written what it put (``session/load``'s history).
"""

from __future__ import annotations

from collections import deque

import anyio

from acp_server.acp_http.frames import Frame

DIRECT_HEADROOM = 2   # push() may fill up to limit * DIRECT_HEADROOM


class FrameBuffer:
    def __init__(self, limit: int, max_bytes: int | None = None) -> None:
        self.limit = limit
        self.max_bytes = max_bytes
        self.nbytes = 0
        self.closed = False
        self.dropped = 0
        self._frames: deque[Frame] = deque()
        self._readable: anyio.Event | None = None
        self._writable: anyio.Event | None = None
        self._changed: anyio.Event | None = None
        self.appended = 0
        self.taken = 0
        self.written = 0

    def __len__(self) -> int:
        return len(self._frames)

    def push(self, frame: Frame) -> bool:
        if self.closed:
            return False
        if len(self._frames) >= self.limit * DIRECT_HEADROOM or self.bytes_full:
            self.dropped += 1
            return False
        self._append(frame)
        return True

    async def put(self, frame: Frame) -> None:
        """Raises ``anyio.ClosedResourceError`` once closed."""
        while not self.closed and (len(self._frames) >= self.limit or self.bytes_full):
            self._writable = anyio.Event()
            await self._writable.wait()
        if self.closed:
            raise anyio.ClosedResourceError
        self._append(frame)

    def pop(self) -> Frame | None:
        if not self._frames:
            return None
        frame = self._frames.popleft()
        self.nbytes -= len(frame.payload)
        self.taken += 1
        self.notify()
        if self._writable is not None and len(self._frames) < self.limit \
                and not self.bytes_full:
            self._writable.set()
            self._writable = None
        return frame

    def take_all(self) -> list[Frame]:
        frames = list(self._frames)
        self._frames.clear()
        self.nbytes = 0
        self.taken += len(frames)
        self.written += len(frames)   # gone without a write: nobody waits for them
        self.notify()
        if self._writable is not None:
            self._writable.set()
            self._writable = None
        return frames

    async def wait(self) -> bool:
        """``True`` when a frame is ready; ``False`` when closed and drained."""
        while not self._frames:
            if self.closed:
                return False
            self._readable = anyio.Event()
            await self._readable.wait()
        return True

    def sent(self, count: int) -> None:
        """The reader wrote ``count`` more of the frames it took."""
        self.written += count
        self.notify()

    async def changed(self) -> None:
        if self._changed is None:
            self._changed = anyio.Event()
        await self._changed.wait()

    def notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def close(self) -> None:
        self.closed = True
        self.notify()
        self._wake()
        if self._writable is not None:
            self._writable.set()
            self._writable = None

    @property
    def bytes_full(self) -> bool:
        return self.max_bytes is not None and self.nbytes >= self.max_bytes

    def _append(self, frame: Frame) -> None:
        self._frames.append(frame)
        self.nbytes += len(frame.payload)
        self.appended += 1
        self.notify()
        self._wake()

    def _wake(self) -> None:
        if self._readable is not None:
            self._readable.set()
            self._readable = None
