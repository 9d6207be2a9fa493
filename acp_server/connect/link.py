"""The server's side of the adapter: one ``/acp`` connection, over WebSocket or over
Streamable HTTP (HTTP/2 where the server speaks it, else HTTP/1.1).

    async with open_link(target, initialize_payload) as (link, answer):
        await link.send(payload, session_id=sid)     # LinkLost when the connection is gone
        payload = await link.receive()               # the server's messages, in stream order
        await link.watch_session(sid)                # HTTP: open the session's stream first

Contracts:

* ``open_link`` connects and sends ``initialize``; it yields the link and the raw
  ``initialize`` answer. ``transport="auto"`` tries the WebSocket first and falls back
  to Streamable HTTP when the upgrade is refused; a connection that cannot be made
  at all is not retried over HTTP. It raises ``StartupError`` with a message that
  names the cause: unreachable, refused credentials (401/403), or not an ACP
  endpoint (an answer that is not JSON-RPC).
* After that, any failure of the connection raises ``LinkLost`` from ``send`` or
  ``receive``. HTTP: the connection stream ending, a stream failing, or a POST
  answered 404/410/401/403 is a lost link; a POST answered 413 raises
  ``MessageTooLarge`` (that message only; over WebSocket the server closes with
  ``TOO_BIG``, ``LinkLost.code``); a POST answered 4xx with a JSON-RPC error
  body hands that body to ``receive`` (as the server's answer), a 403 ``forbidden``
  (the token lacks a scope for that message) included, logged once; a 503 is retried
  after its ``Retry-After`` (at most ``POST_RETRIES`` times; the wait is the
  sender's ``wait`` when it passes one, and holds no lock: another task's message
  may go meanwhile, a cancel), and so is a session's
  ``GET`` stream answered 429, 502, 503 or 504 (``FOR_NOW``), before the message
  whose reply it carries goes, waited by the same ``wait`` (past the retries the link
  is lost: left unopened, that reply never came).
* Every message of the server is bounded by ``max_bytes`` as it arrives: a WebSocket
  message (its fragments counted; past it the socket is closed, ``INCOMING_TOO_BIG``),
  an SSE line and event, a POST answer; past it the link is lost.
* WebSocket keep-alive: a ping every ``Target.ping_s`` (15 s); the link is lost when
  a pong has not come within ``ping_s`` of the consumer waiting in ``receive`` (so a
  dead peer is found within 30 s), never for time the consumer spent elsewhere (an
  editor that does not read its stdout holds the frames, and the pong, unread).
* ``close`` ends the connection on the server (WebSocket close code 1000, HTTP
  ``DELETE``); leaving a WebSocket any other way closes it with ``RECONNECTING``, so
  a resumable connection's sessions and turns wait for the next link.
* The token goes in ``Authorization`` only; nothing here logs headers.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import anyio
import anyio.abc
import httpx
import wsproto.events
from httpx_ws import (
    HTTPXWSException,
    WebSocketDisconnect,
    WebSocketInvalidTypeReceived,
    WebSocketUpgradeError,
    aconnect_ws,
)

from acp_server.connect import wire
from acp_server.connect.http_reads import FOR_NOW, post_capped, retry_after, sse_data

log = logging.getLogger("acp_server.connect")

CONNECT_TIMEOUT_S = 10.0
INITIALIZE_TIMEOUT_S = 60.0     # the server starts its agent on the first initialize
STREAM_READ_TIMEOUT_S = 45.0    # three SSE heartbeats (15 s each)
PING_INTERVAL_S = 15.0          # WebSocket keep-alive: a dead peer is found within 35 s
POST_RETRIES = 5
INCOMING = 256


class LinkLost(Exception):
    """The connection to the server is gone (the message says why; ``code``: the
    WebSocket close code when the server closed it)."""

    def __init__(self, message: str, *, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class MessageTooLarge(Exception):
    """The server refused one message for its size (HTTP 413); the link goes on."""


TOO_BIG = 1009   # the WebSocket close code of a message over the server's cap
INCOMING_TOO_BIG = 4009   # ours: a message of the server's over ``Target.max_bytes``
DELIBERATE_CLOSE = 1000   # the editor is done: the server ends the connection (like DELETE)
RECONNECTING = 4000       # any other way out of a WebSocket: the server keeps what it has


class StartupError(Exception):
    """``initialize`` could not reach an ACP server (the message names the cause;
    ``kind``: ``server_unreachable``, ``unauthorized``, ``not_acp``,
    ``initialize_refused``)."""

    def __init__(self, message: str, *, kind: str = "server_unreachable") -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Target:
    url: str                      # http(s)://host:port/acp
    token: str | None = field(default=None, repr=False)
    transport: str = "auto"       # auto | websocket | http | http1 (HTTP/1.1 only)
    max_bytes: int = 32 << 20
    ping_s: float = PING_INTERVAL_S   # WebSocket keep-alive interval (and pong timeout)

    @property
    def shown(self) -> str:
        """The URL without credentials or query, for messages."""
        parts = urlsplit(self.url)
        host = parts.hostname or ""
        netloc = f"[{host}]" if ":" in host else host
        if parts.port:
            netloc += f":{parts.port}"
        return urlunsplit((parts.scheme, netloc, parts.path, "", ""))

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}


# The wait before a message answered 503 goes again (``Retry-After`` s; may raise).
Wait = Callable[[float], Awaitable[None]]


class Link(Protocol):
    transport: str

    async def send(self, payload: bytes, *, session_id: str | None = None,
                   wait: Wait | None = None) -> None: ...

    async def receive(self) -> bytes: ...

    async def watch_session(self, session_id: str) -> None: ...

    async def close(self) -> None: ...


def _timeout() -> httpx.Timeout:
    return httpx.Timeout(INITIALIZE_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)


# -- WebSocket -----------------------------------------------------------------------------
class WebSocketLink:
    transport = "websocket"

    def __init__(self, ws: Any) -> None:
        self._ws = ws
        self.closed = False   # by ``close``: the editor is done (close code 1000)
        self._receiving_since: float | None = None   # waiting in ``receive`` since
        self._receive_scope: anyio.CancelScope | None = None
        self._dead: str | None = None   # the keep-alive found the peer gone
        self.pings = 0     # sent by the keep-alive
        self.excused = 0   # its checks of a late pong while the consumer was elsewhere

    async def keep_alive(self, interval_s: float) -> None:
        """Ping every ``interval_s``; the peer is gone when a pong has not come within
        ``interval_s`` of the consumer waiting in ``receive``, at two looks a quarter
        interval apart (the process may not have run its reader for a while on a busy
        machine: the second look sees what it read meanwhile). Time the consumer spends
        elsewhere (writing to an editor that does not read) does not count: frames wait
        unread then, the pong behind them, and the link is not dead for that."""
        while not self.closed:
            await anyio.sleep(interval_s)
            try:
                pong = await self._ws.ping()
            except Exception:   # closing: the reader says why
                return
            self.pings += 1
            sent = anyio.current_time()
            late = False   # past the deadline at the last look
            while not pong.is_set():
                with anyio.move_on_after(interval_s / 4):
                    await pong.wait()
                since = self._receiving_since
                if pong.is_set():
                    continue
                if since is None:
                    self.excused += 1
                    late = False
                    continue
                if anyio.current_time() - max(since, sent) < interval_s:
                    late = False
                    continue
                if not late:   # one more look: a busy machine may not have run the
                    late = True   # reader yet (what it would read arrived meanwhile)
                    continue
                self._dead = (f"no answer to a keep-alive ping within {interval_s:g} s "
                              "(the server or the network is gone)")
                if self._receive_scope is not None:
                    self._receive_scope.cancel()
                return

    async def send(self, payload: bytes, *, session_id: str | None = None,
                   wait: Wait | None = None) -> None:
        try:
            await self._ws.send_text(payload.decode())
        except Exception as exc:   # wsproto's state errors included: the socket is done
            # the type only: wsproto's errors show the event, the message (prompt) in it
            raise LinkLost(f"WebSocket send failed: {type(exc).__name__}",
                           code=await self._close_code()) from None

    async def _close_code(self) -> int | None:
        """The server's close code, when its close frame is among what is left to read
        (a send can fail before the reader has seen why)."""
        with anyio.move_on_after(1):
            while True:
                try:
                    await self._ws.receive()
                except WebSocketDisconnect as exc:
                    return int(exc.code)
                except Exception:
                    return None
        return None

    async def receive(self) -> bytes:
        while True:
            if self._dead is not None:
                raise LinkLost(self._dead)
            try:
                with anyio.CancelScope() as self._receive_scope:
                    self._receiving_since = anyio.current_time()
                    try:
                        return (await self._ws.receive_text()).encode()
                    finally:
                        self._receiving_since = self._receive_scope = None
                continue   # cancelled by the keep-alive: dead (above)
            except WebSocketInvalidTypeReceived:
                continue   # binary frames are ignored, as the server ignores them
            except WebSocketDisconnect as exc:
                if exc.code == INCOMING_TOO_BIG:
                    raise LinkLost(f"the server sent {exc.reason} (--max-line-bytes): "
                                   "dropped", code=exc.code) from None
                raise LinkLost(f"the server closed the WebSocket ({exc.code})",
                               code=exc.code) from None
            except Exception as exc:
                raise LinkLost(f"WebSocket failed: {_reason(exc)}") from None

    async def watch_session(self, session_id: str) -> None:
        return None   # one socket carries every stream

    async def close(self) -> None:
        self.closed = True
        with contextlib.suppress(Exception):
            await self._ws.close(DELIBERATE_CLOSE)

    async def drop(self) -> None:
        """Leave without ending the connection on the server: a close code other than
        1000, so its sessions and turns wait for the reconnect."""
        if not self.closed:
            with contextlib.suppress(Exception), anyio.CancelScope(shield=True), \
                    anyio.move_on_after(2):
                await self._ws.close(RECONNECTING, "reconnecting")


class _CappedConnection:
    """wsproto's connection as httpx-ws drives it, with every incoming message bounded:
    httpx-ws joins the pieces of a fragmented message without limit, so past
    ``max_bytes`` of one message this ends the socket (a close event with
    ``INCOMING_TOO_BIG``) and reads nothing more. Everything else is wsproto's."""

    def __init__(self, inner: Any, max_bytes: int) -> None:
        self._inner = inner
        self._max_bytes = max_bytes
        self._size = 0
        self._over = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def receive_data(self, data: bytes | None) -> None:
        if not self._over:
            self._inner.receive_data(data)

    def events(self) -> Any:
        for event in self._inner.events():
            if isinstance(event, wsproto.events.Message):
                self._size += len(event.data)
                if self._size > self._max_bytes:
                    self._over = True
                    yield wsproto.events.CloseConnection(
                        INCOMING_TOO_BIG, f"a message over {self._max_bytes} bytes")
                    return
                if event.message_finished:
                    self._size = 0
            yield event


@contextlib.asynccontextmanager
async def _websocket(target: Target, init: bytes) -> AsyncIterator[tuple[Link, bytes]]:
    parts = urlsplit(target.url)
    ws_url = urlunsplit(("wss" if parts.scheme == "https" else "ws", *parts[1:]))
    async with httpx.AsyncClient(headers=target.headers(), timeout=_timeout()) as client:
        async with aconnect_ws(ws_url, client, max_message_size_bytes=target.max_bytes,
                               keepalive_ping_interval_seconds=None) as ws, \
                anyio.create_task_group() as keeping:
            ws.connection = _CappedConnection(ws.connection, target.max_bytes)
            link = WebSocketLink(ws)
            keeping.start_soon(link.keep_alive, target.ping_s)
            try:
                await link.send(init)
                with anyio.fail_after(INITIALIZE_TIMEOUT_S):
                    answer = await link.receive()
                yield link, answer
            finally:
                keeping.cancel_scope.cancel()
                await link.drop()


# -- Streamable HTTP -------------------------------------------------------------------------
_NO_H2C: set[str] = set()   # URLs whose server refused cleartext HTTP/2 (this process)

class HttpLink:
    def __init__(self, client: httpx.AsyncClient, target: Target, connection_id: str,
                 tg: anyio.abc.TaskGroup, http_version: str) -> None:
        self._client = client
        self._target = target
        self._tg = tg
        self.connection_id = connection_id
        self.transport = f"streamable-http ({http_version})"
        self._send, self._receive = anyio.create_memory_object_stream[bytes | LinkLost](INCOMING)
        self._watched: set[str] = set()
        self._post_lock = anyio.Lock()

    def _headers(self, session_id: str | None = None) -> dict[str, str]:
        headers = {"Acp-Connection-Id": self.connection_id}
        if session_id is not None:
            headers["Acp-Session-Id"] = session_id
        return headers

    async def open_connection_stream(self) -> None:
        await self._tg.start(self._stream, None)

    async def watch_session(self, session_id: str, wait: Wait | None = None) -> None:
        """Open the session's stream unless it is open; one answered 429/502/503/504 is
        asked again after its ``Retry-After``, waited by ``wait`` (a sender's, as for a
        POST answered 503: the cancels behind its message go meanwhile) or a sleep."""
        for attempt in range(POST_RETRIES + 1):
            if session_id in self._watched:
                return
            self._watched.add(session_id)
            retry = await self._tg.start(self._stream, session_id, attempt < POST_RETRIES)
            if retry is None:
                return
            await (wait or anyio.sleep)(retry)   # the rate limit, a store outage

    async def _stream(self, session_id: str | None, may_retry: bool = False, *,
                      task_status: anyio.abc.TaskStatus[float | None]
                      = anyio.TASK_STATUS_IGNORED) -> None:
        """One ``GET`` stream; ``task_status`` gets ``None`` once it is open or lost,
        or (``may_retry``) the seconds to wait before a session's stream refused for
        now is asked again."""
        headers = {**self._headers(session_id), "Accept": "text/event-stream"}
        timeout = httpx.Timeout(STREAM_READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
        lost: LinkLost | None = None
        started = False
        try:
            async with self._client.stream("GET", self._target.url, headers=headers,
                                           timeout=timeout) as response:
                status = response.status_code
                if status in FOR_NOW and session_id is not None and may_retry:
                    self._watched.discard(session_id)
                    session_id = None   # the next attempt owns the session's entry
                    started = True
                    task_status.started(retry_after(response))
                    return
                task_status.started(None)
                started = True
                if status != 200:
                    if session_id is None or status in (401, 403, 404, *FOR_NOW):
                        lost = LinkLost(f"GET stream answered HTTP {status}")
                    return
                async for data in sse_data(response, self._target.max_bytes):
                    await self._send.send(data)
            if session_id is None:
                lost = LinkLost("the server ended the connection stream")
        except (httpx.HTTPError, OSError, anyio.BrokenResourceError) as exc:
            lost = LinkLost(f"stream failed: {_reason(exc)}")
        finally:
            if not started:
                task_status.started(None)
            if session_id is not None:
                self._watched.discard(session_id)
            if lost is not None:
                with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                    self._send.send_nowait(lost)

    async def send(self, payload: bytes, *, session_id: str | None = None,
                   wait: Wait | None = None) -> None:
        if session_id is not None:
            await self.watch_session(session_id, wait)
        for attempt in range(POST_RETRIES + 1):
            async with self._post_lock:   # one POST at a time, not the waits between
                try:
                    response = await post_capped(
                        self._client, self._target, payload,
                        {**self._headers(session_id), "Content-Type": "application/json"})
                except (httpx.HTTPError, OSError) as exc:
                    raise LinkLost(f"POST failed: {_reason(exc)}") from None
            if response.status_code != 503 or attempt == POST_RETRIES:
                break
            await (wait or anyio.sleep)(retry_after(response))
        status = response.status_code
        if status in (200, 202):
            return
        if status == 413:
            raise MessageTooLarge(f"{self._target.shown} refused a message of "
                                  f"{len(payload)} bytes as too large (HTTP 413)")
        body = response.content
        if status == 403 and wire.body_error_kind(body) == "forbidden":
            # the credential lacks a scope for this one message: the editor is told,
            # the connection stays (reconnecting would not give the scope)
            log.warning("%s refused a message (HTTP 403): %s", self._target.shown,
                        wire.body_error_message(body))
            await self._send.send(body)
            return
        if status in (401, 403, 404, 410):
            raise LinkLost(f"POST answered HTTP {status}")
        if wire.is_jsonrpc(body):   # the server's own error answer to this message
            await self._send.send(body)
            return
        raise LinkLost(f"POST answered HTTP {status}")

    async def receive(self) -> bytes:
        try:
            item = await self._receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise LinkLost("the link was closed") from None
        if isinstance(item, LinkLost):
            raise item
        return item

    async def close(self) -> None:
        with contextlib.suppress(Exception), anyio.move_on_after(2):
            await self._client.request("DELETE", self._target.url, headers=self._headers())


async def _http_initialize(client: httpx.AsyncClient, target: Target,
                           init: bytes) -> httpx.Response:
    return await post_capped(client, target, init, {"Content-Type": "application/json",
                                              "Accept": "application/json"})


@contextlib.asynccontextmanager
async def _http(target: Target, init: bytes) -> AsyncIterator[tuple[Link, bytes]]:
    plain_h1 = target.transport == "http1" or target.url in _NO_H2C
    versions = ["HTTP/1.1"] if plain_h1 else ["HTTP/2", "HTTP/1.1"]
    for version in versions:
        h2 = version == "HTTP/2"
        # cleartext HTTP/2 is tried with prior knowledge; over TLS ALPN decides
        client = httpx.AsyncClient(headers=target.headers(), timeout=_timeout(), http2=h2,
                                   http1=not h2 or target.url.startswith("https:"))
        try:
            response = await _http_initialize(client, target, init)
        except httpx.ConnectError:
            await client.aclose()
            raise
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
            await client.aclose()
            if h2:
                log.debug("no cleartext HTTP/2 at %s (%s): HTTP/1.1", target.shown, exc)
                continue
            raise
        if not h2 and not plain_h1:   # HTTP/1.1 worked where HTTP/2 did not: not tried
            _NO_H2C.add(target.url)   # again (the server logs each try)
        break
    try:
        _check_answer(target, response)
        connection_id = response.headers["acp-connection-id"]
        async with anyio.create_task_group() as tg:
            link = HttpLink(client, target, connection_id, tg, response.http_version)
            try:
                await link.open_connection_stream()
                yield link, response.content
            finally:
                tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await client.aclose()


def _check_answer(target: Target, response: httpx.Response) -> None:
    status = response.status_code
    if status == 401:
        raise StartupError(f"{target.shown} refused the credentials (HTTP 401): check --token "
                           "/ $ACP_SERVER_TOKEN (missing, wrong, revoked or expired)",
                           kind="unauthorized")
    if status == 403:
        raise StartupError(f"{target.shown} refused this client (HTTP 403): "
                           f"{wire.body_error_message(response.content)}", kind="unauthorized")
    if status in (502, 503, 504) and not wire.is_jsonrpc(response.content):
        raise StartupError(f"{target.shown} is unavailable for now (HTTP {status}, "
                           "a proxy with no server behind it, or one starting): try again")
    if not wire.is_jsonrpc(response.content):
        kind = response.headers.get("content-type", "no content type")
        raise StartupError(f"{target.shown} is not an ACP endpoint (HTTP {status}, {kind})",
                           kind="not_acp")
    if status != 200 or "acp-connection-id" not in response.headers:
        error = json.loads(response.content).get("error") or {}
        raise StartupError(f"{target.shown} refused initialize (HTTP {status}): "
                           f"{error.get('message', 'no connection id')}",
                           kind="initialize_refused")


# -- choosing ------------------------------------------------------------------------------
@contextlib.asynccontextmanager
async def open_link(target: Target, init: bytes) -> AsyncIterator[tuple[Link, bytes]]:
    """Connect (see the module contracts) and yield ``(link, initialize answer)``."""
    opened: contextlib.AbstractAsyncContextManager[tuple[Link, bytes]] | None = None
    try:
        if target.transport in ("auto", "websocket"):
            try:
                opened = _websocket(target, init)
                pair = await opened.__aenter__()
            except WebSocketUpgradeError as exc:
                opened = None
                if target.transport == "websocket":
                    status = exc.response.status_code
                    if status == 401:
                        _check_answer(target, exc.response)
                    raise StartupError(f"{target.shown} refused the WebSocket upgrade "
                                       f"(HTTP {status}): a wrong token, or not an ACP "
                                       "endpoint", kind="not_acp") from None
        if opened is None:
            opened = _http(target, init)
            pair = await opened.__aenter__()
    except (httpx.ConnectError, httpx.ConnectTimeout, OSError) as exc:
        raise StartupError(f"{target.shown} is unreachable: {_reason(exc)}") from None
    except (httpx.HTTPError, HTTPXWSException, LinkLost, TimeoutError) as exc:
        raise StartupError(f"{target.shown} failed during initialize: {_reason(exc)}",
                           kind="initialize_refused") from None
    try:
        yield pair
    except BaseException as exc:
        if not await opened.__aexit__(type(exc), exc, exc.__traceback__):
            raise
    else:
        await opened.__aexit__(None, None, None)


def _reason(exc: BaseException) -> str:
    """A few words: what refused under httpx's "All connection attempts failed"."""
    todo, seen = [exc], 0
    while todo and seen < 50:
        cause, seen = todo.pop(0), seen + 1
        if isinstance(cause, (ConnectionRefusedError, socket.gaierror)):
            return "connection refused" if isinstance(cause, ConnectionRefusedError) \
                else "name not resolved"
        todo += [*getattr(cause, "exceptions", ()), *(c for c in (cause.__cause__,
                 cause.__context__) if c is not None)]
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:200]
