"""An answer's body with its content coding undone step by step: no step gives more than
``STEP`` bytes, so a reader that counts as it goes (``acp_server.client.bounded``) holds
at most its cap and one step, however much a raw chunk expands.

    async for piece in decoded(response):     # the body, decoded, at most STEP at a time
        body += piece
        if len(body) > cap: ...                # stop: nothing more was inflated

Contracts:

* The raw body is read (``aiter_raw``) and inflated here: httpx's own decoders inflate a
  whole raw chunk at once (a 64 KiB chunk of a gzip bomb is ~64 MiB before anyone can
  count it).
* ``identity`` (or no ``Content-Encoding``), ``gzip`` (``x-gzip``) and ``deflate`` (zlib-
  wrapped, or raw as some servers send it) are read. Any other coding, or more than one,
  raises ``DaemonProtocolError`` "… answered in an encoding the client does not read:
  'br'"; a body that cannot be inflated raises ``DaemonProtocolError`` "… could not be
  inflated". Bytes after the end of the compressed stream are ignored; a stream cut
  short gives what it held.
* The clients ask for ``Accept-Encoding: identity`` (``IDENTITY``, in every request's
  ``request_headers``): the daemon compresses
  nothing, and a proxy that compresses an event stream holds its events back. A proxy
  that compresses anyway is read as above.
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator, Iterator

import httpx

from acp_server.bearer import bearer_token
from acp_server.client.errors import DaemonProtocolError

STEP = 64 * 1024
IDENTITY = {"Accept-Encoding": "identity"}


def request_headers(token: str | None) -> dict[str, str]:
    """What every client request carries: ``IDENTITY``, and the bearer ``token`` if any
    (``acp_server.bearer``: stripped; one no header can carry is ``UnsendableTokenError``,
    which never shows it)."""
    token = bearer_token(token)
    return {**IDENTITY, **({"Authorization": f"Bearer {token}"} if token else {})}

_GZIP = 16 + zlib.MAX_WBITS


def _where(response: httpx.Response) -> str:
    try:
        request = response.request
    except RuntimeError:   # a Response made by hand (no request)
        return "the server"
    return f"{request.method} {request.url.path}"


class Inflater:
    """One body's decoder: ``feed`` raw bytes, get decoded pieces of at most ``STEP``."""

    def __init__(self, coding: str, where: str) -> None:
        coding = coding.strip().lower()
        if coding not in ("", "identity", "gzip", "x-gzip", "deflate"):
            raise DaemonProtocolError(
                f"{where} answered in an encoding the client does not read: {coding!r}")
        self.where = where
        self.coding = coding
        self._z = zlib.decompressobj(_GZIP) if coding in ("gzip", "x-gzip") else None
        self._start = b""   # deflate: the first bytes, until the header can be told

    def feed(self, data: bytes) -> Iterator[bytes]:
        if self.coding in ("", "identity"):
            if data:
                yield data
            return
        if self._z is None:
            self._start += data
            if len(self._start) < 2:
                return
            data, self._start = self._start, b""
            self._z = zlib.decompressobj(zlib.MAX_WBITS if _zlib_header(data)
                                         else -zlib.MAX_WBITS)
        while not self._z.eof:
            try:
                out = self._z.decompress(data, STEP)
            except zlib.error as exc:
                raise DaemonProtocolError(f"{self.where} answered a {self.coding} body that "
                                          f"could not be inflated ({exc})") from exc
            if out:
                yield out
            data = self._z.unconsumed_tail
            if not data and len(out) < STEP:
                return   # all in, and nothing held back: the next chunk continues


def _zlib_header(data: bytes) -> bool:
    """``deflate`` as the standard says (a zlib stream), not raw deflate."""
    return data[0] & 0x0F == 8 and ((data[0] << 8) | data[1]) % 31 == 0


async def decoded(response: httpx.Response) -> AsyncIterator[bytes]:
    """An open (streamed) answer's body, decoded, a piece of at most ``STEP`` at a time."""
    inflater = Inflater(response.headers.get("content-encoding", ""), _where(response))
    async for raw in response.aiter_raw():
        for piece in inflater.feed(raw):
            yield piece
