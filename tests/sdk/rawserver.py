"""A daemon that sends anything: a raw HTTP/1.1 server on a loopback port (anyio sockets,
either backend), each request handed to a script that writes whatever bytes it likes.

    async def proxy_page(conn: Conn) -> None:
        await conn.answer(502, b"<html>Bad Gateway</html>", content_type="text/html")

    async with raw_server(proxy_page) as server:      # or raw_server(routes({...}))
        async with DaemonClient(server.url) as client: ...
    server.requests[0].headers["authorization"]           # what the client sent
    await server.seen.wait()                               # a request has arrived

Contracts: the script gets each request once its head (request line and headers, at most
64 KiB) has been read; the request's body is left unread (but for what came with the head: ``early``). One request per connection:
the connection is closed when the script returns (a script that never returns keeps it
open until the server's block ends). ``requests`` records every request's method, target
and headers (lower-cased names) before its script runs; ``seen`` is set by the first.
``Conn.closed`` is set when the script's writes fail or it sees the client go.
Nothing here sleeps except a script that paces its own bytes (a slow-loris server).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import anyio
import anyio.abc

HEAD_LIMIT = 64 * 1024


@dataclass
class RawRequest:
    method: str
    target: str
    headers: dict[str, str]
    early: bytes = b""   # what came with the head of the body (the rest is left unread)


@dataclass
class Conn:
    request: RawRequest
    stream: anyio.abc.SocketStream
    closed: anyio.Event = field(default_factory=anyio.Event)

    async def send(self, data: bytes) -> bool:
        """Write ``data``; False once the client has gone."""
        try:
            await self.stream.send(data)
            return True
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            self.closed.set()
            return False

    async def answer(self, status: int, body: bytes = b"", *, content_type: str =
                     "application/json", headers: dict[str, str] | None = None,
                     reason: str = "Whatever") -> None:
        """A whole answer with its Content-Length."""
        lines = [f"HTTP/1.1 {status} {reason}", f"Content-Type: {content_type}",
                 f"Content-Length: {len(body)}", "Connection: close",
                 *(f"{k}: {v}" for k, v in (headers or {}).items())]
        await self.send(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)

    async def head(self, status: int = 200, *, content_type: str = "text/event-stream",
                   headers: dict[str, str] | None = None) -> None:
        """The head of an answer whose body follows until the connection closes."""
        lines = [f"HTTP/1.1 {status} OK", f"Content-Type: {content_type}",
                 "Connection: close", *(f"{k}: {v}" for k, v in (headers or {}).items())]
        await self.send(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))

    async def until_gone(self) -> None:
        """Wait until the client closes its side (reads and drops what it sends)."""
        with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError,
                                 anyio.ClosedResourceError, OSError):
            while True:
                await self.stream.receive()
        self.closed.set()


Script = Callable[[Conn], Awaitable[None]]


def routes(table: dict[str, Script]) -> Script:
    """One script per ``"METHOD /path-prefix"`` (the longest matching prefix wins, the
    query ignored); anything else is answered 404."""
    async def route(conn: Conn) -> None:
        path = conn.request.target.split("?", 1)[0]
        found = [key for key in table if conn.request.method == key.split(" ", 1)[0]
                 and path.startswith(key.split(" ", 1)[1])]
        if not found:
            await conn.answer(404, b'{"error": "not here", "code": "not_found"}')
            return
        await table[max(found, key=len)](conn)
    return route


def json_answer(body: bytes, status: int = 200, headers: dict[str, str] | None = None,
                content_type: str = "application/json") -> Script:
    async def script(conn: Conn) -> None:
        await conn.answer(status, body, headers=headers, content_type=content_type)
    return script


@dataclass
class RawServer:
    url: str
    requests: list[RawRequest] = field(default_factory=list)
    seen: anyio.Event = field(default_factory=anyio.Event)
    conns: list[Conn] = field(default_factory=list)


async def _read_head(stream: anyio.abc.SocketStream) -> RawRequest | None:
    data = b""
    while b"\r\n\r\n" not in data:
        if len(data) > HEAD_LIMIT:
            return None
        try:
            data += await stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
            return None
    raw_head, early = data.split(b"\r\n\r\n", 1)
    head = raw_head.decode("latin-1").split("\r\n")
    method, target, _version = head[0].split(" ", 2)
    headers = {}
    for line in head[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return RawRequest(method, target, headers, early)


@contextlib.asynccontextmanager
async def raw_server(script: Script) -> AsyncIterator[RawServer]:
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    server = RawServer(f"http://127.0.0.1:{port}")

    async def handle(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            request = await _read_head(stream)
            if request is None:
                return
            server.requests.append(request)
            server.seen.set()
            conn = Conn(request, stream)
            server.conns.append(conn)
            await script(conn)

    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, handle)
        try:
            yield server
        finally:
            tg.cancel_scope.cancel()
