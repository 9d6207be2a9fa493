"""python-hyper's ``h2`` state machine as the uvicorn server's HTTP/2 uses it.

    machine = Machine.for_server(Http2Limits(idle_s=10.0, max_header_list=73_728))
    events = machine.receive_data(data)       # h2's API, with the limits below enforced

Contracts: the SETTINGS sent are ``limits``' stream cap and header-list cap (HPACK
decoding past it is ``h2``'s connection error) and no server push; the answers' HPACK
table is 4,096 bytes at most, whatever the client allows. Three of ``h2``'s
answers are changed: a stream past the cap is not a connection error (``open_inbound_streams``
never reaches it; ``http2.Http2Connection`` refuses that stream alone); a client's GOAWAY
with NO_ERROR leaves the connection open for the streams in flight (``h2`` would close
its state, and then refuse every frame to them and every PING); and more than 1,000
DATA frames on closed streams (4 more per stream answered) end the connection with
``ENHANCE_YOUR_CALM`` (``h2`` answers each with RST_STREAM and gives its bytes back to
the connection window, so flow control never ends such a flood). A malformed request
(RFC 9113 8.1.1: a header block ``h2`` refuses once decoded, a body that disagrees with
its ``content-length``) is reset ``PROTOCOL_ERROR``, a stream error, where ``h2``
ends the connection; HPACK, frame and flow-control errors stay connection errors.
``Stream`` is what
the connection keeps of one stream while its app runs; ``request_scope`` makes a
request's header block its ASGI scope; ``unsent`` counts a transport's bytes its client
has not acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import struct
import termios
from collections import deque
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import hpack

_ASGI = {"version": "3.0", "spec_version": "2.3"}
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
CALM = h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
ENCODER_TABLE = 4096   # bytes of HPACK dynamic table for the answers, whatever a client allows


@dataclass(frozen=True, slots=True)
class Http2Limits:
    idle_s: float                   # no stream for this long: GOAWAY, closed
    max_header_list: int            # SETTINGS_MAX_HEADER_LIST_SIZE (HPACK-decoded bytes)
    max_streams: int = 100          # SETTINGS_MAX_CONCURRENT_STREAMS, and running tasks
    max_resets: int = 100           # client resets before an answer began, beyond the answered
    max_empty_frames: int = 100     # empty DATA frames without END_STREAM, per connection
    control_rate: float = 100.0     # PING, SETTINGS, PRIORITY, unknown frames a second ...
    control_burst: int = 1000       # ... beyond a burst of this many


class Calm(h2.exceptions.ProtocolError):
    """A flood ``h2`` itself would keep answering: a connection error of ours."""

    error_code = CALM


class _Encoder(hpack.Encoder):
    """HPACK's encoder with its dynamic table kept to ``ENCODER_TABLE`` bytes: ``h2``
    gives it the client's SETTINGS_HEADER_TABLE_SIZE (up to 2^32-1), and a table that
    large never evicts, so every distinct field answered (a ``date`` a second, ids)
    would stay for the connection's life (RFC 7541 4.2: an encoder may use less)."""

    @property
    def header_table_size(self) -> int:
        return int(self.header_table.maxsize)

    @header_table_size.setter
    def header_table_size(self, value: int) -> None:
        setter: Any = hpack.Encoder.header_table_size.fset   # type: ignore[attr-defined]
        setter(self, min(value, ENCODER_TABLE))


class Machine(h2.connection.H2Connection):
    """``h2``'s state machine, counting the DATA frames on closed streams: ``h2``
    answers each with RST_STREAM and gives its bytes back to the connection's window,
    so a flood of them is never ended by flow control."""

    closed_frames = 0
    closed_frames_allowed = 1000
    # The streams h2 remembers as closed, and how (a late frame on one reset is answered
    # RST_STREAM; forgotten, a DATA frame still is): h2 keeps 65,536, ~7.5 MB a
    # connection that asked that many; 10 times the streams running at once is plenty.
    MAX_CLOSED_STREAMS = 1000

    @property
    def open_inbound_streams(self) -> int:
        """Never at ``h2``'s cap: a stream past it is a connection error there, where
        ``Http2Connection`` refuses that stream alone (``REFUSED_STREAM``, RFC 9113
        5.1.2), counting the streams whose app still runs."""
        cap = self.local_settings.max_concurrent_streams
        return min(super().open_inbound_streams, cap - 1)

    @classmethod
    def for_server(cls, limits: Http2Limits) -> Machine:
        """A server's machine with ``limits`` as its SETTINGS (no server push)."""
        machine = cls(config=h2.config.H2Configuration(client_side=False,
                                                       header_encoding=None))
        codes = h2.settings.SettingCodes
        machine.local_settings = h2.settings.Settings(client=False, initial_values={
            codes.MAX_CONCURRENT_STREAMS: limits.max_streams,
            codes.MAX_HEADER_LIST_SIZE: limits.max_header_list,
            codes.ENABLE_PUSH: 0})
        machine.decoder.max_header_list_size = limits.max_header_list   # before any ACK
        machine.encoder = _Encoder()
        return machine

    def _receive_goaway_frame(self, frame: Any) -> Any:
        """A client's GOAWAY with NO_ERROR opens no more streams (RFC 9113 6.8); those
        in flight go on: the state machine stays open (``h2`` would close it, then
        refuse every frame to those streams and every PING), with the event given."""
        if frame.error_code:
            return super()._receive_goaway_frame(frame)
        event = h2.events.ConnectionTerminated()
        event.error_code = h2.errors.ErrorCodes.NO_ERROR
        event.last_stream_id = frame.last_stream_id
        event.additional_data = frame.additional_data or None
        return [], [event]

    # -- malformed requests: stream errors (RFC 9113 8.1.1), not h2's connection errors --
    _opened: int | None = None   # the stream a HEADERS frame opened, once HPACK decoded it

    def _get_or_create_stream(self, stream_id: int, allowed_ids: Any) -> Any:
        stream = super()._get_or_create_stream(stream_id, allowed_ids)
        self._opened = stream_id
        return stream

    def _receive_headers_frame(self, frame: Any) -> Any:
        """A header block h2 refuses once it is decoded and its stream exists (a field
        name in uppercase, a connection-specific field, ``te`` other than ``trailers``,
        a pseudo-header missing, repeated or unknown, a ``content-length`` not a number,
        trailers without END_STREAM): that stream reset ``PROTOCOL_ERROR``, its other
        streams served. Before that point (HPACK, stream ids, the connection's state)
        the error stays the connection's: the decoder's state is shared. ``StreamReset``
        (not remote) is given, so malformed trailers end their stream's app too."""
        self._opened = None
        try:
            return super()._receive_headers_frame(frame)
        except h2.exceptions.StreamClosedError:
            raise
        except h2.exceptions.ProtocolError:
            if self._opened != frame.stream_id or not self._malformed(frame.stream_id):
                raise
            return [], [self._reset_event(frame.stream_id)]   # (trailers: its app told)

    def _receive_data_frame(self, frame: Any) -> Any:
        """A body longer, or ending shorter, than its ``content-length``: that stream
        reset ``PROTOCOL_ERROR`` (``StreamReset`` given, not remote), its frame's bytes
        given back to the connection's window."""
        try:
            return super()._receive_data_frame(frame)
        except h2.exceptions.InvalidBodyLengthError:
            if not self._malformed(frame.stream_id):
                raise
            self.acknowledge_received_data(frame.flow_controlled_length, frame.stream_id)
            return [], [self._reset_event(frame.stream_id)]

    @staticmethod
    def _reset_event(stream_id: int) -> Any:
        return h2.events.StreamReset(stream_id=stream_id, remote_reset=False,
                                     error_code=h2.errors.ErrorCodes.PROTOCOL_ERROR)

    def _malformed(self, stream_id: int) -> bool:
        """``stream_id`` reset as malformed; False when it cannot be (then the
        connection's error)."""
        try:
            self.reset_stream(stream_id, h2.errors.ErrorCodes.PROTOCOL_ERROR)
        except h2.exceptions.ProtocolError:
            return False
        return True

    def _handle_data_on_closed_stream(self, events: Any, exc: Any, frame: Any) -> Any:
        self.closed_frames += 1
        if self.closed_frames > self.closed_frames_allowed:
            raise Calm("DATA frames on closed streams")
        return super()._handle_data_on_closed_stream(events, exc, frame)


class Stream:
    """One stream's state as ``http2.Http2Connection`` keeps it, while its app runs."""

    __slots__ = ("answered", "body", "body_done", "bodiless", "ended", "gone", "head", "id",
                 "stall_sent", "stalled", "started", "wakes", "window")

    def __init__(self, stream_id: int, bodiless: bool = False) -> None:
        self.id = stream_id
        self.bodiless = bodiless   # HEAD: the app's body is not sent (RFC 9110 9.3.2)
        self.body: deque[tuple[bytes, int]] = deque()   # (data, flow-controlled length)
        self.ended = False       # END_STREAM received
        self.body_done = False   # the app was given the body's end
        self.gone = False        # reset by the client, or the connection lost
        self.head: tuple[int, list[tuple[bytes, bytes]]] | None = None   # held until a body
        self.started = False     # HEADERS sent
        self.answered = False    # END_STREAM sent
        self.wakes: list[asyncio.Future[None]] = []       # the receives waiting for data
        self.window: asyncio.Future[None] | None = None   # a send waiting for a window
        self.stalled: float | None = None   # seconds a send waited, short of progress
        self.stall_sent = 0   # bytes sent since ``stalled`` (``h2_answers.PROGRESS_BYTES``)


def starts_http2(data: bytes) -> bool:
    """Whether a connection's first bytes are (the start of) the HTTP/2 preface."""
    return PREFACE.startswith(data[:len(PREFACE)])


def request_scope(fields: list[tuple[bytes, bytes]], server: Any, client: Any, scheme: str,
                  app_state: dict[str, Any]) -> dict[str, Any] | None:
    """A request's header block (h2's validated fields) as an ASGI ``http`` scope;
    None for one that cannot be served (no method or path, CONNECT, two ``host``
    fields, a path or method not ASCII): answered 400. (Split ``cookie`` fields come
    joined with "; ", after the others: h2's ``normalize_inbound_headers``.)"""
    method = path = authority = host = None
    headers = []
    for name, value in fields:
        if name[:1] == b":":
            if name == b":method":
                method = value
            elif name == b":path":
                path = value
            elif name == b":authority":
                authority = value
            continue
        if name == b"host":
            if host is not None:
                return None
            host = value
        headers.append((name, value))
    if method is None or not path or method == b"CONNECT":
        return None
    if authority is not None and host is None:   # (both, and differing: h2 refused it)
        headers.append((b"host", authority))
    raw_path, _, query = path.partition(b"?")
    try:
        text = raw_path.decode("ascii")
        decoded_method = method.decode("ascii")
    except UnicodeDecodeError:
        return None
    return {"type": "http", "asgi": _ASGI, "http_version": "2",
            "server": server, "client": client, "scheme": scheme,
            "method": decoded_method, "root_path": "",
            "path": unquote(text) if "%" in text else text, "raw_path": raw_path,
            "query_string": query, "headers": headers, "state": app_state.copy()}


def answer_whole(conn: h2.connection.H2Connection, stream_id: int,
                 head: list[tuple[bytes, bytes]], body: bytes) -> bool:
    """A small answer sent whole (HEADERS, then ``body`` with END_STREAM) when the
    client's windows take its body now; False when they do not (nothing sent: the
    caller resets the stream)."""
    if conn.local_flow_control_window(stream_id) < len(body):
        return False
    conn.send_headers(stream_id, head)
    conn.send_data(stream_id, body, end_stream=True)
    return True


def unsent(transport: Any) -> int:
    """Bytes written to ``transport`` that its client has not acknowledged: in the
    transport's buffer, and in the kernel's (``TIOCOUTQ``: Linux; 0 elsewhere)."""
    size = int(transport.get_write_buffer_size())
    sock = transport.get_extra_info("socket")
    if sock is not None and hasattr(termios, "TIOCOUTQ"):
        with contextlib.suppress(OSError, ValueError):
            size += struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ,
                                                   b"\0\0\0\0"))[0]
    return size


__all__ = ["CALM", "PREFACE", "Calm", "Http2Limits", "Machine", "Stream", "answer_whole",
           "request_scope", "starts_http2", "unsent"]
