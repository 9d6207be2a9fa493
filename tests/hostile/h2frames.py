"""Hand-built HTTP/2 frames on a bare socket, for the abuse a conforming client library
refuses to send (a reset storm, endless CONTINUATION, a stream id going backwards).

    async with anyio.create_task_group() as tg:
        raw = await RawH2.connect(port, tg)          # the preface sent, a reader started
        async with raw:
            await raw.send(headers(1, raw.block(request_head(port, "/health")),
                                   end_stream=True) + rst_stream(1))
            assert await raw.ended(30)      # a GOAWAY (raw.got.goaway: its code) or closed

Contracts: frames are built exactly as asked (no state machine, no validation); a
background reader, started by ``RawH2.connect`` in the caller's task group, parses
what the server sends (counting PING and SETTINGS acknowledgements, remembering the
first GOAWAY and every RST_STREAM) and notes when the server ends the connection; a
send to a server that stopped reading raises ``Stalled`` past ``send_timeout`` rather
than hanging. Every HPACK block comes from one encoder per connection, so indexed
fields stay consistent with the server's decoder.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, \
    WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, \
    MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = range(1, 7)
MAX_WINDOW = (1 << 31) - 1


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return (len(payload).to_bytes(3, "big") + bytes([kind, flags])
            + (stream_id & MAX_WINDOW).to_bytes(4, "big") + payload)


def settings(pairs: dict[int, int] | None = None, *, ack: bool = False) -> bytes:
    body = b"".join(struct.pack(">HI", k, v) for k, v in (pairs or {}).items())
    return frame(SETTINGS, ACK if ack else 0, 0, body)


def ping(opaque: bytes = b"\0" * 8) -> bytes:
    return frame(PING, 0, 0, opaque)


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, struct.pack(">I", increment))


def rst_stream(stream_id: int, code: int = 8) -> bytes:   # CANCEL
    return frame(RST_STREAM, 0, stream_id, struct.pack(">I", code))


def priority(stream_id: int, depends_on: int = 0, weight: int = 16) -> bytes:
    return frame(PRIORITY, 0, stream_id, struct.pack(">IB", depends_on, weight))


def headers(stream_id: int, block: bytes, *, end_stream: bool = False,
            end_headers: bool = True) -> bytes:
    flags = (END_STREAM if end_stream else 0) | (END_HEADERS if end_headers else 0)
    return frame(HEADERS, flags, stream_id, block)


def continuation(stream_id: int, block: bytes, *, end_headers: bool = False) -> bytes:
    return frame(CONTINUATION, END_HEADERS if end_headers else 0, stream_id, block)


def data(stream_id: int, payload: bytes, *, end_stream: bool = False) -> bytes:
    return frame(DATA, END_STREAM if end_stream else 0, stream_id, payload)


def request_head(port: int, path: str, extra: list[tuple[str, str]] | None = None, *,
                 method: str = "GET") -> list[tuple[str, str]]:
    return [(":method", method), (":path", path), (":scheme", "http"),
            (":authority", f"127.0.0.1:{port}"), *(extra or [])]


class Stalled(Exception):
    """The server stopped reading: a send did not complete within its timeout."""


@dataclass
class Received:
    goaway: int | None = None        # the error code of the first GOAWAY
    resets: dict[int, int] = field(default_factory=dict)   # stream -> RST_STREAM code
    statuses: dict[int, int] = field(default_factory=dict)
    data_bytes: int = 0
    data_frames: list[tuple[int, int, int]] = field(default_factory=list)   # (stream, length, flags)
    bodies: dict[int, bytes] = field(default_factory=dict)   # stream -> its DATA, in order
    ping_acks: int = 0
    settings_acks: int = 0
    closed: bool = False             # the server ended the connection (EOF or reset)


class RawH2:
    def __init__(self, stream: anyio.abc.SocketStream, port: int, *,
                 send_timeout: float) -> None:
        self.stream = stream
        self.port = port
        self.send_timeout = send_timeout
        self.got = Received()
        self.changed = anyio.Event()
        self._encoder = hpack.Encoder()
        self._decoder = hpack.Decoder()
        self._decoder.max_header_list_size = 1 << 30
        self._buffer = b""
        self._reader = anyio.CancelScope()
        self.answer_pings = False
        self._leaving = False
        self._pongs: list[bytes] = []

    @classmethod
    async def connect(cls, port: int, tg: anyio.abc.TaskGroup, *, preface: bool = True,
                      local: dict[int, int] | None = None, read: bool = True,
                      answer_pings: bool = False, send_timeout: float = 20) -> RawH2:
        """A connection (the preface and ``local`` settings sent unless ``preface`` is
        false); with ``read`` false nothing the server sends is read (its send buffer
        and ours fill up); ``answer_pings``: the server's own PINGs are acknowledged
        (as a live client does), else never."""
        raw = cls(await anyio.connect_tcp("127.0.0.1", port), port, send_timeout=send_timeout)
        raw.answer_pings = answer_pings
        if preface:
            await raw.send(PREFACE + settings(local))
        if read:
            tg.start_soon(raw._read)
        return raw

    def read_in(self, tg: anyio.abc.TaskGroup) -> None:
        """Start reading now (after a flood sent with ``read=False``)."""
        tg.start_soon(self._read)

    async def __aenter__(self) -> RawH2:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._leaving = True        # our own close is not the server's (trio's reader
        self._reader.cancel()       # sees ClosedResourceError before its cancellation)
        await self.stream.aclose()

    def block(self, fields: list[tuple[str, str]]) -> bytes:
        return self._encoder.encode(fields)

    async def send(self, payload: bytes) -> None:
        """Raises ``Stalled`` when the server does not take it in time; returns quietly
        once the server ended the connection."""
        if self.got.closed:
            return
        with anyio.move_on_after(self.send_timeout) as scope:
            try:
                await self.stream.send(payload)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError,
                    ConnectionResetError, BrokenPipeError):
                self._close()
        if scope.cancelled_caught:
            raise Stalled

    async def ended(self, timeout: float) -> bool:
        """Whether the server sent GOAWAY or ended the connection within ``timeout``."""
        with anyio.move_on_after(timeout):
            while self.got.goaway is None and not self.got.closed:
                await self.changed.wait()
        return self.got.goaway is not None or self.got.closed

    def _close(self) -> None:
        if self._leaving:
            return
        self.got.closed = True
        self._poke()

    def _poke(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()

    async def _read(self) -> None:
        with self._reader:
            while True:
                try:
                    chunk = await self.stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError,
                        anyio.ClosedResourceError, ConnectionResetError):
                    self._close()
                    return
                self._buffer += chunk
                self._parse()
                self._poke()
                while self._pongs:
                    await self.send(self._pongs.pop())

    def _parse(self) -> None:
        while len(self._buffer) >= 9:
            length = int.from_bytes(self._buffer[:3], "big")
            if len(self._buffer) < 9 + length:
                return
            kind, flags = self._buffer[3], self._buffer[4]
            stream_id = int.from_bytes(self._buffer[5:9], "big") & MAX_WINDOW
            payload = self._buffer[9:9 + length]
            self._buffer = self._buffer[9 + length:]
            if kind == GOAWAY and self.got.goaway is None:
                self.got.goaway = int.from_bytes(payload[4:8], "big")
            elif kind == RST_STREAM:
                self.got.resets[stream_id] = int.from_bytes(payload[:4], "big")
            elif kind == PING and flags & ACK:
                self.got.ping_acks += 1
            elif kind == PING and self.answer_pings:
                self._pongs.append(frame(PING, ACK, 0, payload))
            elif kind == SETTINGS and flags & ACK:
                self.got.settings_acks += 1
            elif kind == DATA:
                self.got.data_bytes += length
                self.got.data_frames.append((stream_id, length, flags))
                self.got.bodies[stream_id] = self.got.bodies.get(stream_id, b"") + payload
            elif kind == HEADERS:
                try:
                    fields = dict(self._decoder.decode(payload))
                except Exception:   # a CONTINUATION-split block: not needed here
                    continue
                if ":status" in fields:
                    self.got.statuses.setdefault(stream_id, int(fields[":status"]))
