"""granian's own interface (RSGI) in front of the composed ASGI app.

    entry = RsgiEntry(app)      # app: the ASGI app, the front layer outermost
    # granian.server.embed.Server(entry, interface=Interfaces.RSGI, ...) calls
    # entry.__rsgi__(scope, protocol) once per request / WebSocket connection

Why: on granian's ASGI interface every request costs a hand-off into the loop plus a
future per ``receive`` and per ``send``; RSGI hands the request over once, the body
in one call, and the answer goes back in one call (``response_bytes``). The app is
still the ASGI app: this module is an RSGI→ASGI adapter, so the front layer (guard,
request log, metrics, the hot route's fast handler and its pre-encoded refusals) sees
every request exactly once, as it does on any ASGI server.

Contracts:

* HTTP scope: the ASGI 3 ``http`` scope (bytes header pairs, lower-case names, a
  ``host`` from HTTP/2's ``:authority`` when the request has none, as granian's ASGI
  side gives; over HTTP/2 an ``:authority`` beside a ``host`` that differs becomes a
  second ``host``: malformed, RFC 9113 §8.3.1, which the Host check answers 400;
  ``client``/``server`` tuples, ``raw_path`` re-encoded from granian's decoded path).
  granian drops header values that are not visible ASCII (``HeaderValue::to_str``);
  a ``Host`` so dropped becomes ``DROPPED_HOST``, which the Host check refuses (the
  check is never skipped for want of a host). ``http_version`` is ``1.0``, ``1.1``
  or ``2``.
* Request body: a declared ``Content-Length`` up to ``WHOLE_BODY_MAX`` is read in one
  call (hyper stops at the declared length); anything else is streamed chunk by chunk,
  so the app's body caps answer before more is read. A body that breaks off is
  ``http.disconnect``, never a complete ``http.request``: fewer bytes than a declared
  ``Content-Length``, or (without one, over HTTP/1.1) granian's marks of a body error.
  Over HTTP/2 without a ``Content-Length``, granian 2.8 gives no way to tell a reset
  stream from a clean end: a body broken off there reaches the app as complete.
  Request trailers over HTTP/1.1 look like a broken body (``http.disconnect``).
  After the body, ``receive`` waits for the client to go away (``http.disconnect``);
  once the response has finished it returns ``http.disconnect`` at once (a ``receive``
  already waiting then returns when the connection closes).
* Response: a start then one final body is one ``response_bytes``; a body with
  ``more_body`` opens ``response_stream`` and every later body is one ``send_bytes``.
  A write to a client that is gone raises ``OSError`` (as the door code expects).
  An app that returns without starting a response, or raises before any of its body
  went out (the start is held until the first body), answers 500. **An app that
  raises in the middle of a stream ends it cleanly**: granian 2.8's stream transport
  carries data only, so the body cannot be aborted (granian's ASGI side aborts it and
  the client sees an incomplete read).
* **No back-pressure on streams.** granian 2.8's RSGI stream transport queues every
  ``send_bytes`` in an unbounded channel and returns at once: a reader that stops
  reading is never felt by the writer, so the SSE slow-reader warning and eviction
  never trigger and the queue grows in the server's memory. ``test_rsgi`` shows it;
  this is why ``--granian-interface rsgi`` is not the default (``docs/benchmarks.md``).
* WebSocket: ``websocket.connect`` first, then granian's messages; ``websocket.accept``
  completes the handshake (RSGI can neither echo a subprotocol nor add headers, so a
  client that offers the bearer subprotocol fails its handshake), ``websocket.close``
  before the handshake refuses it (granian answers 403); no
  ``websocket.http.response`` extension. **After the handshake, close codes and
  reasons are lost** on granian 2.8's RSGI: the app's ``websocket.close`` code and
  reason never reach the client (it sees 1005, no status), and a client's close
  reaches the app as ``websocket.disconnect`` with code 1000 whatever it sent.
* No lifespan: the composition opens and drains the server (``acp_server.http.serving``).
"""

from __future__ import annotations

import re
from collections.abc import MutableMapping
from typing import Any
from urllib.parse import quote

from acp_server.http.front import ASGIApp, Message

WHOLE_BODY_MAX = 64 * 1024    # a declared body up to this is read in one call
_ASGI = {"version": "3.0", "spec_version": "2.3"}
_RAW_PATH_SAFE = "/:@!$&'()*+,;=-._~"
_PLAIN_PATH = re.compile(r"[A-Za-z0-9/:@!$&'()*+,;=._~-]*").fullmatch
_DISCONNECT: Message = {"type": "http.disconnect"}
DROPPED_HOST = b"[dropped"    # malformed on purpose: the Host check refuses it (421)


class ClientGone(OSError):
    """A write to a client that went away (granian's ``RSGIProtocolClosed``/``Error``)."""


def _address(value: str) -> tuple[str, int] | None:
    host, _, port = value.rpartition(":")
    if not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def _raw_path(path: str) -> bytes:
    if _PLAIN_PATH(path):
        return path.encode("ascii")
    return quote(path, safe=_RAW_PATH_SAFE).encode("ascii")


def asgi_scope(scope: Any, kind: str) -> MutableMapping[str, Any]:
    """The ASGI scope (``http`` or ``websocket``) of granian's RSGI scope."""
    path = scope.path
    fields = scope.headers
    headers = [(name.encode("latin-1"), value.encode("latin-1"))
               for name, value in fields.items()]
    version = scope.http_version
    if not any(name == b"host" for name, _ in headers):
        # HTTP/2's :authority, as granian's ASGI side does; a Host that granian dropped
        # (``contains_key`` sees it, ``items`` does not) as one no Host check accepts
        headers.insert(0, (b"host", DROPPED_HOST if "host" in fields
                           else (scope.authority or "").encode("latin-1")))
    elif version == "2" and scope.authority and scope.authority != fields.get("host"):
        # a ``host`` differing from ``:authority`` is malformed (RFC 9113 §8.3.1): both
        # go to the app as two Host fields, which the Host check answers 400
        headers.insert(0, (b"host", scope.authority.encode("latin-1")))
    out: MutableMapping[str, Any] = {
        "type": kind, "asgi": _ASGI, "http_version": "1.0" if version == "1" else version,
        "scheme": scope.scheme if kind == "http" else
        ("wss" if scope.scheme == "https" else "ws"),
        "path": path, "raw_path": _raw_path(path), "root_path": "",
        "query_string": scope.query_string.encode("latin-1"), "headers": headers,
        "client": _address(scope.client), "server": _address(scope.server),
    }
    if kind == "http":
        out["method"] = scope.method
    else:
        offered = scope.headers.get("sec-websocket-protocol")
        out["subprotocols"] = ([p.strip() for p in offered.split(",") if p.strip()]
                               if offered else [])
    return out


class HttpExchange:
    """One HTTP request: ``receive`` and ``send`` over granian's HTTP protocol object."""

    __slots__ = ("proto", "declared", "whole", "h1", "received", "body_done", "chunks",
                 "status", "headers", "stream", "started", "finished")

    def __init__(self, proto: Any, declared: str | None, http_version: str = "1.1") -> None:
        self.proto = proto
        self.declared = int(declared) if declared is not None and declared.isdigit() \
            else None
        self.whole = self.declared is not None and self.declared <= WHOLE_BODY_MAX
        self.h1 = http_version != "2"
        self.received = 0
        self.body_done = False
        self.chunks: Any = None
        self.status = 500
        self.headers: list[tuple[str, str]] = []
        self.stream: Any = None
        self.started = self.finished = False

    async def receive(self) -> Message:
        if self.body_done:
            if not self.finished:   # after the response: at once, as ASGI says
                await self.proto.client_disconnect()
            return _DISCONNECT
        try:
            if self.whole:   # hyper reads to the declared length, or raises
                self.body_done = True
                return {"type": "http.request", "body": await self.proto(),
                        "more_body": False}
            if self.chunks is None:
                self.chunks = self.proto.__aiter__()
            empties = 0
            chunk = await self._chunk()
            while chunk is not None and not chunk:   # an end, a body error, an empty frame
                empties += 1
                chunk = await self._chunk()
        except RuntimeError:   # RSGIProtocolError / Closed: the body broke off
            self.body_done = True
            return _DISCONNECT
        if chunk:
            self.received += len(chunk)
            return {"type": "http.request", "body": bytes(chunk), "more_body": True}
        self.body_done = True
        if not self._complete(empties):
            return _DISCONNECT
        return {"type": "http.request", "body": b"", "more_body": False}

    async def _chunk(self) -> Any:
        try:
            return await self.chunks.__anext__()
        except StopAsyncIteration:
            return None

    def _complete(self, empties: int) -> bool:
        """Whether the streamed body ended whole. granian 2.8 turns a body error into an
        empty chunk instead of raising, and ends a body with one more: over HTTP/1.1 a
        clean end is one empty chunk, a broken body two (so are request trailers, which
        are taken as broken). Over HTTP/2 a clean end often has two as well (the empty
        ``END_STREAM`` frame): there only a declared length can tell."""
        if self.declared is not None:
            return self.received >= self.declared
        return empties <= 1 or not self.h1

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.body":
            if self.finished:
                return
            body = message.get("body", b"")
            more = message.get("more_body", False)
            if self.stream is None:
                if not more:
                    self.finished = True
                    self.proto.response_bytes(self.status, self.headers, bytes(body))
                    return
                self.stream = self.proto.response_stream(self.status, self.headers)
            if body:
                try:
                    await self.stream.send_bytes(bytes(body))
                except RuntimeError as exc:
                    raise ClientGone("the client went away") from exc
            if not more:
                self.finished = True
                self.stream = None   # dropping the transport ends the body
        elif kind == "http.response.start":
            if self.started:
                raise RuntimeError("http.response.start sent twice")
            self.started = True
            self.status = message["status"]
            self.headers = [(bytes(name).decode("latin-1"), bytes(value).decode("latin-1"))
                            for name, value in message.get("headers", ())]

    def close(self, failed: bool = False) -> None:
        """After the app returned (``failed``: raised): answer 500 if no body went out
        (never started, or started and failed), else end what the app left open. A
        stream the app broke off ends cleanly: granian 2.8's RSGI cannot abort it."""
        if self.finished:
            return
        self.finished = True
        if self.stream is not None:
            self.stream = None   # dropping the transport ends the body
        elif failed or not self.started:
            self.proto.response_bytes(500, [("content-type", "text/plain; charset=utf-8"),
                                            ("content-length", "21")],
                                      b"Internal Server Error")
        else:
            self.proto.response_bytes(self.status, self.headers, b"")


class WebSocketExchange:
    """One WebSocket connection over granian's RSGI WebSocket protocol object."""

    __slots__ = ("proto", "transport", "connected", "closed")

    def __init__(self, proto: Any) -> None:
        self.proto = proto
        self.transport: Any = None
        self.connected = False
        self.closed = False

    async def receive(self) -> Message:
        if not self.connected:
            self.connected = True
            return {"type": "websocket.connect"}
        if self.transport is None or self.closed:
            return {"type": "websocket.disconnect", "code": 1006}
        try:
            message = await self.transport.receive()
        except RuntimeError:
            self.closed = True
            return {"type": "websocket.disconnect", "code": 1006}
        kind = int(message.kind)
        if kind == 1:
            return {"type": "websocket.receive", "bytes": bytes(message.data)}
        if kind == 2:
            return {"type": "websocket.receive", "text": message.data}
        self.closed = True
        return {"type": "websocket.disconnect", "code": 1000}

    async def send(self, message: Message) -> None:
        kind = message["type"]
        try:
            if kind == "websocket.send":
                if self.transport is None or self.closed:
                    raise ClientGone("the WebSocket is closed")
                text = message.get("text")
                if text is not None:
                    await self.transport.send_str(text)
                else:
                    await self.transport.send_bytes(bytes(message.get("bytes") or b""))
            elif kind == "websocket.accept":
                self.transport = await self.proto.accept()
            elif kind == "websocket.close":
                self.finish(int(message.get("code", 1000)))
            else:
                raise RuntimeError(f"unsupported WebSocket message on RSGI: {kind}")
        except RuntimeError as exc:
            if type(exc) is RuntimeError:
                raise
            self.closed = True
            raise ClientGone("the WebSocket went away") from exc

    def finish(self, code: int = 1000) -> None:
        """Close: before the handshake granian takes ``close``'s argument as the HTTP
        status of the refusal (403, as ASGI servers answer); after it granian 2.8
        closes without sending ``code`` (the client sees 1005)."""
        if not self.closed:
            self.closed = True
            self.proto.close(code if self.transport is not None else 403)


class RsgiEntry:
    """granian's RSGI target: every request and WebSocket to the ASGI ``app``."""

    __slots__ = ("app",)

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __rsgi__(self, scope: Any, proto: Any) -> None:
        if scope.proto == "http":
            exchange = HttpExchange(proto, scope.headers.get("content-length"),
                                    scope.http_version)
            try:
                await self.app(asgi_scope(scope, "http"), exchange.receive, exchange.send)
            except BaseException:
                exchange.close(failed=True)
                raise
            exchange.close()
            return
        if scope.proto == "ws":
            socket = WebSocketExchange(proto)
            try:
                await self.app(asgi_scope(scope, "websocket"), socket.receive, socket.send)
            finally:
                socket.finish()

    __call__ = __rsgi__


__all__ = ["DROPPED_HOST", "WHOLE_BODY_MAX", "ClientGone", "HttpExchange", "RsgiEntry",
           "WebSocketExchange", "asgi_scope"]
