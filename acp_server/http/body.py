"""The one capped body reader and JSON decoder of every front door.

    raw = await read_body(request, limit=settings.max_body_bytes)   # BodyTooLarge
    value = decode_json(raw, decoder)                                # JsonTooDeep, msgspec errors

Contracts:

* ``read_body`` refuses a ``Content-Length`` above ``limit`` without keeping anything,
  and stops keeping bytes as soon as the bytes received pass ``limit``:
  ``BodyTooLarge``. Before the refusal it reads and discards what the client still
  sends, up to ``DRAIN_MAX_BYTES`` in all and ``DRAIN_S`` seconds (nothing when a larger
  body is declared): most clients send their whole body before they read, and an HTTP
  server that closes a connection with unread bytes (granian does) makes them see a
  reset instead of the 413.
  A client that goes away in the middle of the body raises ``ClientDisconnected``
  (the door answers nothing; the server logs one quiet line).
* ``check_json`` is a bounded pre-scan run before msgspec sees the bytes: nesting
  deeper than ``MAX_JSON_DEPTH`` or more than ``MAX_JSON_CONTAINERS`` objects and
  arrays → ``JsonTooDeep`` / ``JsonTooLarge``. Brackets inside strings do not
  count. The scan is a few C-level passes over the bytes (``count``, ``replace``,
  ``split``, ``translate``); only stretches that come close to the depth limit are
  walked exactly. Malformed JSON passes the scan and is left to msgspec to refuse.
* ``decode_json`` = ``check_json`` + the door's decoder; a ``RecursionError`` from
  msgspec (which the scan makes unreachable) is still answered as ``JsonTooDeep``.
* Every failure is a ``BodyError`` with a ``message``; each door maps it to its
  own error shape (REST ``{error, code}``, LMSP problem ``invalid_request`` /
  ``payload_too_large``, ``/acp`` JSON-RPC ``-32700`` / 413, WebSocket an error reply).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import AsyncIterator
from typing import Any, TypeVar

import anyio
import msgspec
from starlette.requests import ClientDisconnect, Request

T = TypeVar("T")

MAX_JSON_DEPTH = 128
MAX_JSON_CONTAINERS = 200_000
_CHUNK = 256
_NOT_BRACKETS = bytes(range(256)).translate(None, b"[]{}")
_OPEN_CLOSE = bytes.maketrans(b"{}", b"[]")
_STEP = bytes.maketrans(b"[]", b"\x02\x00")   # open +1, close -1, as (value - 1)


class BodyError(Exception):
    code = "invalid_json"

    def __init__(self, message: str, limit: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.limit = limit


class BodyTooLarge(BodyError):
    code = "payload_too_large"


class JsonTooDeep(BodyError):
    code = "json_too_deep"


class JsonTooLarge(BodyError):
    code = "json_too_complex"


class ClientDisconnected(BodyError):
    code = "client_disconnected"


def too_large(limit: int) -> BodyTooLarge:
    return BodyTooLarge(f"Request body too large (limit {limit} bytes)", limit)


DRAIN_MAX_BYTES = 64 << 20   # discarded at most before a 413 (see the contracts)
DRAIN_S = 5.0


async def read_body(request: Request, *, limit: int) -> bytes:
    """The raw body, at most ``limit`` bytes."""
    declared = request.headers.get("content-length")
    stream = request.stream()
    if declared is not None and declared.isascii() and declared.isdigit() and int(declared) > limit:
        if int(declared) <= DRAIN_MAX_BYTES:
            await _discard(stream, DRAIN_MAX_BYTES)
        raise too_large(limit)
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in stream:
            size += len(chunk)
            if size > limit:
                await _discard(stream, DRAIN_MAX_BYTES - size)
                raise too_large(limit)
            chunks.append(chunk)
    except ClientDisconnect:
        raise ClientDisconnected("The client disconnected during the body") from None
    return b"".join(chunks)


async def _discard(stream: AsyncIterator[bytes], budget: int) -> None:
    """Read and drop the rest of the body: at most ``budget`` bytes and ``DRAIN_S``."""
    with anyio.move_on_after(DRAIN_S):
        try:
            async for chunk in stream:
                budget -= len(chunk)
                if budget < 0:
                    return
        except ClientDisconnect:
            return


def _brackets(data: bytes) -> bytes:
    """The ``[``/``]`` sequence of the structure (``{}`` folded in), strings removed."""
    if b"\\" in data:   # escapes first, so that every remaining quote delimits a string
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    if b'"' in data:
        data = b"".join(data.split(b'"')[::2])
    return data.translate(_OPEN_CLOSE, _NOT_BRACKETS)


def _deepest(chunk: bytes, start: int) -> int:
    """The largest nesting reached inside ``chunk`` entered at depth ``start``."""
    steps = map(operator.sub, chunk.translate(_STEP), itertools.repeat(1))
    return start + max(itertools.accumulate(steps))


def check_json(data: bytes | str, *, max_depth: int = MAX_JSON_DEPTH,
               max_containers: int = MAX_JSON_CONTAINERS) -> None:
    """Raise ``JsonTooDeep`` / ``JsonTooLarge`` before a decoder recurses into ``data``."""
    raw = data.encode() if isinstance(data, str) else bytes(data)
    opens = raw.count(b"[") + raw.count(b"{")
    if opens <= max_depth:
        return   # cannot be deeper than the number of brackets
    shape = _brackets(raw)
    opened = shape.count(b"[")
    if opened > max_containers:
        raise JsonTooLarge(f"JSON body holds more than {max_containers} objects and arrays",
                           max_containers)
    if opened <= max_depth:
        return
    depth = 0
    for at in range(0, len(shape), _CHUNK):
        chunk = shape[at:at + _CHUNK]
        chunk_opens = chunk.count(b"[")
        if depth + chunk_opens > max_depth and _deepest(chunk, depth) > max_depth:
            raise JsonTooDeep(f"JSON nested deeper than {max_depth} levels", max_depth)
        depth += 2 * chunk_opens - len(chunk)


def decode_json(data: bytes | str, decoder: msgspec.json.Decoder[T], **limits: Any) -> T:
    """``check_json`` then ``decoder.decode``; msgspec's own errors pass through."""
    if limits or type(data) is not bytes \
            or data.count(b"[") + data.count(b"{") > MAX_JSON_DEPTH:
        check_json(data, **limits)   # else it could not be deeper: check_json's first test
    try:
        return decoder.decode(data)
    except RecursionError:
        raise JsonTooDeep("JSON nested too deeply", limits.get("max_depth",
                                                               MAX_JSON_DEPTH)) from None


__all__ = ["MAX_JSON_CONTAINERS", "MAX_JSON_DEPTH", "BodyError", "BodyTooLarge",
           "ClientDisconnected", "JsonTooDeep", "JsonTooLarge", "check_json", "decode_json",
           "read_body", "too_large"]
