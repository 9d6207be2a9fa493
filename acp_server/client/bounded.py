"""What the SDK reads of a daemon's answers, bounded: a server (or a proxy in front of
it) that misbehaves cannot make the client hold more than these caps.

    response = await read_answer(http, "GET", "/health", max_bytes=MAX_ANSWER_BYTES,
                                 deadline=30.0)
    response.content                                  # the whole body, decoded, capped

    async with http.stream("GET", path, headers=EVENT_STREAM_HEADERS) as response:
        check_event_stream(response)                  # DaemonProtocolError if it is not one
        async for data in event_data(response, max_bytes=MAX_EVENT_BYTES):
            ...                                       # each event's data (str)
        async for event, event_id, data in events(response, max_bytes=MAX_EVENT_BYTES):
            ...                                       # with its event and id fields

Contracts:

* ``read_answer`` sends the request and reads the answer's body, decoded (a gzip or
  deflate body is inflated step by step and counted as it expands:
  ``acp_server.client.inflate``), never past ``max_bytes``: a longer one raises
  ``DaemonProtocolError`` naming the cap, the connection closed. An answer that is not
  a success (status 300 and up) is read no further than ``MAX_ERROR_BYTES``, the rest
  dropped (of a body that cannot be decoded, what could be). The whole exchange
  (connect, send, head and body) ends within ``deadline`` seconds (``None``: no such
  bound), else it raises ``httpx.ReadTimeout``: a server that trickles its answer a
  byte at a time cannot hold the caller past it. It returns a ``Response`` with that
  body as its content (status and headers as answered).
* ``events`` is the event-stream format: lines end in CRLF, LF or CR; each event's
  ``data:`` lines are joined with LF, its ``event`` field names it (``message`` when it
  has none), its ``id`` field is its id (``None`` when it has none: an id is not carried
  over to the next event; the daemon's events carry theirs in their data too); comments
  and ``retry`` are ignored; an event without data is none. One line, or one event's
  data, over ``max_bytes`` raises ``DaemonProtocolError``: what it holds is bounded by
  the cap whatever the server sends. Text is decoded as UTF-8 (a bad byte is replaced).
  With ``line_timeout`` each line must be complete within it of the one before, plus a
  second per ``MIN_LINE_RATE`` bytes it holds, else ``httpx.ReadTimeout``.
  ``event_data`` is its events' data alone (the SDK's streams); the conformance runner
  reads ``events`` whole.
* ``read_capped`` reads an open answer's body no further than ``max_bytes`` (an event
  stream's refusal: its error body); ``with_body`` makes a read ``Response`` of it.
* ``LineReader`` is the event-stream line splitter alone.
* ``check_event_stream`` refuses an answer whose ``Content-Type`` is not
  ``text/event-stream`` (an HTML page from a proxy): ``DaemonProtocolError``.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import Any, NamedTuple

import anyio
import httpx

from acp_server.client.errors import DaemonProtocolError, redact
from acp_server.client.inflate import decoded

MIB = 1024 * 1024
MAX_ANSWER_BYTES = 128 * MIB   # one JSON answer (a session's load with its history: < 64 MiB)
MAX_EVENT_BYTES = 96 * MIB     # one SSE line or event (an agent's line: at most 64 MiB)
MAX_ERROR_BYTES = 64 * 1024   # what is read of an error answer (a refusal's body)
MIN_LINE_RATE = 16 * 1024     # bytes a second a long event-stream line must arrive at, at least
EVENT_STREAM_HEADERS = {"Accept": "text/event-stream", "Cache-Control": "no-store"}


def _size(limit: int) -> str:
    return f"{limit // MIB} MiB" if limit >= MIB and limit % MIB == 0 else f"{limit} bytes"


async def read_answer(http: httpx.AsyncClient, method: str, url: str, *, max_bytes: int,
                      deadline: float | None = None, **kwargs: Any) -> httpx.Response:
    """``http.request(method, url, **kwargs)`` with its body read no further than
    ``max_bytes``, all of it within ``deadline`` seconds (see the module contract)."""
    with anyio.move_on_after(deadline) as scope:
        async with http.stream(method, url, **kwargs) as response:
            if response.status_code >= 300:
                body = await read_capped(response)
            else:
                body = await read_body(response, max_bytes=max_bytes)
        return with_body(response, body)
    assert scope.cancelled_caught
    raise httpx.ReadTimeout(redact(f"{method} {url} did not finish within {deadline} s"))


async def read_body(response: httpx.Response, *, max_bytes: int, cut: bool = False) -> bytes:
    """An open (streamed) answer's body, decoded; past ``max_bytes`` it raises
    ``DaemonProtocolError``, or with ``cut`` returns the first ``max_bytes`` and reads
    no further (and what could be decoded of a body that cannot be)."""
    body = bytearray()
    try:
        async for piece in decoded(response):
            body += piece
            if len(body) > max_bytes:
                if cut:
                    return bytes(body[:max_bytes])
                raise DaemonProtocolError(
                    f"{response.request.method} {response.request.url.path} answered more "
                    f"than {_size(max_bytes)}; not read further")
    except DaemonProtocolError:
        if not cut:
            raise
    return bytes(body)


def with_body(response: httpx.Response, body: bytes) -> httpx.Response:
    """A read ``Response`` of ``response``'s status and headers with ``body`` as its
    content (already decoded: no content coding or length left in its headers)."""
    headers = [(k, v) for k, v in response.headers.multi_items()
               if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")]
    return httpx.Response(response.status_code, headers=headers, content=body,
                          request=response.request, extensions=response.extensions)


async def read_capped(response: httpx.Response, *, max_bytes: int = MAX_ERROR_BYTES) -> bytes:
    """The body of an open (streamed) answer, read no further than ``max_bytes``: what an
    error answer says, the rest left unread (the connection is closed with it)."""
    return await read_body(response, max_bytes=max_bytes, cut=True)


def check_event_stream(response: httpx.Response) -> None:
    kind = response.headers.get("content-type", "").partition(";")[0].strip().lower()
    if kind != "text/event-stream":
        raise DaemonProtocolError(f"Not an event stream: the answer is {kind or 'untyped'!r}")


class LineReader:
    """Bytes in, whole lines out (without their end); a line over ``limit`` raises."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._line = bytearray()
        self._after_cr = False   # the last chunk ended in CR: an LF first is its pair

    def feed(self, chunk: bytes) -> list[bytes]:
        lines: list[bytes] = []
        start = 0
        if self._after_cr and chunk[:1] == b"\n":
            start = 1
        self._after_cr = False
        while start < len(chunk):
            cr, lf = chunk.find(b"\r", start), chunk.find(b"\n", start)
            ends = [i for i in (cr, lf) if i >= 0]
            if not ends:
                self._take(chunk[start:])
                break
            end = min(ends)
            self._take(chunk[start:end])
            lines.append(bytes(self._line))
            self._line.clear()
            start = end + 1
            if chunk[end:end + 1] == b"\r":
                if start < len(chunk) and chunk[start:start + 1] == b"\n":
                    start += 1
                elif start == len(chunk):
                    self._after_cr = True
        return lines

    @property
    def pending(self) -> int:
        """The bytes of the line not complete yet."""
        return len(self._line)

    def _take(self, part: bytes) -> None:
        if len(self._line) + len(part) > self.limit:
            raise DaemonProtocolError(f"The event stream sent a line over {_size(self.limit)}")
        self._line += part


async def _next_chunk(chunks: AsyncIterator[bytes], deadline: float,
                      line_timeout: float | None) -> bytes | None:
    """The next chunk (``None`` at the end), or ``httpx.ReadTimeout`` past ``deadline``."""
    with anyio.CancelScope(deadline=deadline) as scope:
        try:
            return await chunks.__anext__()
        except StopAsyncIteration:
            return None
    assert scope.cancelled_caught
    raise httpx.ReadTimeout(f"the event stream completed no line in {line_timeout} s")


class ServerEvent(NamedTuple):
    """One event of an event stream: its ``event`` field (``message`` when it has none),
    its ``id`` field (``None`` when it has none) and its data lines joined with LF."""

    event: str
    id: str | None
    data: str


def _text(value: bytes) -> str:
    return value.decode("utf-8", "replace")


async def events(response: httpx.Response, *, max_bytes: int,
                 line_timeout: float | None = None) -> AsyncIterator[ServerEvent]:
    """Each event of an open event stream that carries data (see the module contract)."""
    lines = LineReader(max_bytes)
    event, last_id, data, size = b"", None, [], 0
    chunks = decoded(response).__aiter__()
    since = anyio.current_time()
    while True:
        deadline = math.inf
        if line_timeout is not None:
            deadline = since + line_timeout + lines.pending / MIN_LINE_RATE
        chunk = await _next_chunk(chunks, deadline, line_timeout)
        if chunk is None:
            return
        found = lines.feed(chunk)
        for line in found:
            if not line:
                if data:
                    yield ServerEvent(_text(event) or "message",
                                      None if last_id is None else _text(last_id),
                                      _text(b"\n".join(data)))
                event, last_id, data, size = b"", None, [], 0
                continue
            field, colon, value = line.partition(b":")
            if not colon:
                value = b""
            elif value.startswith(b" "):
                value = value[1:]
            if field == b"data":
                size += len(value) + 1
                if size > max_bytes:
                    raise DaemonProtocolError(
                        f"The event stream sent an event over {_size(max_bytes)}")
                data.append(value)
            elif field == b"event":
                event = value
            elif field == b"id":
                last_id = value
            # else: a comment (empty field), retry, or a field no one knows
        if found:   # the time the caller spent on the events is not the server's
            since = anyio.current_time()


async def event_data(response: httpx.Response, *, max_bytes: int,
                     line_timeout: float | None = None) -> AsyncIterator[str]:
    """Each event's data (``events`` without the ``event`` and ``id`` fields)."""
    async for found in events(response, max_bytes=max_bytes, line_timeout=line_timeout):
        yield found.data
