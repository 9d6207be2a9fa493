"""A connection past uvicorn's cap refused in the protocol its client speaks.

    refusals = Refusals(Http2Limits(idle_s=10.0, max_header_list=73_728))
    if not refusals.refuse(transport, loop):   # in the guard's connection_made, past the cap
        transport.write(HTTP1_503); transport.close()           # too many already waiting

Why: the guard answered a connection past ``--max-connections`` at once with HTTP/1.1
bytes, unread. An HTTP/2 client by prior knowledge (``httpx`` with ``http2=True``,
``curl --http2-prior-knowledge``) cannot read those: it reported a protocol error, not
the 503 and its ``Retry-After``. Here the connection's first bytes choose the answer.

Contracts:

* First bytes that are not the HTTP/2 preface: the HTTP/1.1 answer given (the guard's
  503 ``connection_limit``, ``Connection: close``).
* The preface: the server's SETTINGS, each request of the bytes received answered
  ``503`` with the same JSON body and ``retry-after: 5`` (its stream reset
  ``REFUSED_STREAM`` when the client's window cannot take the body), then GOAWAY
  (``NO_ERROR``, the last stream answered, "too many connections" as its debug data):
  the client reads a plain 503 and retries later. A protocol error of the client's is
  answered with ``h2``'s GOAWAY.
* Answered, the write side is shut and what the client still sends is read and dropped
  until it closes (its request bytes unread, the kernel could reset the connection and
  the client lose the answer); a connection is held ``wait_s`` at most in all, and
  nothing answered by then (silence, half a preface, no request) is told so (the HTTP/1.1
  503, or GOAWAY ``NO_ERROR`` with last stream 0) and closed. Past ``READ_CAP`` bytes
  with nothing answered (a PING or SETTINGS flood, each acknowledged) it is closed at
  once: what is written to a client that may not read stays bounded.
* At most ``max_waiting`` refused connections are held at once (a quarter of the
  descriptors ``guard.FD_RESERVE`` keeps); past them ``refuse`` returns False and the
  guard answers in HTTP/1.1 at once, unread, as before.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h2.errors
import h2.events
import h2.exceptions

from acp_server.http.guard import _REFUSAL as HTTP1_REFUSAL
from acp_server.http.guard import _REFUSAL_BODY as REFUSAL_BODY
from acp_server.http.h2_machine import (
    PREFACE,
    Http2Limits,
    Machine,
    answer_whole,
    starts_http2,
)
_HEAD = [(b":status", b"503"), (b"content-type", b"application/json"),
         (b"retry-after", b"5"), (b"content-length", str(len(REFUSAL_BODY)).encode())]
DEBUG = b"too many connections"
READ_CAP = 64 * 1024   # bytes read from a refused connection before its answer, at most


class Refusals:
    """The refused connections of one server that wait for their first bytes."""

    def __init__(self, limits: Http2Limits, *, max_waiting: int = 64,
                 wait_s: float = 1.0) -> None:
        self.limits = limits
        self.max_waiting = max_waiting
        self.wait_s = wait_s
        self.waiting = 0

    def refuse(self, transport: Any, loop: asyncio.AbstractEventLoop) -> bool:
        """``transport`` (just accepted, nothing read) refused once its first bytes
        come; False when ``max_waiting`` are already held (the caller answers)."""
        if self.waiting >= self.max_waiting:
            return False
        protocol = RefusedConnection(self, transport, loop)
        transport.set_protocol(protocol)
        return True


class RefusedConnection(asyncio.Protocol):
    """One connection past the cap, answered in its own protocol (see the module)."""

    def __init__(self, refusals: Refusals, transport: Any,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.refusals = refusals
        self.transport = transport
        self.start = b""
        self.conn: Machine | None = None
        self.answered = False
        self.lost = False
        self.read = 0
        refusals.waiting += 1
        self.timer = loop.call_later(refusals.wait_s, self._expire)

    def data_received(self, data: bytes) -> None:
        if self.answered:   # read and dropped until the client closes
            return
        self.read += len(data)
        if self.read > READ_CAP:   # a control flood, no request: what it is owed is nothing
            self.answered = True
            self.transport.close()
            return
        if self.conn is None:
            start = self.start + data
            if not starts_http2(start):
                self._answer(HTTP1_REFUSAL)
                return
            if len(start) < len(PREFACE):
                self.start = start
                return
            self.conn = Machine.for_server(self.refusals.limits)
            self.conn.initiate_connection()
            data = start
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError:   # h2 queued its GOAWAY
            self._answer(self.conn.data_to_send())
            return
        last = 0
        for event in events:
            if isinstance(event, h2.events.RequestReceived):
                self._refuse_stream(event.stream_id)
                last = event.stream_id
        if last:
            self.conn.close_connection(last_stream_id=last, additional_data=DEBUG)
            self._answer(self.conn.data_to_send())
        else:
            self.transport.write(self.conn.data_to_send())

    def _refuse_stream(self, stream_id: int) -> None:
        assert self.conn is not None
        conn = self.conn
        try:
            if not answer_whole(conn, stream_id, _HEAD, REFUSAL_BODY):
                conn.reset_stream(stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
        except h2.exceptions.ProtocolError:   # its window shut, or reset meanwhile
            pass

    def _answer(self, data: bytes) -> None:
        """``data`` written, the write side shut; closed when the client closes."""
        self.answered = True
        transport = self.transport
        if self.lost or transport.is_closing():
            return
        transport.write(data)
        if transport.can_write_eof():
            transport.write_eof()
        else:
            transport.close()

    def eof_received(self) -> bool:
        return False   # the client closed: so do we

    def _expire(self) -> None:
        if self.lost:
            return
        if not self.answered:
            if self.conn is None:
                self.transport.write(HTTP1_REFUSAL)
            else:
                self.conn.close_connection(last_stream_id=0, additional_data=DEBUG)
                self.transport.write(self.conn.data_to_send())
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost:
            self.lost = True
            self.refusals.waiting -= 1
            self.timer.cancel()


__all__ = ["HTTP1_REFUSAL", "REFUSAL_BODY", "Refusals", "RefusedConnection"]
