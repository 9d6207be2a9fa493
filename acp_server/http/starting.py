"""The listening socket's answer while the server cannot start yet: 503, in each door's shape.

    sock = listen(settings)
    await answer_starting(sock, DOORS, seconds=2.0)   # then try again

``acp-server serve`` binds its socket before it opens the store. When the store cannot
be opened (PostgreSQL down, a SQLite file it cannot write), the process does not end:
it logs why, answers on that socket for a while and opens the store again
(``acp_server.serve_cli.serve``). Meanwhile a client gets an answer, not a connection that
hangs in the backlog.

Contracts:

* Every request is answered ``503`` with ``Retry-After: 5`` and ``Connection: close``:
  ``/health`` with ``{"status": "starting"}``, any other path with the
  ``store_unavailable`` refusal of its door (REST ``{error, code}``, LMSP a problem,
  ``/acp`` a JSON-RPC error), rendered by the door's own renderer.
* With ``--tls-cert`` (``tls``: ``tls_context(options)``) over TLS only, as the server
  will speak it (HTTP/1.1 by ALPN; with ``--tls-client-ca`` a client certificate that
  CA signed is required): never a byte in clear on a TLS port.
* HTTP/1.x, one request a connection; HTTP/2 by prior knowledge (h2c, as both servers
  will speak it), each request of the first bytes answered the same way, then GOAWAY
  ``NO_ERROR`` (``_answer_http2``). The handshake and the head take at most
  ``HEAD_TIMEOUT_S`` together, the head at most ``MAX_HEAD_BYTES`` (then the connection is closed without an
  answer; HTTP/2: its first requests, ``MAX_HEAD_BYTES`` in all); at most
  ``MAX_ANSWERING`` connections are answered at once, others are closed as accepted.
  Nothing of a request is kept. Once answered, what the client still sends is read and
  dropped for up to ``LINGER_S`` (``LINGER_BYTES``), so the kernel does not reset the
  connection under an answer not yet read.
* ``answer_starting`` returns after ``seconds``, or when its caller cancels it (``acp-server
  serve``'s signal watcher, ``acp_server.serve_cli``). The socket stays open and listening
  for the HTTP server that takes it next; the connections being answered when it
  returns are closed.
"""

from __future__ import annotations

import logging
import socket
import ssl
from collections.abc import Sequence

import anyio
import anyio.abc
import h2.errors
import h2.events
import h2.exceptions
from anyio.streams.tls import TLSStream

from acp_server.http.front import Door
from acp_server.http.h2_machine import Http2Limits, Machine, answer_whole, starts_http2
from acp_server.http.options import HttpOptions
from acp_server.http.policy import Refusal

log = logging.getLogger("acp_server")
HEAD_TIMEOUT_S = 5.0
MAX_HEAD_BYTES = 16 * 1024
MAX_ANSWERING = 64
LINGER_S = 1.0       # an answered connection's later bytes read and dropped this long ...
LINGER_BYTES = 64 * 1024   # ... or up to this many
STARTING = Refusal(503, "store_unavailable",
                   "The server is starting and its store is unavailable; retry later.",
                   headers=((b"retry-after", b"5"),))
_HEALTH = b'{"status":"starting"}'


def answer_body(path: str, doors: Sequence[Door]) -> tuple[bytes, bytes]:
    """The content type and body of the answer to a request for ``path``."""
    if path == "/health":
        return b"application/json", _HEALTH
    door = next((d for d in doors if d.matches(path)), doors[-1])
    return door.render(STARTING)


def answer_bytes(path: str, doors: Sequence[Door]) -> bytes:
    """The whole HTTP/1.1 response to a request for ``path``."""
    content_type, body = answer_body(path, doors)
    head = [b"HTTP/1.1 503 Service Unavailable", b"content-type: " + content_type,
            b"content-length: " + str(len(body)).encode(), b"connection: close",
            *(name + b": " + value for name, value in STARTING.headers)]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def request_path(head: bytes) -> str | None:
    """The path of a request head's first line (origin or absolute form), else None."""
    line = head.split(b"\r\n", 1)[0].split(b" ")
    if len(line) != 3 or not line[2].startswith(b"HTTP/1."):
        return None
    target = line[1].decode("latin-1")
    if "://" in target:   # absolute form: http://host/path
        target = "/" + target.split("://", 1)[1].partition("/")[2]
    return target.split("?", 1)[0] or "/"


def tls_context(options: HttpOptions) -> ssl.SSLContext | None:
    """The server's TLS as ``answer_starting`` speaks it (HTTP/1.1 by ALPN; with
    ``--tls-client-ca``, a client certificate that CA signed required), or None."""
    if options.tls_cert is None or options.tls_key is None:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(options.tls_cert, options.tls_key)
    context.set_alpn_protocols(["http/1.1"])
    if options.tls_client_ca is not None:
        context.load_verify_locations(options.tls_client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


async def _answer(conn: socket.socket, doors: Sequence[Door],
                  limiter: anyio.CapacityLimiter, tls: ssl.SSLContext | None) -> None:
    try:
        stream: anyio.abc.ByteStream = await anyio.abc.SocketStream.from_socket(conn)
    except OSError:
        conn.close()
        return
    async with stream:
        if limiter.available_tokens == 0:
            return   # closed as accepted
        async with limiter:
            head = b""
            with anyio.move_on_after(HEAD_TIMEOUT_S):   # the handshake and the head
                try:
                    if tls is not None:
                        stream = await TLSStream.wrap(stream, server_side=True,
                                                      ssl_context=tls,
                                                      standard_compatible=False)
                    while b"\r\n\r\n" not in head and len(head) < MAX_HEAD_BYTES:
                        head += await stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError, OSError, ssl.SSLError):
                    return
            if tls is None and head and starts_http2(head):
                await _answer_http2(stream, head, doors)
                return
            path = request_path(head) if b"\r\n\r\n" in head else None
            if path is None:
                return
            try:
                await stream.send(answer_bytes(path, doors))
            except (anyio.BrokenResourceError, OSError, ssl.SSLError):
                return
            await _linger(stream)


async def _answer_http2(stream: anyio.abc.ByteStream, first: bytes,
                        doors: Sequence[Door]) -> None:
    """HTTP/2 by prior knowledge (``first``: the bytes read so far, the preface's
    start): the server's SETTINGS, then each request of the bytes that come within
    ``HEAD_TIMEOUT_S`` (``MAX_HEAD_BYTES`` at most) answered 503 as HTTP/1.1 would be
    (its stream reset ``REFUSED_STREAM`` when its window cannot take the body), then
    GOAWAY ``NO_ERROR`` naming the last; a protocol error is answered with h2's GOAWAY."""
    conn = Machine.for_server(Http2Limits(idle_s=HEAD_TIMEOUT_S,
                                          max_header_list=MAX_HEAD_BYTES))
    conn.initiate_connection()
    data, read, last = first, len(first), 0
    with anyio.move_on_after(HEAD_TIMEOUT_S):
        while not last:
            try:
                events = conn.receive_data(data)
            except h2.exceptions.ProtocolError:   # h2 queued its GOAWAY
                break
            for event in events:
                if isinstance(event, h2.events.RequestReceived):
                    _refuse_stream(conn, event.stream_id, event.headers or [], doors)
                    last = event.stream_id
            if last:
                conn.close_connection(last_stream_id=last)
                break
            if read >= MAX_HEAD_BYTES:
                return
            try:
                if (out := conn.data_to_send()):
                    await stream.send(out)
                data = await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                return
            read += len(data)
    out = conn.data_to_send()
    if not out:
        return   # nothing asked in time: closed
    try:
        await stream.send(out)
    except (anyio.BrokenResourceError, OSError):
        return
    await _linger(stream)


def _refuse_stream(conn: Machine, stream_id: int, fields: list[tuple[bytes, bytes]],
                   doors: Sequence[Door]) -> None:
    path = next((value for name, value in fields if name == b":path"), b"/")
    content_type, body = answer_body(path.decode("latin-1").split("?", 1)[0] or "/", doors)
    head = [(b":status", b"503"), (b"content-type", content_type),
            (b"content-length", str(len(body)).encode()), *STARTING.headers]
    try:
        if not answer_whole(conn, stream_id, head, body):
            conn.reset_stream(stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
    except h2.exceptions.ProtocolError:   # reset by its client meanwhile
        pass


async def _linger(stream: anyio.abc.ByteStream) -> None:
    """The answer written on a plain socket: its write side shut, and what the client
    still sends read and dropped until it closes, ``LINGER_S`` and ``LINGER_BYTES`` at
    most (over TLS the stream is closed at once, as before: a TLS close says the end)."""
    if not isinstance(stream, anyio.abc.SocketStream):
        return
    with anyio.move_on_after(LINGER_S):
        try:
            await stream.send_eof()
            dropped = 0
            while dropped < LINGER_BYTES:
                dropped += len(await stream.receive())
        except (anyio.EndOfStream, anyio.BrokenResourceError, OSError, ssl.SSLError):
            return


async def _accept(sock: socket.socket, doors: Sequence[Door],
                  tg: anyio.abc.TaskGroup, tls: ssl.SSLContext | None) -> None:
    limiter = anyio.CapacityLimiter(MAX_ANSWERING)
    while True:
        await anyio.wait_readable(sock)
        try:
            conn, _ = sock.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            continue
        except OSError as exc:   # out of descriptors: the backlog waits a moment
            log.warning("starting: cannot accept a connection: %s", exc)
            await anyio.sleep(0.1)
            continue
        tg.start_soon(_answer, conn, doors, limiter, tls)


async def answer_starting(sock: socket.socket, doors: Sequence[Door], *,
                          seconds: float, tls: ssl.SSLContext | None = None) -> None:
    """Answer ``sock``'s connections for ``seconds`` (or until cancelled), over ``tls``
    when given (``tls_context``)."""
    sock.setblocking(False)
    async with anyio.create_task_group() as tg:
        tg.cancel_scope.deadline = anyio.current_time() + seconds
        tg.start_soon(_accept, sock, doors, tg, tls)
