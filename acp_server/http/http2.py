"""HTTP/2 on uvicorn: h2c by prior knowledge and ``h2`` by ALPN, served in the event loop.

    # the connection guard (``guard.guarded_protocol``) hands a connection over when
    # its first bytes are the HTTP/2 client preface, or its TLS handshake chose "h2":
    Http2Connection.take_over(guarded_protocol_instance, first_bytes, limits, stats)

Why: on granian every request is handed between its Rust threads and the event loop
(about ten context switches a request on one core, ``docs/benchmark-log.md``); uvicorn
parses HTTP/1.1 in the loop itself. This module gives uvicorn HTTP/2 the same way: the
``h2`` state machine (python-hyper) turns bytes into events in the loop's thread, each
stream runs the ASGI app in a task of its own, and the answers go back through the same
transport. HTTP/1.1 connections never pass through here.

Contracts (``Http2Limits`` sets the numbers):

* A stream is one ASGI ``http`` exchange (``http_version`` ``"2"``); ``:authority``
  becomes ``host``; a malformed request (RFC 9113 8.1.1: a ``host`` that differs from
  it, an uppercase or connection-specific field, a pseudo-header missing or repeated,
  a body that disagrees with its ``content-length``, ``h2_machine``) is reset
  PROTOCOL_ERROR, that stream alone; one with no ``:path``, a CONNECT or a path not
  ASCII is answered 400 (RST_STREAM PROTOCOL_ERROR when the client's windows cannot
  take it). Connection-specific response headers (``connection``,
  ``keep-alive``, ``transfer-encoding``, ``upgrade``) are dropped, as RFC 9113 requires;
  so is the body of an answer to HEAD (its HEADERS end the stream, as HTTP/1.1 sends none).
* Flow control both ways: a request body is acknowledged (WINDOW_UPDATE) only as the
  app reads it, so what is buffered per connection is bounded by its windows; a
  response waits for the client's windows and for the transport's write buffer (a
  stream that never reads holds only its own ``send``). While the transport's writes
  back up the connection is not read (its PING and SETTINGS acknowledgements cannot
  pile up).
* At most ``max_streams`` streams run at once per connection (advertised as
  ``SETTINGS_MAX_CONCURRENT_STREAMS``; a stream the client reset counts until its app
  returns); more are refused (``REFUSED_STREAM``).
* Floods end the connection with GOAWAY ``ENHANCE_YOUR_CALM``: more than
  ``max_resets`` streams reset by the client (or by us, for a body that disagreed with
  its ``content-length``) before their answer began, beyond the streams answered
  (CVE-2023-44487; an event stream the client closes is not one),
  more than ``max_empty_frames`` empty DATA frames without END_STREAM
  (CVE-2019-9518), DATA floods on closed streams (``h2_machine``), or PING, SETTINGS,
  PRIORITY and unknown frames past ``control_rate`` a second beyond a burst of
  ``control_burst`` (each answered at no cost to its sender). Malformed frames, HPACK
  bombs and CONTINUATION floods are ``h2``'s
  connection errors (GOAWAY with its code).
* A connection with no stream for ``idle_s`` (the header timeout) is sent GOAWAY and
  closed (counted in ``stats["header_timeouts"]``): a preface then silence, a control
  flood, a header block that never ends. One with streams is sent a PING once nothing
  came from its client for ``idle_s``, and closed when nothing came for as long again
  (a client gone silent). A stream whose answer waits for its client's window must
  get ``PROGRESS_BYTES`` (``h2_answers``) through (or the rest of what it sends) within
  ``idle_s`` spent waiting (not the app's pauses), else it is reset (CANCEL), its
  request no longer in flight: a window shut, or opened a few bytes at a time (a trickle would hold
  ``--max-connections`` requests for ever, every other client answered 503). Closed
  with bytes still queued for the client, the connection is reset (``SO_LINGER`` 0): no
  orphan socket keeps them.
* ``shutdown`` (uvicorn's graceful stop) sends GOAWAY with the last stream taken; the
  streams in flight finish, later ones are refused, and the connection closes when
  none is left. A client's GOAWAY with NO_ERROR is the same from its side (its streams
  in flight are answered); with an error code the connection is closed at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from functools import partial
from typing import Any

import h2.errors
import h2.events
import h2.exceptions
from hyperframe.frame import GoAwayFrame
from uvicorn.protocols.utils import get_local_addr, get_remote_addr, is_ssl

from acp_server.http.h2_answers import StreamAnswers
from acp_server.http.h2_machine import (
    CALM,
    PREFACE,
    Http2Limits,
    Machine,
    Stream,
    answer_whole,
    request_scope,
    starts_http2,
    unsent,
)

log = logging.getLogger("acp_server.http")

LINGER_S = 1.0   # how long an ended connection is read (and dropped) before its close
_CONTROL = (h2.events.PingReceived, h2.events.RemoteSettingsChanged,
            h2.events.PriorityUpdated, h2.events.UnknownFrameReceived)
_LINGER_0 = struct.pack("ii", 1, 0)
_BAD_REQUEST = b'{"error":"Bad request.","code":"bad_request"}'
_INTERNAL_ERROR = b'{"error":"Internal server error.","code":"internal_error"}'


class Http2Connection(StreamAnswers, asyncio.Protocol):
    """One HTTP/2 connection of a uvicorn server (see the module)."""

    @classmethod
    def take_over(cls, h1: Any, data: bytes, limits: Http2Limits,
                  stats: dict[str, int]) -> Http2Connection:
        """Replaces uvicorn's HTTP/1.1 protocol ``h1`` (just made, nothing parsed) on
        its transport, with ``data`` (what it received) as the first bytes."""
        transport = h1.transport
        h1.connections.discard(h1)
        handle = getattr(h1, "timeout_keep_alive_task", None)
        if handle is not None:
            handle.cancel()
        protocol = cls(app=h1.app, server_state=h1.server_state, app_state=h1.app_state,
                       loop=h1.loop, limits=limits, stats=stats)
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        if data:
            protocol.data_received(data)
        return protocol

    def __init__(self, *, app: Any, server_state: Any, app_state: dict[str, Any],
                 loop: asyncio.AbstractEventLoop, limits: Http2Limits,
                 stats: dict[str, int]) -> None:
        self.app = app
        self.server_state = server_state
        self.app_state = app_state
        self.loop = loop
        self.limits = limits
        self.stats = stats
        self.conn = Machine.for_server(limits)
        self.streams: dict[int, Stream] = {}
        self.transport: Any = None
        self.lost = False
        self.lingering = False      # ended: the write side shut, reads dropped (``_end``)
        self.closing = False        # GOAWAY sent: no new stream is taken
        self.last_taken = 0         # the GOAWAY's last stream id, once closing
        self.write_paused = False
        self.drains: list[asyncio.Future[None]] = []
        self.timer: asyncio.TimerHandle | None = None
        self.idle_since: float | None = None   # when its last stream ended (or it began)
        self.last_read = 0.0                   # when a frame last came
        self.pinged = False                    # a keep-alive PING unanswered since
        self.resets = 0             # streams reset by the client before their answer began
        self.answered = 0
        self.empty_frames = 0
        self.control_tokens = float(limits.control_burst)   # the control frames' bucket
        self.control_at = 0.0

    # -- the transport ---------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        self.transport = transport
        self.server_state.connections.add(self)
        self.client = get_remote_addr(transport)
        self.server = get_local_addr(transport)
        self.scheme = "https" if is_ssl(transport) else "http"
        self.conn.initiate_connection()
        self._flush()
        self.last_read = self.idle_since = self.loop.time()
        self.timer = self.loop.call_later(self.limits.idle_s, self._tick)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.server_state.connections.discard(self)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self._drop_streams()

    def _drop_streams(self) -> None:
        """Nothing more will be sent: every stream's ``receive`` and ``send`` told."""
        for stream in self.streams.values():
            stream.gone = True
            self._wake(stream)
            self._resolve_window(stream)
        self._resolve(self.drains)

    def pause_writing(self) -> None:
        self.write_paused = True
        self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        if not self.lost:
            self.transport.resume_reading()
        self._resolve(self.drains)

    def shutdown(self) -> None:
        """uvicorn's graceful stop: GOAWAY, the streams in flight finish, then closed."""
        if self.closing or self.lost or self.lingering or self.transport.is_closing():
            return
        self.closing = True
        self.last_taken = self.conn.highest_inbound_stream_id
        self._flush()
        self.transport.write(GoAwayFrame(0, last_stream_id=self.last_taken).serialize())
        if not self.streams:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self.lingering:   # ended: read and dropped until closed
            return
        self.last_read = self.loop.time()
        self.pinged = False
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError as exc:   # h2 queued its GOAWAY
            log.debug("HTTP/2 connection error from %s: %s", self.client, exc)
            self._end()
            return
        for event in events:
            kind = type(event)
            if kind in _CONTROL and not self._control():
                return
            if kind is h2.events.RequestReceived:
                self._request(event)
            elif kind is h2.events.DataReceived:
                self._data(event)
            elif kind is h2.events.StreamEnded:
                stream = self.streams.get(event.stream_id)
                if stream is not None:
                    stream.ended = True
                    self._wake(stream)
            elif kind is h2.events.StreamReset:
                self._reset(event)
            elif kind is h2.events.WindowUpdated or kind is h2.events.RemoteSettingsChanged:
                sid = getattr(event, "stream_id", 0)
                waiting = ([s for s in self.streams.values() if s.window is not None]
                           if not sid else filter(None, (self.streams.get(sid),)))
                # the stream that waited longest takes the connection's window first (in
                # the order opened, the first took every chunk and the last starved)
                for stream in sorted(waiting, key=lambda s: -(s.stalled or 0.0)):
                    self._resolve_window(stream)
            elif kind is h2.events.ConnectionTerminated:
                if event.error_code:   # the client's connection error: nothing more to say
                    self._end()
                    return
                self.closing = True   # NO_ERROR: its streams in flight finish (h2_machine)
                self.last_taken = self.conn.highest_inbound_stream_id
                if not self.streams:
                    self._flush()
                    self.transport.close()
                    return
            elif kind is h2.events.TrailersReceived:
                stream = self.streams.get(event.stream_id)
                if stream is not None:
                    stream.ended = True
                    self._wake(stream)
            if self.lost or self.lingering or self.transport.is_closing():
                return
        self._flush()

    # -- events ----------------------------------------------------------------------
    def _request(self, event: Any) -> None:
        sid = event.stream_id
        if self.closing and sid > self.last_taken or len(self.streams) >= self.limits.max_streams:
            self.conn.reset_stream(sid, h2.errors.ErrorCodes.REFUSED_STREAM)
            return
        scope = request_scope(event.headers, self.server, self.client, self.scheme,
                              self.app_state)
        if scope is None:   # malformed: a stream error (RFC 9113 8.1.1), 400 if it fits
            if not self._answer(sid, b"400", _BAD_REQUEST):
                self.conn.reset_stream(sid, h2.errors.ErrorCodes.PROTOCOL_ERROR)
            elif not event.stream_ended:   # its body still coming: not held open in h2
                self.conn.reset_stream(sid, h2.errors.ErrorCodes.NO_ERROR)
            return
        stream = Stream(sid, bodiless=scope["method"] == "HEAD")
        stream.ended = bool(event.stream_ended)
        self.streams[sid] = stream
        self.idle_since = None
        task = self.loop.create_task(self._run(stream, scope))
        tasks = self.server_state.tasks
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def _data(self, event: Any) -> None:
        stream = self.streams.get(event.stream_id)
        if stream is None:   # its app returned: the connection's window only
            self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            return
        if not event.data and not event.stream_ended:
            self.empty_frames += 1
            if self.empty_frames > self.limits.max_empty_frames:
                self._calm("empty DATA frames")
                return
        stream.body.append((event.data, event.flow_controlled_length))
        if event.stream_ended:
            stream.ended = True
        self._wake(stream)

    def _reset(self, event: Any) -> None:
        stream = self.streams.get(event.stream_id)
        if stream is None:
            return
        stream.gone = True
        self._wake(stream)
        self._resolve_window(stream)
        if not stream.started:   # work its client never waited for (or made us reset:
            # a body past its content-length, a window overflowed)
            self.resets += 1
            if self.resets > self.limits.max_resets + self.answered:
                self._calm("streams reset before their answer began")

    def _answer(self, sid: int, status: bytes, body: bytes) -> bool:
        """A small JSON answer sent whole, when the client's windows take its body now
        (else False: nothing sent, the caller resets the stream)."""
        return answer_whole(self.conn, sid, [
            (b":status", status), (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode())], body)

    def _gone(self, stream: Stream,
              code: h2.errors.ErrorCodes = h2.errors.ErrorCodes.INTERNAL_ERROR) -> None:
        """A stream that can send no more (``h2`` refused a frame, its window stayed
        shut): reset, and its ``receive`` told (``http.disconnect``)."""
        stream.gone = True
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self.conn.reset_stream(stream.id, code)
        self._flush()
        self._wake(stream)

    def _control(self) -> bool:
        """One PING, SETTINGS, PRIORITY or unknown frame, taken from its bucket: h2
        answers each (an ACK) at no cost to the client; past the rate, the flood ends."""
        now = self.loop.time()
        limits = self.limits
        tokens = min(limits.control_burst,
                     self.control_tokens + (now - self.control_at) * limits.control_rate)
        self.control_at = now
        if tokens < 1:
            self._calm("control frames (PING, SETTINGS, PRIORITY, unknown) past their rate")
            return False
        self.control_tokens = tokens - 1
        return True

    def _calm(self, why: str) -> None:
        log.warning("HTTP/2 connection from %s ended: %s", self.client, why)
        self.conn.close_connection(error_code=CALM)
        self._end()

    def _end(self) -> None:
        """Closed after what h2 queued (its GOAWAY): the write side at once, the
        connection after ``LINGER_S`` of reading and dropping what the client still
        sends (closed at once with bytes unread, the kernel would reset the connection,
        and the client could lose the GOAWAY that says why)."""
        self._flush()
        self._drop_streams()
        transport = self.transport
        if self.lingering or transport.is_closing():
            return
        self.lingering = True
        if not transport.can_write_eof():   # TLS: no half-close
            transport.close()
            return
        transport.write_eof()
        self.loop.call_later(LINGER_S, transport.close)

    # -- one stream's ASGI exchange -------------------------------------------------------
    async def _run(self, stream: Stream, scope: dict[str, Any]) -> None:
        try:
            await self.app(scope, partial(self._receive, stream), partial(self._send, stream))
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError):
                log.exception("the app failed on an HTTP/2 stream")
            self._abandon(stream)
            if not isinstance(exc, Exception):
                raise
        else:
            if not stream.answered and not stream.gone:
                log.error("the app returned without completing its HTTP/2 response")
                self._abandon(stream)
        finally:
            self._done(stream)

    def _abandon(self, stream: Stream) -> None:
        """A stream whose app failed: 500 when nothing was sent, else reset."""
        if stream.answered or stream.gone or self.lost:
            return
        try:
            if not stream.started and self._answer(stream.id, b"500", _INTERNAL_ERROR):
                stream.answered = True
                self._flush()
                return
        except h2.exceptions.ProtocolError:   # the stream closed meanwhile
            pass
        self._gone(stream)   # begun, or its windows shut: reset

    def _done(self, stream: Stream) -> None:
        self.streams.pop(stream.id, None)
        if self.lost:
            return
        unread = sum(flow for _, flow in stream.body)
        stream.body.clear()
        try:
            if not stream.answered and not stream.gone:
                self.conn.reset_stream(stream.id, h2.errors.ErrorCodes.CANCEL)
            elif not stream.ended and not stream.gone:   # answered before its body ended
                self.conn.reset_stream(stream.id, h2.errors.ErrorCodes.NO_ERROR)
            if unread:
                self.conn.acknowledge_received_data(unread, stream.id)
        except h2.exceptions.ProtocolError:
            pass
        if stream.answered:
            self.answered += 1
            self.conn.closed_frames_allowed += 4   # a body still coming when answered
        self._flush()
        if not self.streams:
            if self.closing:
                self.transport.close()
            else:
                self.idle_since = self.loop.time()

    def _flush(self) -> None:
        data = self.conn.data_to_send()
        if data and not self.lost and not self.lingering:   # (past write_eof: dropped)
            self.transport.write(data)

    def _tick(self) -> None:
        """The connection's one timer: closed with no stream for ``idle_s``; with
        streams, a PING after ``idle_s`` with no frame from the client, and closed when
        nothing came for ``idle_s`` more (a client gone silent, a window never given)."""
        self.timer = None
        if self.lost or self.transport.is_closing():
            return
        now, idle_s = self.loop.time(), self.limits.idle_s
        if self.idle_since is not None:
            due = self.idle_since + idle_s
            if now >= due:
                self._quiet("no stream")
                return
        else:
            due = self.last_read + idle_s
            if now >= due:
                if self.pinged:
                    self._quiet("a PING unanswered")
                    return
                self.pinged = True
                try:
                    self.conn.ping(b"\0keepalv")
                except h2.exceptions.ProtocolError:   # h2 can send nothing more
                    self._quiet("closed by h2")
                    return
                self._flush()
                due = now + idle_s
        self.timer = self.loop.call_at(due, self._tick)

    def _quiet(self, why: str) -> None:
        """GOAWAY and closed; reset instead when bytes are still queued for the client
        (in the transport or the kernel): a client that stopped reading would keep a
        closed socket's queue for ever (an orphan in FIN_WAIT1)."""
        log.debug("HTTP/2 connection from %s closed: %s", self.client, why)
        self.stats["header_timeouts"] = self.stats.get("header_timeouts", 0) + 1
        try:
            self.conn.close_connection()
        except h2.exceptions.ProtocolError:
            pass
        if not unsent(self.transport):
            self._end()
            return
        sock = self.transport.get_extra_info("socket")
        with contextlib.suppress(OSError, AttributeError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_0)
        self.transport.abort()


__all__ = ["PREFACE", "Http2Connection", "Http2Limits", "starts_http2", "unsent"]
