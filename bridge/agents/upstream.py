"""Bounded reading of an OpenAI-compatible model server's HTTP responses (the model
agent's upstream: a server we do not control, reached over the network).

    body = BoundedBody(response, limit=MAX_STREAM_BYTES)
    events = SseParser(max_event_bytes=MAX_EVENT_BYTES)
    while chunk := await body.read():
        for event, data in events.feed(chunk):
            ...
    detail = await error_detail(response)          # an error status's body, cut

Contracts:

* Every limit counts decoded bytes: ``BoundedBody`` reads the raw body and inflates
  ``gzip``/``deflate`` itself, at most ``INFLATE_STEP`` bytes a step with a checkpoint
  before each (other tasks run, a cancel is seen), so a small compressed body that
  expands hugely is cut at ``limit`` like a plain one and holds no one meanwhile (the
  client asks for ``Accept-Encoding: identity``; another coding is an ``UpstreamError``).
  gzip members one after another are one body; ``deflate`` is zlib or raw DEFLATE. A
  compressed body cut off before its end (its gzip trailer, its zlib checksum), or
  followed by bytes that are no gzip member, is an ``UpstreamError``.
* ``SseParser`` is the event-stream format (lines end in CRLF, LF or CR, each split
  anywhere across chunks; a UTF-8 BOM opening the stream is dropped; ``data:`` lines
  join with LF; comments and ``id``/``retry`` fields ignored; an event without data is
  none, and so is one the stream ends in before its blank line). One line, or one event's data, over ``max_event_bytes`` is an
  ``UpstreamError``: what it keeps is bounded by the cap whatever the server sends.
* ``decode_lenient`` and ``Surrogates``: JSON whose strings escape lone UTF-16
  surrogates (an emoji cut in halves across chunks) is read, the halves joined, a half
  alone is U+FFFD; no text with a surrogate in it goes further.
* ``error_detail`` reads at most ``ERROR_DETAIL_BYTES`` of a body and never more, and
  names an OpenAI-shaped ``{"error": {"message": ...}}``'s message when there is one.
  JSON the decoder cannot take (nested past its depth: a ``RecursionError``) is text.
* ``UpstreamError``'s message is a cause ("sent an SSE event over 4 MiB"), to be put
  after the server's name, as ``public_url`` shows it (credentials in the URL hidden).
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import AsyncIterator
from typing import Any

import anyio.lowlevel
import httpx
import msgspec

MIB = 1024 * 1024
MAX_EVENT_BYTES = 4 * MIB      # one SSE line or one event's data (a chunk is ~200 bytes)
MAX_STREAM_BYTES = 256 * MIB   # one response body, decoded (~1M tokens of chunk framing)
ERROR_DETAIL_BYTES = 2048      # what is read of an error status's body
INFLATE_STEP = 64 * 1024       # decoded bytes per step of a compressed body

_EOL = re.compile(rb"\r\n|\r|\n")
BOM = b"\xef\xbb\xbf"


class UpstreamError(Exception):
    """The server misbehaved; the message says how (it follows the server's name)."""


def public_url(url: str) -> str:
    """``url`` as messages and logs show it: credentials in it hidden
    (``http://alice:s3cret@host/v1`` → ``http://***@host/v1``)."""
    scheme, sep, rest = url.partition("://")
    authority, slash, path = rest.partition("/")
    if sep and "@" in authority:
        return f"{scheme}://***@{authority.rpartition('@')[2]}{slash}{path}"
    return url


def split_credentials(url: str) -> tuple[str, httpx.BasicAuth | None]:
    """``url`` without the credentials in it, and those as basic auth (so that no
    request's URL holds them: httpx logs each request's URL)."""
    shown = public_url(url)
    if shown == url:
        return url, None
    parsed = httpx.URL(url)
    return shown.replace("***@", "", 1), httpx.BasicAuth(parsed.username, parsed.password)


def size_text(limit: int) -> str:
    """``4 MiB``, ``64 KiB``, ``100 bytes``."""
    if limit >= MIB and limit % MIB == 0:
        return f"{limit // MIB} MiB"
    if limit >= 1024 and limit % 1024 == 0:
        return f"{limit // 1024} KiB"
    return f"{limit} bytes"


class BoundedBody:
    """A response body, decoded, read chunk by chunk; past ``limit`` bytes in all,
    ``read`` raises ``UpstreamError``. ``b""`` at the end."""

    def __init__(self, response: httpx.Response, *, limit: int) -> None:
        coding = response.headers.get("content-encoding", "").strip().lower()
        if coding in ("", "identity"):
            self._coding = ""
        elif coding in ("gzip", "x-gzip", "deflate"):
            self._coding = "deflate" if coding == "deflate" else "gzip"
        else:
            raise UpstreamError(f"sent Content-Encoding {coding!r}, which the model agent "
                                f"does not decode (it asks for identity)")
        self._raw: AsyncIterator[bytes] = response.aiter_raw()
        self._inflater: Any = None   # the member being inflated (None: between members)
        self._members = 0        # members begun (gzip: one after another, RFC 1952)
        self._pending = b""      # compressed bytes not inflated yet
        self._ended = False      # the raw body ended (what zlib holds may still come)
        self._limit = limit
        self.total = 0

    async def read(self) -> bytes:
        chunk = await (self._inflate() if self._coding else anext(self._raw, b""))
        self.total += len(chunk)
        if self.total > self._limit:
            raise UpstreamError(f"sent more than {size_text(self._limit)} in one reply")
        return chunk

    async def _inflate(self) -> bytes:
        """The next decoded bytes (at most ``INFLATE_STEP``), ``b""`` at a whole end;
        a checkpoint first (a step needs no network read: a bomb must not hold the loop)."""
        await anyio.lowlevel.checkpoint()
        while True:
            if not self._ended and (not self._pending or (
                    self._inflater is None and len(self._pending) < 2)):
                more = await anext(self._raw, b"")
                self._ended = not more
                self._pending += more
                continue
            if self._inflater is None:   # a member begins here, or the body ends
                if not self._pending:
                    return b""
                self._inflater = self._begin(self._pending)
            try:
                chunk = self._inflater.decompress(self._pending, INFLATE_STEP)
            except zlib.error as exc:
                raise UpstreamError(f"sent a body its Content-Encoding does not "
                                    f"decode ({exc})") from None
            if self._inflater.eof:   # what follows the member is the next one's
                self._pending = self._inflater.unused_data
                self._inflater = None
            else:
                self._pending = self._inflater.unconsumed_tail
                if not chunk and self._ended and not self._pending:
                    raise UpstreamError(f"sent a {self._coding} body cut off before its "
                                        f"end")
            if chunk:
                return chunk

    def _begin(self, head: bytes) -> Any:
        """An inflater for a member starting with ``head`` (two bytes at least, or all
        there is): gzip, zlib, or (``deflate``) raw DEFLATE as some servers send it."""
        self._members += 1
        if head[:2] == b"\x1f\x8b":
            return zlib.decompressobj(16 + zlib.MAX_WBITS)
        if self._members > 1:
            raise UpstreamError(f"sent bytes after the end of its {self._coding} body")
        if len(head) >= 2 and head[0] & 0x0F == 8 and int.from_bytes(head[:2], "big") % 31 == 0:
            return zlib.decompressobj(zlib.MAX_WBITS)   # a zlib header
        if self._coding == "deflate":
            return zlib.decompressobj(-zlib.MAX_WBITS)
        raise UpstreamError("sent a body its Content-Encoding does not decode (no gzip "
                            "header)")

    async def read_at_most(self, size: int) -> bytes:
        """Up to ``size`` bytes (fewer at the end); reads nothing past them."""
        kept = bytearray()
        while len(kept) < size:
            chunk = await self.read()
            if not chunk:
                break
            kept += chunk
        return bytes(kept[:size])


class SseParser:
    """Bytes in, ``(event type, data)`` out; lines and events bounded."""

    def __init__(self, *, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self._max = max_event_bytes
        self._line = bytearray()      # the line being read, without its end
        self._skip_lf = False         # the last chunk ended in CR: a next LF is its pair
        self._head = b""              # the stream's first bytes while they may be a BOM
        self._started = False         # past the stream's first three bytes (or its BOM)
        self._data: list[str] = []
        self._data_bytes = 0
        self._event = ""

    @property
    def kept(self) -> int:
        """Bytes held now (the open line and the event's data): at most the cap."""
        return len(self._line) + self._data_bytes

    def feed(self, chunk: bytes) -> list[tuple[str, str]]:
        if not self._started:   # one UTF-8 byte order mark may open the stream: dropped
            self._head += chunk
            if len(self._head) < len(BOM) and BOM.startswith(self._head):
                return []
            chunk, self._head, self._started = self._head.removeprefix(BOM), b"", True
        if self._skip_lf and chunk[:1] == b"\n":
            chunk = chunk[1:]
        self._skip_lf = False
        events: list[tuple[str, str]] = []
        start = 0
        for end in _EOL.finditer(chunk):
            self._line += chunk[start:end.start()]
            self._check()
            event = self._take_line()
            if event is not None:
                events.append(event)
            start = end.end()
            self._skip_lf = end.group() == b"\r" and start == len(chunk)
        self._line += chunk[start:]
        self._check()
        return events

    def _check(self) -> None:
        if self.kept > self._max:
            raise UpstreamError(f"sent an SSE line or event over {size_text(self._max)}")

    def _take_line(self) -> tuple[str, str] | None:
        line = bytes(self._line)
        self._line.clear()
        if not line:
            return self._dispatch()
        if line.startswith(b":"):
            return None
        name, colon, value = line.partition(b":")
        if colon and value.startswith(b" "):
            value = value[1:]
        if name == b"data":   # counted as received, in bytes, as the cap is
            self._data.append(value.decode("utf-8", "replace"))
            self._data_bytes += len(value) + 1
        elif name == b"event":
            self._event = value.decode("utf-8", "replace")
        return None

    def _dispatch(self) -> tuple[str, str] | None:
        data, event = "\n".join(self._data), self._event or "message"
        had_data = bool(self._data)
        self._data, self._data_bytes, self._event = [], 0, ""
        return (event, data) if had_data else None


def decode_lenient(data: str, kind: type[Any]) -> Any:
    """``data`` as ``kind`` when msgspec refused it only for a lone UTF-16 surrogate
    escape (``"\\ud83d"``: half an emoji, from a server cutting its text by UTF-16
    units): the standard library's decoder takes those. ``None`` when it is bad anyway."""
    if "\\u" not in data:
        return None
    try:
        return msgspec.convert(json.loads(data), kind)
    except (ValueError, RecursionError, msgspec.ValidationError):
        return None


class Surrogates:
    """Pieces of text in which a character may come as two surrogate halves: a high
    half ending a piece waits for the next piece; a half alone becomes U+FFFD."""

    __slots__ = ("held",)

    def __init__(self) -> None:
        self.held = ""

    def join(self, text: str) -> str:
        text, self.held = self.held + text, ""
        if text and "\ud800" <= text[-1] <= "\udbff":
            text, self.held = text[:-1], text[-1]
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


class _ErrorBody(msgspec.Struct):
    error: Any = None
    message: Any = None
    detail: Any = None


def error_message(value: Any) -> str | None:
    """The message of an OpenAI-shaped error value (``{"message", "type", "code"}`` or
    a plain string), with its type and code when given."""
    if isinstance(value, str):
        return value.strip() or None
    if not isinstance(value, dict):
        return None
    message = value.get("message")
    if not isinstance(message, str) or not message.strip():
        return None
    extra = [f"{key} {value[key]}" for key in ("type", "code")
             if isinstance(value.get(key), (str, int)) and value.get(key) not in ("", None)]
    return message.strip() + (f" ({', '.join(extra)})" if extra else "")


def body_message(data: bytes) -> str:
    """An error body as one short text: the JSON error's message, else the text."""
    try:
        parsed = msgspec.json.decode(data, type=_ErrorBody)
    except (msgspec.DecodeError, RecursionError):   # nested past the decoder's depth
        parsed = None
    if parsed is not None:
        for value in (parsed.error, parsed.message, parsed.detail):
            message = error_message(value)
            if message:
                return message
    return " ".join(data.decode("utf-8", "replace").split())


async def error_body(response: httpx.Response, *, limit: int = ERROR_DETAIL_BYTES) -> bytes:
    """At most ``limit`` bytes of an error body (``b""`` for one that cannot be read)."""
    try:
        return await BoundedBody(response, limit=MAX_EVENT_BYTES).read_at_most(limit)
    except (UpstreamError, httpx.HTTPError):
        return b""


async def error_detail(response: httpx.Response, *, limit: int = ERROR_DETAIL_BYTES) -> str:
    """At most ``limit`` bytes of an error body, as one short text (``""`` for none,
    and for a body that cannot be read: the status says enough)."""
    return body_message(await error_body(response, limit=limit))[:500]
