"""One HTTP/2 stream's ASGI side on uvicorn: ``receive`` and ``send`` of its app, the
waits for the client's windows and for the transport (``http2.Http2Connection``
inherits them; its module states the contracts).

    await self.app(scope, partial(self._receive, stream), partial(self._send, stream))

* ``receive`` gives the request body as the client sent it, acknowledging each part
  (WINDOW_UPDATE) only as the app takes it; ``http.disconnect`` once the stream is
  gone, or answered with its body read.
* ``send`` sends the head with the first body (connection-specific fields dropped, no
  body for HEAD), then DATA as the client's windows and the transport's buffer allow;
  an answer waiting for its window must get ``PROGRESS_BYTES`` through within
  ``idle_s`` spent waiting, else the stream is reset (CANCEL).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import h2.errors
import h2.exceptions

from acp_server.http.h2_machine import Http2Limits, Machine, Stream

log = logging.getLogger("acp_server.http")

_DROPPED = frozenset({b"connection", b"keep-alive", b"proxy-connection",
                      b"transfer-encoding", b"upgrade"})
# What an answer waiting for its client's window must get through within the header
# timeout of its first wait (or the rest of it): any client reading at 100 bytes a
# second does, a window opened a byte at a time does not
PROGRESS_BYTES = 1024


class StreamAnswers:
    """The ASGI side of ``Http2Connection``'s streams (its attributes, set there)."""

    conn: Machine
    loop: asyncio.AbstractEventLoop
    limits: Http2Limits
    server_state: Any
    client: Any
    lost: bool
    write_paused: bool
    drains: list[asyncio.Future[None]]

    def _flush(self) -> None:
        raise NotImplementedError

    def _gone(self, stream: Stream,
              code: h2.errors.ErrorCodes = h2.errors.ErrorCodes.INTERNAL_ERROR) -> None:
        raise NotImplementedError

    async def _receive(self, stream: Stream) -> dict[str, Any]:
        while True:
            if stream.body:
                data, flow = stream.body.popleft()
                if flow and not self.lost:   # a stream gone: the connection's window
                    try:
                        self.conn.acknowledge_received_data(flow, stream.id)
                    except h2.exceptions.ProtocolError:
                        pass
                    self._flush()
                last = stream.ended and not stream.body
                stream.body_done = last
                return {"type": "http.request", "body": data, "more_body": not last}
            if stream.gone or self.lost:
                return {"type": "http.disconnect"}
            if stream.ended and not stream.body_done:
                stream.body_done = True
                return {"type": "http.request", "body": b"", "more_body": False}
            if stream.answered and stream.body_done:
                return {"type": "http.disconnect"}
            await self._parked(stream.wakes)   # one per waiter: two tasks may receive

    async def _send(self, stream: Stream, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            if stream.head is not None:
                raise RuntimeError("http.response.start sent twice")
            stream.head = (message["status"], list(message.get("headers", ())))
            return
        if kind != "http.response.body":
            raise RuntimeError(f"unexpected ASGI message {kind!r} on an HTTP/2 stream")
        if stream.head is None:
            raise RuntimeError("http.response.body before http.response.start")
        if stream.answered or stream.gone or self.lost:
            return
        body = b"" if stream.bodiless else bytes(message.get("body", b""))
        end = not message.get("more_body", False)
        if not stream.started:
            stream.started = True
            status, fields = stream.head
            head = [(b":status", str(status).encode())]
            head += self.server_state.default_headers
            head += [(name.lower(), value) for name, value in fields
                     if name.lower() not in _DROPPED]
            try:
                self.conn.send_headers(stream.id, head, end_stream=end and not body)
            except h2.exceptions.ProtocolError as exc:   # a field h2 refuses (as HTTP/1.1)
                self._gone(stream)
                raise RuntimeError(f"HTTP/2 response head refused: {exc}") from exc
            if end and not body:
                stream.answered = True
                self._flush()
                return
        await self._send_data(stream, body, end)

    async def _send_data(self, stream: Stream, body: bytes, end: bool) -> None:
        if not body and not end:   # nothing to say: no empty DATA frame
            self._flush()
            return
        offset, size, waited = 0, len(body), False
        while True:
            if stream.gone or self.lost:
                return
            if self.write_paused:
                await self._drain()
                continue
            left = size - offset
            try:
                window = min(self.conn.local_flow_control_window(stream.id),
                             self.conn.max_outbound_frame_size, left)
                if left and window <= 0:
                    self._flush()
                    if not await self._window(stream):   # short of progress: reset
                        self._gone(stream, h2.errors.ErrorCodes.CANCEL)
                        return
                    waited = True
                    continue
                chunk = body[offset:offset + window] if offset or window < size else body
                offset += window
                last = end and offset == size
                self.conn.send_data(stream.id, chunk, end_stream=last)
                if stream.stalled is not None:   # waiting since: enough came through?
                    stream.stall_sent += window
                    if stream.stall_sent >= PROGRESS_BYTES or (offset == size and not waited):
                        stream.stalled, stream.stall_sent = None, 0
            except h2.exceptions.ProtocolError:   # reset meanwhile
                self._gone(stream)
                return
            if last:
                stream.answered = True
            if offset == size:
                self._flush()
                return

    # -- waiting ---------------------------------------------------------------------------
    async def _window(self, stream: Stream) -> bool:
        """Until the stream's window may have opened; False once it waited ``idle_s`` in
        all short of progress (``PROGRESS_BYTES`` sent since its first wait, or the rest
        of a body sent with no wait; a window moved by a WINDOW_UPDATE elsewhere, or of
        0, does not count): then its request is not held in flight for ever. The app's
        own pauses between bodies are not the client's, and not counted."""
        waited, since = stream.stalled or 0.0, self.loop.time()
        if waited >= self.limits.idle_s:
            log.debug("HTTP/2 stream %d of %s reset: its window stayed shut", stream.id,
                      self.client)
            return False
        stream.window = self.loop.create_future()
        timer = self.loop.call_later(self.limits.idle_s - waited, self._resolve_window, stream)
        try:
            await stream.window
        finally:
            timer.cancel()
            stream.window = None
            stream.stalled = waited + self.loop.time() - since
        return True

    async def _drain(self) -> None:
        await self._parked(self.drains)

    async def _parked(self, waiters: list[asyncio.Future[None]]) -> None:
        """Until woken (each of ``waiters`` resolved), with a future of its own there."""
        waiter = self.loop.create_future()
        waiters.append(waiter)
        try:
            await waiter
        finally:
            if waiter in waiters:
                waiters.remove(waiter)

    @staticmethod
    def _wake(stream: Stream) -> None:
        for wake in stream.wakes:   # each receive waiting looks again
            if not wake.done():
                wake.set_result(None)
        stream.wakes.clear()

    @staticmethod
    def _resolve_window(stream: Stream) -> None:
        if stream.window is not None and not stream.window.done():
            stream.window.set_result(None)

    @staticmethod
    def _resolve(waiters: list[asyncio.Future[None]]) -> None:
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
        waiters.clear()
