"""One HTTP request relayed to another instance, its response streamed back.

    forwarder = Forwarder(instance="a1b2c3d4e5f6", max_body_bytes=1 << 20)
    await forwarder.relay("http://10.0.0.2:4170", scope, receive, send)   # an ASGI exchange
    await forwarder.aclose()

Contracts:

* The request goes out as it came (method, path, query, headers: the caller's
  ``Authorization`` included, so the owner authenticates and authorizes it as it
  would a direct request), minus the hop-by-hop headers and ``Host``, plus
  ``FORWARDED_HEADER`` naming this instance. That header grants nothing: it only
  tells the receiver never to forward or adopt again (no loops). With the fleet's
  shared secret (``secret``) the caller's address goes too, with its proof
  (``acp_server.http.clients``): the owner's audit log names the caller, not this
  instance. A client's own copies of these headers are dropped.
* The body is read first, at most ``max_body_bytes + 1`` bytes (the owner answers a
  larger one with its own 413); a client that goes away before sending all of it has
  nothing forwarded (the owner never acts on half a request); the response (an SSE
  stream too) is relayed chunk by chunk as it arrives, unbuffered, undecoded. A client
  that goes away ends the relay and the upstream request.
* An owner that cannot be reached, or does not answer with its headers within
  ``HEADERS_TIMEOUT_S`` (30 s; a paused process's kernel still accepts), or whose
  registry heartbeat stopped meanwhile (``alive``, checked every ``check_s``: a paused
  owner is given up within its lease TTL, a slow one that still renews is waited
  for), is given up: ``OwnerUnreachableError`` when the request was not wholly sent
  (it was not connected, or the write failed: the owner cannot act on half a
  request), so sending it again is safe; ``OwnerLostError`` when the owner had it all
  (its last byte written, seen by httpcore's trace) and gave no answer (it died, or
  it is paused and may act on it when it wakes): whether it acted is unknown, and a
  client that sends it again may do it twice (``fleet.routing`` answers the two
  apart). A relay cut after the headers ends the response.
* TLS to the owner (``ssl_context``: ``fleet.tls.peer_context``, the CA the other
  instances' certificates chain to and this instance's client certificate; else
  httpx's default, the public CAs) that fails (its certificate not trusted or not
  naming its host; it refused this one's) is ``OwnerTlsError``, an
  ``OwnerUnreachableError`` whose message says so: never ``OwnerLostError``, since an
  owner that refused the handshake never read the request, even when its alert came
  after the request was written (TLS 1.3).
* An owner that answers 404 while ``moved()`` says the session has moved since it
  was looked up (the request reached the old owner in the instant of a hand-off or
  an adoption, and a forwarded request is never forwarded again there) is not
  relayed: ``OwnerMovedError`` carries the body read, for the caller to route the
  request once more.
"""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import httpx

from acp_server.fleet.tls import tls_failure
from acp_server.http.clients import (
    FORWARDED_BY_HEADER,
    FORWARDED_FOR_HEADER,
    FORWARDED_PROOF_HEADER,
    proof,
)

FORWARDED_HEADER = FORWARDED_BY_HEADER
HOP_BY_HOP = frozenset({b"host", b"connection", b"keep-alive", b"transfer-encoding", b"te",
                        b"upgrade", b"proxy-connection", b"trailer", b"content-length",
                        FORWARDED_HEADER, FORWARDED_FOR_HEADER, FORWARDED_PROOF_HEADER})
CONNECT_TIMEOUT_S = 3.0
# All 256 connections to the owners busy: a forward waits this long for one, then is a
# 503 owner_unreachable (retry), not a wait of HEADERS_TIMEOUT_S.
POOL_TIMEOUT_S = 5.0
# An owner that accepted the connection but does not answer (paused, say: its kernel
# still accepts) is given up after this long; a stream's body has no such bound.
HEADERS_TIMEOUT_S = 30.0
# An idle connection to an owner is dropped before the owner's server would close it
# (uvicorn: 5 s), so a request is not written in the instant the owner closes it (it
# would be reported ``OwnerLostError``, though never read).
KEEPALIVE_S = 2.0


class OwnerUnreachableError(Exception):
    """The owner's advertised address did not answer; the request did not reach it
    whole (see the module docstring)."""


class OwnerTlsError(OwnerUnreachableError):
    """TLS with the owner failed (see the module docstring): the message says why."""


class OwnerLostError(OwnerUnreachableError):
    """The owner took the whole request and gave no answer: it may have acted on it."""


class OwnerMovedError(Exception):
    """The owner no longer runs the session (see the module docstring); nothing was
    sent to the client. ``body``: the request's body, read."""

    def __init__(self, body: bytes) -> None:
        super().__init__("the session moved while the request was forwarded")
        self.body = body


class Forwarder:
    """See the module docstring."""

    def __init__(self, *, instance: str, max_body_bytes: int,
                 headers_timeout_s: float = HEADERS_TIMEOUT_S, check_s: float = 1.0,
                 secret: Callable[[], bytes | None] | None = None,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.instance = instance
        self.ssl_context = ssl_context
        self.secret = secret
        self.check_s = check_s
        self.max_body_bytes = max_body_bytes
        self.headers_timeout_s = headers_timeout_s
        self._client: httpx.AsyncClient | None = None

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT_S, pool=POOL_TIMEOUT_S),
                limits=httpx.Limits(max_connections=256, max_keepalive_connections=32,
                                    keepalive_expiry=KEEPALIVE_S),
                follow_redirects=False, trust_env=False,
                verify=self.ssl_context if self.ssl_context is not None else True)
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    async def relay(self, base_url: str, scope: Any, receive: Any, send: Any,
                    alive: Callable[[], Awaitable[bool]] | None = None,
                    moved: Callable[[], Awaitable[bool]] | None = None) -> None:
        """``alive``: asked every ``check_s`` while the owner has not answered its
        headers; ``False`` (its heartbeat stopped: paused, say) gives up at once.
        ``moved``: asked when the owner answers 404 (``OwnerMovedError``)."""
        body = await _read_body(receive, self.max_body_bytes + 1)
        if body is None:
            return   # the client went away mid-body: nothing to forward, nobody to answer
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in HOP_BY_HOP]
        by = self.instance.encode()
        headers.append((FORWARDED_HEADER, by))
        path = scope.get("raw_path") or scope["path"].encode()
        secret = self.secret() if self.secret is not None else None
        client = scope.get("client")
        if secret and client:   # the caller's address, proved (acp_server.http.clients)
            address = str(client[0]).encode("latin-1")
            headers.append((FORWARDED_FOR_HEADER, address))
            headers.append((FORWARDED_PROOF_HEADER,
                            proof(secret, by, address, scope["method"].encode(), path)))
        target = base_url + path.decode("latin-1")
        if scope.get("query_string"):
            target += "?" + scope["query_string"].decode("latin-1")
        request = self.client.build_request(scope["method"], target, headers=headers,
                                            content=body)
        unreachable: list[OwnerUnreachableError] = []
        went = False   # (unset when the client went away first: the relay just ends)
        async with anyio.create_task_group() as tg:
            # A server may drop sends to a client that went away (uvicorn does): the
            # client's disconnect is watched apart and ends the relay and the upstream
            # request, or an event stream would be relayed to nobody for ever.
            tg.start_soon(_cancel_on_disconnect, receive, tg.cancel_scope)
            went = await self._exchange(request, send, unreachable, alive, moved)
            tg.cancel_scope.cancel()
        if unreachable:
            raise unreachable[0]
        if went:
            raise OwnerMovedError(body)

    async def _exchange(self, request: httpx.Request, send: Any,
                        unreachable: list[OwnerUnreachableError],
                        alive: Callable[[], Awaitable[bool]] | None,
                        moved: Callable[[], Awaitable[bool]] | None = None) -> bool:
        """Relay the owner's answer; ``True`` instead when it is a 404 and ``moved()``."""
        answered: list[httpx.Response] = []
        failed: list[BaseException] = []
        delivered: list[str] = []   # the request's last byte written, last attempt

        async def trace(event: str, info: dict[str, Any]) -> None:
            if event.endswith("send_request_headers.started"):
                delivered.clear()   # an attempt again (HTTP/2's GOAWAY: never processed)
            elif event.endswith("send_request_body.complete"):
                delivered.append(event)

        request.extensions["trace"] = trace
        with anyio.move_on_after(self.headers_timeout_s):
            async with anyio.create_task_group() as tg:
                if alive is not None:
                    tg.start_soon(self._watch, alive, tg.cancel_scope)
                try:
                    answered.append(await self.client.send(request, stream=True))
                except httpx.HTTPError as exc:
                    failed.append(exc)
                tg.cancel_scope.cancel()
        if not answered:
            tls = tls_failure(failed[0]) if failed else None
            reason = (str(failed[0]) or type(failed[0]).__name__ if failed
                      else "no answer in time (or its heartbeat stopped)")
            unreachable.append(OwnerTlsError(f"TLS: {tls}") if tls is not None
                               else OwnerLostError(f"sent, no answer: {reason}") if delivered
                               else OwnerUnreachableError(reason))
            return False
        response = answered[0]
        try:
            if response.status_code == 404 and moved is not None and await _says(moved):
                return True   # nothing was sent: the caller routes the request again
            await send({"type": "http.response.start", "status": response.status_code,
                        "headers": [(k, v) for k, v in response.headers.raw
                                    if k.lower() not in HOP_BY_HOP or k.lower() ==
                                    b"content-length"]})
            try:
                async for chunk in response.aiter_raw():
                    await send({"type": "http.response.body", "body": chunk,
                                "more_body": True})
            except httpx.HTTPError:
                pass   # the owner went away mid-response: end it here
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            with anyio.CancelScope(shield=True):
                await response.aclose()
        return False

    async def _watch(self, alive: Callable[[], Awaitable[bool]],
                     scope: anyio.CancelScope) -> None:
        while True:
            await anyio.sleep(self.check_s)
            try:
                if not await alive():
                    scope.cancel()
                    return
            except Exception:   # noqa: BLE001 - the store cannot say: wait on
                continue


def replayed(body: bytes, receive: Any) -> Any:
    """``receive`` whose request body (already read) is ``body``: the same request
    routed once more (``OwnerMovedError``); then the client's own messages."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> Any:
        return pending.pop() if pending else await receive()

    return replay


async def _says(question: Callable[[], Awaitable[bool]]) -> bool:
    """``question()``, ``False`` when it cannot be answered (the store: relay as is)."""
    try:
        return await question()
    except Exception:   # noqa: BLE001
        return False


async def _cancel_on_disconnect(receive: Any, scope: anyio.CancelScope) -> None:
    """Cancel ``scope`` once the client disconnects (after the body was read, only
    ``http.disconnect`` can come)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


async def _read_body(receive: Any, limit: int) -> bytes | None:
    """The request's body, at most ``limit`` bytes; ``None`` when the client went away
    before sending all of it (an aborted request is not forwarded)."""
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk = message.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)[:limit]
