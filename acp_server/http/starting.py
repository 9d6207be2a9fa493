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
* HTTP/1.x, one request a connection. The handshake and the head take at most
  ``HEAD_TIMEOUT_S`` together, the head at most ``MAX_HEAD_BYTES`` (then the connection is closed without an
  answer); at most ``MAX_ANSWERING`` connections are answered at once, others are
  closed as accepted. Nothing of a request is kept.
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
from anyio.streams.tls import TLSStream

from acp_server.http.front import Door
from acp_server.http.options import HttpOptions
from acp_server.http.policy import Refusal

log = logging.getLogger("acp_server")
HEAD_TIMEOUT_S = 5.0
MAX_HEAD_BYTES = 16 * 1024
MAX_ANSWERING = 64
STARTING = Refusal(503, "store_unavailable",
                   "The server is starting and its store is unavailable; retry later.",
                   headers=((b"retry-after", b"5"),))
_HEALTH = b'{"status":"starting"}'


def answer_bytes(path: str, doors: Sequence[Door]) -> bytes:
    """The whole HTTP/1.1 response to a request for ``path``."""
    if path == "/health":
        content_type, body = b"application/json", _HEALTH
    else:
        door = next((d for d in doors if d.matches(path)), doors[-1])
        content_type, body = door.render(STARTING)
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
            path = request_path(head) if b"\r\n\r\n" in head else None
            if path is None:
                return
            try:
                await stream.send(answer_bytes(path, doors))
            except (anyio.BrokenResourceError, OSError, ssl.SSLError):
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
