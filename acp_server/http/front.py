"""The one ASGI layer outside every door: the guard, CORS, the request cap, and the
hooks of the request log and the request metrics.

    front = FrontLayer(app, policy, doors=[Door("/lmsp/", "lmsp", lmsp_render),
                                           Door("/acp", "acp", acp_render),
                                           Door("", "rest", rest_render)],
                       observer=access_recorder, max_in_flight=None)

Why one layer: a request used to cross three (the request log, the security
middleware, Starlette's error middleware) before the router; each cost an ``await``
frame and a wrapped ``send`` on the 503 path. Here one ``__call__`` checks the request
(``GuardPolicy.inspect``), answers a refusal from bytes encoded once per (refusal,
door), wraps ``send`` once to see the status and count SSE events, and reports the
exchange to the observer when it ends.

Contracts:

* **http** scopes: a refusal of the policy is answered in the door's shape (the first
  ``Door`` whose prefix matches the path; ``"/x/"`` and ``"/x"`` match ``/x`` and
  ``/x/…``; ``""`` matches all), with its CORS headers when the Origin is allowed,
  before the body is read and without entering the app. An allowed preflight
  (``OPTIONS`` with ``Access-Control-Request-Method``) is answered 204. Every other
  answer from the app gets the CORS headers of an allowed Origin.
* **One path** for the access decision, the door and the router (``canonical_path``):
  a path with one trailing slash is the path without it (``scope["path"]`` is rewritten
  before anything reads it: ``/x/`` is exactly ``/x``, its route, access and rate
  class; ``%2F`` is a ``/`` once decoded, so the same); a path with an empty segment
  (``//tokens``, ``/session//x``, ``/x//``) or a dot segment (``/./``, ``/../``) is
  answered ``404`` in the door's shape, as an unknown path (``NOT_FOUND``), once the
  policy has passed the request (an unauthenticated one still gets its 401), and never reaches a route.
* **Aliases** (``aliases``: exact path → the path it stands for, ``qwen serve``'s
  per-workspace mounts such as ``/workspaces/{id}/acp`` → ``/acp``): an aliased request
  (http or WebSocket) is the request to its target from the first step: its
  ``scope["path"]`` is rewritten before the door, the access decision and the router
  read it. The path is looked up as sent, then as made canonical (a trailing slash).
  ``stray_alias`` (path → the path it stands for, or ``None``) is asked only about a
  path that would be a 404 for its empty or dot segment (a URL-encoded absolute path,
  ``/workspaces/%2Fsrv%2Fws/acp``, reaches the app as ``/workspaces//srv/ws/acp``):
  its answer is rewritten in as an alias's target is (``acp_server.http.mounts``).
* ``body_timeout_s`` (the header timeout): a request body (any method but GET, HEAD,
  OPTIONS) whose next piece does not arrive within it of the app asking is abandoned
  and answered ``408`` ``request_timeout`` in the door's shape (``body_clock``) at
  once, over HTTP/1.x with ``Connection: close`` (the connection closed with it), so a
  body that never comes does not hold a request in flight, nor the cap, for ever.
  Over HTTP/2, what the answer left unread of a body is read and dropped after it (up
  to ``UNREAD_DRAINED``): granian resets a stream whose body is left unread, and the
  client still sending it lost its answer.
* ``max_in_flight`` (for servers that cannot cap connections below ASGI): past that
  many http requests and WebSockets in progress (SSE streams included), a new one is
  answered ``503`` ``connection_limit`` with ``Retry-After: 5`` and ``Connection:
  close`` at once; counted in ``stats["connections"]``.
* **Principals** (``acp_server.principals``): a request the policy admits carries its
  ``Caller``; the door's ``access(method, path)`` says what it needs (a scope, a rate
  class; ``PER_MESSAGE``: the door decides per message, ``/acp``'s JSON-RPC), and a
  missing scope (403 ``forbidden``) or an exhausted rate limit (429
  ``rate_limit_exceeded`` with ``Retry-After``) is answered here, in the door's shape;
  a door's ``resent`` may let a request its rate limit refused through (its body read
  here, under the door's cap: ``acp_server.http.resent``).
  A stored token not yet cached is looked up in the store first (``admit``). A
  stored token's requests run under its ``StreamRegistry`` hold (the hot path
  excepted), and so do the ``local`` principal's (``stream_id``; all but ``POST
  /tokens``, which may configure the first credential: a streamed POST answer too):
  revoking the token (or configuring a first credential) cancels them; a stream is then ended (its last
  body message sent), a request not yet answered gets the 401.
* **websocket** scopes pass to the app, which checks its handshake with the same
  policy (``acp_server.acp_http.websocket``); other scope types pass through.
* **Hot routes** (``HotRoute``): a request whose method and path match one (segment
  by segment, no regex; ``/a/b/`` is not a hot route's path: it is made ``/a/b`` and
  runs through the router) has its body read here (up to ``HOT_BODY_MAX`` bytes; a larger declared
  ``Content-Length``, or a header of the route's ``declines``, skips the hot path,
  unread) and is handed to the door's fast handler with ``scope["route"]`` and
  ``path_params`` set as the router would. The handler returns the answer as its two
  ASGI messages (``http.response.start``, ``http.response.body``; they may be built
  once and returned again: they are sent as they are, never changed, a CORS answer
  gets a new start message), or ``None`` having done nothing: the full app then runs
  the request with the body replayed. Answers are the route's own, byte for byte: the
  fast handler only skips the framework. What the route needs of a principal is
  resolved once per hot route (``door.access(method, route.path)``: a door's access
  rule must not depend on the values of a hot route's path parameters), and so is its
  door: a hot route starts with a literal segment and every door prefix is ``""`` or
  one segment (else ``ValueError`` at construction). The matches of the last
  ``HOT_PATHS_KEPT`` paths are kept (paths up to ``HOT_PATH_CHARS_KEPT`` characters:
  the memo is filled before the policy runs, by refused requests too, so its size in
  bytes is bounded by both).
* The observer sees every http exchange: ``stream_opened(door, scope)`` when an
  ``text/event-stream`` answer starts, ``done(door, scope, status, seconds, events)``
  when the exchange ends (``events`` is ``None`` unless it was a stream; status 500
  when the app raised before answering; the status of an answer whose sending failed,
  the client gone, is still the answer's). It is called on the event loop, never awaits.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from acp_server.http.body_clock import BodyClock, body_timeout, replay
from acp_server.http.policy import LOOKUP, UNAUTHORIZED, GuardPolicy, Refusal, Renderer
from acp_server.http.resent import Resent, let_through
from acp_server.http.whole import body_in_hand, send_whole
from acp_server.principals import CALLER_KEY, Access, Caller
from acp_server.principals.model import MUTATING, READING
from acp_server.principals.streams import stream_id

TOKENS_PATH = "/tokens"   # ``POST`` there configures a credential (``_app``)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Any]
Send = Callable[[Message], Any]
ASGIApp = Callable[[Scope, Receive, Send], Any]

ALLOW_METHODS = b"GET, POST, PATCH, DELETE, OPTIONS"
ALLOW_HEADERS = (b"Authorization, Content-Type, X-Qwen-Client-Id, Last-Event-ID, X-Qwen-Event-Epoch, "
                 b"Acp-Connection-Id, Acp-Session-Id, Idempotency-Key")
EXPOSE_HEADERS = (b"Retry-After, X-Qwen-Event-Epoch, X-Qwen-SSE-Stream-Id, Acp-Connection-Id, "
                  b"Idempotent-Replayed, Location, x-should-retry, X-RateLimit-Limit, "
                  b"X-RateLimit-Remaining, X-RateLimit-Reset")
# A path with an empty or a dot segment (``//tokens``, ``/session//x``): no route has it;
# answered as the router answers an unknown path (REST: ``{"error":"Not Found"}``).
NOT_FOUND = Refusal(404, "not_found", "Not Found", peer_body=b'{"error":"Not Found"}')
CONNECTION_LIMIT = Refusal(503, "connection_limit", "Too many connections",
                           peer_body=b'{"error":"Too many connections","code":"connection_limit"}',
                           headers=((b"retry-after", b"5"), (b"connection", b"close")))
_SSE = b"text/event-stream"
_now = time.perf_counter


HOT_BODY_MAX = 1 << 20
_HOT_DIGITS = len(str(HOT_BODY_MAX))   # a shorter length cannot be over it
_BODILESS = frozenset({"GET", "HEAD", "OPTIONS"})   # no body read: no body clock
# What of a body left unread is read and dropped after the answer, over HTTP/2 (past
# it the stream is left as the server leaves it: the client may lose the answer)
UNREAD_DRAINED = 16 * 1024 * 1024
HOT_PATHS_KEPT = 1024   # hot-route matches kept by path (cleared when full) ...
HOT_PATH_CHARS_KEPT = 256   # ... for paths this long at most (a head may be ~73 KB)
# -> awaitable (start message, body message), or None: declined, nothing done
HotHandler = Callable[[Scope, bytes], Awaitable[tuple[Message, Message] | None]]


@dataclass(frozen=True, slots=True)
class HotRoute:
    """A framework route (``route``, for logs and metrics) with a fast handler;
    ``declines``: request headers (lowercase) that leave the request to the route."""

    method: str
    route: Any
    handler: HotHandler
    declines: frozenset[bytes] = frozenset()

    def template(self) -> tuple[str | tuple[str], ...]:
        return tuple((part[1:-1],) if part.startswith("{") else part
                     for part in self.route.path[1:].split("/"))


@dataclass(frozen=True, slots=True)
class _HotPlan:
    """What the front layer resolved once for a hot route: its door, what it needs of
    a principal, its path template."""

    hot: HotRoute
    template: tuple[str | tuple[str], ...]
    door: Door
    access: Access


def default_access(method: str, path: str) -> Access:
    """Reading for GET and HEAD, else a mutation that needs ``prompt``."""
    return READING if method in ("GET", "HEAD") else MUTATING


@dataclass(frozen=True, slots=True)
class Door:
    """A path prefix, the door's name (logs, metrics), how it renders a refusal, and
    what its requests need of a principal; ``resent``: which requests its rate limit
    refused go on all the same (``acp_server.http.resent``: a prompt sent again)."""

    prefix: str
    name: str
    render: Renderer
    access: Callable[[str, str], Access] = default_access
    resent: Resent | None = None
    _base: str = field(init=False, repr=False, compare=False)
    _under: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_base", self.prefix.rstrip("/"))
        object.__setattr__(self, "_under", self.prefix.rstrip("/") + "/")

    def matches(self, path: str) -> bool:
        return not self.prefix or path == self._base or path.startswith(self._under)


class Observer(Protocol):
    def stream_opened(self, door: str, scope: Scope) -> None: ...

    def done(self, door: str, scope: Scope, status: int, seconds: float,
             events: int | None) -> None: ...


def count_events(chunk: bytes) -> int:
    """SSE frames in ``chunk`` that carry an event (whole frames assumed)."""
    frames = chunk.count(b"\n\n")
    if not frames:
        return 0
    other = chunk.count(b"\n\n:") + chunk.count(b"\n\nretry:") \
        + chunk.startswith((b":", b"retry:"))
    return frames - other


def cors_headers(origin: bytes) -> list[tuple[bytes, bytes]]:
    return [(b"access-control-allow-origin", origin), (b"vary", b"Origin"),
            (b"access-control-expose-headers", EXPOSE_HEADERS)]


class _Exchange:
    """One request's answer as it goes out: its status, and events when a stream."""

    __slots__ = ("front", "door", "scope", "downstream", "status", "events", "cors",
                 "started", "ended")

    def __init__(self, front: FrontLayer, door: Door, scope: Scope, send: Send,
                 cors: list[tuple[bytes, bytes]] | None) -> None:
        self.front = front
        self.door = door
        self.scope = scope
        self.downstream = send
        self.status = 500
        self.events: int | None = None
        self.cors = cors
        self.started = self.ended = False

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
            self.status = message["status"]
            headers = message.get("headers", ())
            for key, value in headers:
                if key == b"content-type":
                    if bytes(value).startswith(_SSE):
                        self.events = 0
                        observer = self.front.observer
                        if observer is not None:
                            observer.stream_opened(self.door.name, self.scope)
                    break
            if self.cors is not None:
                message["headers"] = [*headers, *self.cors]
        elif message["type"] == "http.response.body":
            if self.events is not None:
                self.events += count_events(message.get("body", b""))
            self.ended = not message.get("more_body", False)
        await self.downstream(message)

    async def cut(self) -> None:
        """The app was cancelled (its token revoked): end what it started."""
        try:
            if not self.started:
                await self.front._refuse(self.send, UNAUTHORIZED, self.door, None)
            elif not self.ended:
                await self.send({"type": "http.response.body", "body": b"",
                                 "more_body": False})
        except OSError:
            pass   # the client went away meanwhile


class FrontLayer:
    def __init__(self, app: ASGIApp, policy: GuardPolicy, *, doors: Sequence[Door],
                 observer: Observer | None = None, max_in_flight: int | None = None,
                 stats: MutableMapping[str, int] | None = None,
                 hot: Sequence[HotRoute] = (),
                 aliases: Mapping[str, str] | None = None,
                 stray_alias: Callable[[str], str | None] | None = None,
                 body_timeout_s: float | None = None) -> None:
        self.app = app
        self.body_timeout_s = body_timeout_s
        self.aliases = dict(aliases) if aliases else None
        self.stray_alias = stray_alias
        self.policy = policy
        self.doors = tuple(doors)
        self.observer = observer
        self.max_in_flight = max_in_flight
        self.in_flight = 0
        self.stats = stats if stats is not None else {"connections": 0}
        self._encoded: dict[tuple[Refusal, str], tuple[Message, Message]] = {}
        self._by_segment = _doors_by_segment(self.doors)
        self._hot: dict[tuple[str, int], list[_HotPlan]] = {}
        for h in hot:   # by (method, number of segments): the plans to try, in order
            self._hot.setdefault((h.method, len(h.template())), []).append(self._plan(h))
        self._hot_seen: dict[str, tuple[_HotPlan, dict[str, str]]] = {}

    def _plan(self, hot: HotRoute) -> _HotPlan:
        """The door of a hot route is resolved from its template, which is the door of
        every path it matches only when the route starts with a literal segment and the
        door is chosen by the first segment (``_by_segment``): both are checked."""
        if type(hot.template()[0]) is tuple:
            raise ValueError(f"A hot route must start with a literal segment: {hot.route.path}")
        if self._by_segment is None:
            raise ValueError("Hot routes need door prefixes of one segment at most: "
                             + ", ".join(repr(door.prefix) for door in self.doors))
        door = self.door_of(hot.route.path)
        return _HotPlan(hot, hot.template(), door, door.access(hot.method, hot.route.path))

    def _hot_route(self, method: str, path: str) -> tuple[_HotPlan, dict[str, str]] | None:
        """The hot route of ``path`` and its path parameters (a new dict each time)."""
        seen = self._hot_seen.get(path)   # the paths matched lately: one lookup
        if seen is not None and seen[0].hot.method == method:
            return seen[0], dict(seen[1])
        found = self._match_hot(method, path)
        if found is not None and len(path) <= HOT_PATH_CHARS_KEPT:
            if len(self._hot_seen) >= HOT_PATHS_KEPT:
                self._hot_seen.clear()
            self._hot_seen[path] = found[0], dict(found[1])
        return found

    def _match_hot(self, method: str, path: str) -> tuple[_HotPlan, dict[str, str]] | None:
        if path[:1] != "/":   # ``xsession/…`` is no ``/session/…`` (``canonical_path``)
            return None
        segments = path[1:].split("/")
        for plan in self._hot.get((method, len(segments)), ()):
            params: dict[str, str] = {}
            for want, got in zip(plan.template, segments):
                if type(want) is tuple:
                    if not got:
                        break
                    params[want[0]] = got
                elif want != got:
                    break
            else:
                return plan, params
        return None

    def door_of(self, path: str) -> Door:
        """The first door whose prefix matches ``path``, else the last door."""
        if self._by_segment is not None:
            by_segment, default = self._by_segment
            return by_segment.get(path[1:].split("/", 1)[0], default)
        for door in self.doors:
            if door.matches(path):
                return door
        return self.doors[-1]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._not_http(scope, receive, send)
            return
        start = _now()
        path = scope["path"]
        found = self._hot_route(scope["method"], path) if self._hot else None
        stray = False   # a path no route has: 404 once the policy has passed it
        if found is None:
            path, stray = self._path_of(scope, path)
        door = found[0].door if found is not None else self.door_of(path)
        # Each answer's status is set before it is sent: a send that fails (the client
        # gone) still reports what was answered; 500 when nothing was.
        status, events = 500, None
        clock = None   # a body that stops arriving: 408 (``body_clock``)
        try:
            if self.max_in_flight is not None and self.in_flight >= self.max_in_flight:
                self.stats["connections"] = self.stats.get("connections", 0) + 1
                status = CONNECTION_LIMIT.status
                await self._refuse(send, CONNECTION_LIMIT, door, None)
                return
            if self.body_timeout_s is not None and scope["method"] not in _BODILESS \
                    and not body_in_hand(receive):
                clock = BodyClock(receive, self.body_timeout_s)
                receive = clock.receive
            refusal, origin = self.policy.inspect(scope)
            if refusal is LOOKUP:
                refusal, origin = await self.policy.admit(scope)
            if refusal is None and stray:
                refusal = NOT_FOUND
            caller: Caller | None = scope.get(CALLER_KEY)
            if refusal is None and caller is not None:
                access = found[0].access if found is not None \
                    else door.access(scope["method"], path)
                if not access.per_message:
                    denial = caller.check(access)
                    passed = None if denial is None or door.resent is None else \
                        await let_through(door.resent, scope, receive, path, caller, denial)
                    if passed is not None:   # a prompt sent again: its 429 read its body
                        receive = passed
                    elif denial is not None:
                        caller.denied(denial, f"{scope['method']} {path}")
                        refusal = Refusal.of(denial)
            if refusal is not None:
                status = refusal.status
                await self._refuse(send, refusal, door, origin)
                return
            if origin is not None and scope["method"] == "OPTIONS" and _has(
                    scope, b"access-control-request-method"):
                status = 204
                await send({"type": "http.response.start", "status": 204, "headers": [
                    *cors_headers(origin),
                    (b"access-control-allow-methods", ALLOW_METHODS),
                    (b"access-control-allow-headers", ALLOW_HEADERS),
                    (b"access-control-max-age", b"600")]})
                await send({"type": "http.response.body", "body": b""})
                return
            self.in_flight += 1
            try:
                if found is not None:
                    answered = await self._hot_path(scope, receive, origin, *found)
                    if type(answered) is tuple:
                        answer, end = answered
                        status = answer["status"]
                        await send_whole(send, answer, end)
                        return
                    receive = answered   # type: ignore[assignment]
                exchange = _Exchange(self, door, scope, send,
                                     None if origin is None else cors_headers(origin))
                app_send = exchange.send if clock is None else clock.bind(
                    exchange.send, partial(self._refuse, refusal=body_timeout(scope),
                                           door=door, origin=origin))
                try:
                    await self._app(scope, receive, exchange, caller, app_send)
                    if clock is not None:
                        await clock.settle()
                finally:
                    status, events = exchange.status, exchange.events
            finally:
                self.in_flight -= 1
        finally:   # every http exchange ends here, refused or answered
            if clock is not None and not clock.complete and sys.exc_info()[0] is None \
                    and scope.get("http_version") == "2":
                await clock.drain(UNREAD_DRAINED)   # the answer reaches an HTTP/2 client
            observer = self.observer
            if observer is not None:
                observer.done(door.name, scope, status, _now() - start, events)

    def _path_of(self, scope: Scope, path: str) -> tuple[str, bool]:
        """The path the request is routed by (``scope["path"]`` rewritten when it
        differs: an alias's target, the canonical path) and whether no route has it."""
        aliases = self.aliases
        if aliases is not None:
            target = aliases.get(path)
            if target is not None:
                scope["path"] = target
                return target, False
        canonical = canonical_path(path)
        if canonical is None:
            target = self.stray_alias(path) if self.stray_alias is not None else None
            if target is None:
                return _collapsed(path), True
            scope["path"] = target
            return target, False
        if aliases is not None and canonical is not path:
            canonical = aliases.get(canonical, canonical)
        if canonical is not path:
            scope["path"] = canonical
        return canonical, False

    async def _app(self, scope: Scope, receive: Receive, exchange: _Exchange,
                   caller: Caller | None, send: Send) -> None:
        """The app, under the caller's stream hold when a stored token calls."""
        token_id = None
        if caller is not None:
            token_id = caller.principal.token_id
            if token_id is None and (scope["method"] != "POST"     # the local principal's
                                     or scope["path"] != TOKENS_PATH):   # answers, never
                token_id = stream_id(caller.principal)   # the POST that ends them
        if token_id is None:
            await self.app(scope, receive, send)
            return
        with caller.gate.streams.hold(token_id) as held:   # type: ignore[union-attr]
            await self.app(scope, receive, send)
        if held.cancelled_caught:
            await exchange.cut()

    async def _not_http(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A WebSocket (counted in ``in_flight``, closed with 1013 past
        ``max_in_flight``) or another scope type, passed to the app. A WebSocket's path
        is made canonical as an HTTP request's is (``/acp/`` is ``/acp``, an alias its
        target; a path no route can have is closed before the handshake: the server
        answers 403)."""
        if scope["type"] == "websocket":
            _, stray = self._path_of(scope, scope["path"])
            if stray:
                await send({"type": "websocket.close", "code": 1008})
                return
        if scope["type"] == "websocket" and self.max_in_flight is not None:
            if self.in_flight >= self.max_in_flight:
                self.stats["connections"] = self.stats.get("connections", 0) + 1
                await send({"type": "websocket.close", "code": 1013})
                return
            self.in_flight += 1
            try:
                await self.app(scope, receive, send)
            finally:
                self.in_flight -= 1
            return
        await self.app(scope, receive, send)

    async def _hot_path(self, scope: Scope, receive: Receive, origin: bytes | None,
                        plan: _HotPlan,
                        params: dict[str, str]) -> tuple[Message, Message] | Receive:
        """The fast handler's answer (its two messages, to send; CORS headers added);
        else the ``receive`` that replays the body read so far, for the full app. A
        declared body over ``HOT_BODY_MAX`` goes to the app unread (its cap answers
        before the body)."""
        declines = plan.hot.declines
        for name, value in scope["headers"]:
            if name == b"content-length":
                if not value.isdigit() or (len(value) >= _HOT_DIGITS and int(value) > HOT_BODY_MAX):
                    return receive
            elif name in declines:
                return receive
        message = await receive()
        if message["type"] != "http.request":   # gone: the app sees it as it was
            return replay([], message, receive)
        body = message.get("body", b"")
        if message.get("more_body", False):
            chunks = [body]
            size, more = len(body), True
            while more and size <= HOT_BODY_MAX:
                message = await receive()
                if message["type"] != "http.request":
                    return replay(chunks, message, receive)
                chunk = message.get("body", b"")
                chunks.append(chunk)
                size += len(chunk)
                more = message.get("more_body", False)
            if more:
                return replay(chunks, {"more": True}, receive)
            body = b"".join(chunks)
        scope["route"], scope["path_params"] = plan.hot.route, params
        answer = await plan.hot.handler(scope, body)
        if answer is None:
            return replay([body], None, receive)
        if origin is not None:
            start, end = answer
            return {**start, "headers": [*start["headers"], *cors_headers(origin)]}, end
        return answer

    async def _refuse(self, send: Send, refusal: Refusal, door: Door,
                      origin: bytes | None) -> None:
        key = (refusal, door.name)
        encoded = self._encoded.get(key) if refusal.cacheable else None
        if encoded is None:
            content_type, body = door.render(refusal)
            headers = [(b"content-type", content_type),
                       (b"content-length", str(len(body)).encode()), *refusal.headers]
            encoded = (
                {"type": "http.response.start", "status": refusal.status, "headers": headers},
                {"type": "http.response.body", "body": body})
            if refusal.cacheable:
                self._encoded[key] = encoded
        start, body_message = encoded
        if origin is not None:
            start = {**start, "headers": [*start["headers"], *cors_headers(origin)]}
        # Fresh dicts: a server may keep or change what it is sent.
        await send_whole(send, dict(start), dict(body_message))


def _doors_by_segment(doors: Sequence[Door]) -> tuple[dict[str, Door], Door] | None:
    """``door_of`` as one dict lookup on the path's first segment, when every prefix is
    ``""`` or one segment (``/x``, ``/x/``): {segment: the first door of that segment},
    and the door of every other path (the first ``""`` door, else the last door). Doors
    after a ``""`` door are never chosen, as in the scan. ``None`` for other prefixes."""
    by_segment: dict[str, Door] = {}
    for door in doors:
        if not door.prefix:
            return by_segment, door
        segment = door.prefix.strip("/")
        if not door.prefix.startswith("/") or not segment or "/" in segment:
            return None
        by_segment.setdefault(segment, door)
    return by_segment, doors[-1]


def canonical_path(path: str) -> str | None:
    """``path`` as the router matches it and as access is decided on it: one trailing
    slash dropped (``/x/`` is ``/x``, as Express's non-strict routing has it; ``path``
    itself when it has none); ``None`` for a path with an empty segment (``//x``,
    ``/x//y``, ``/x//``) or a dot segment (``/./``, ``/../``), which no route has, and
    for one that does not start with ``/`` (``tokens``, ``""``: no server should hand
    those over, and the router would take ``tokens`` for ``/tokens``)."""
    if "//" in path or path[:1] != "/":
        return None
    if path[-1:] == "/" and len(path) > 1:
        path = path[:-1]
    if "/." in path and any(part in (".", "..") for part in path.split("/")):
        return None
    return path


def _collapsed(path: str) -> str:
    """A stray path without its empty and dot segments: which door answers it."""
    return "/" + "/".join(part for part in path.split("/") if part not in ("", ".", ".."))


def _has(scope: Scope, name: bytes) -> bool:
    return any(key == name for key, _ in scope["headers"])


__all__ = ["ALLOW_HEADERS", "ALLOW_METHODS", "CONNECTION_LIMIT", "Door", "EXPOSE_HEADERS",
           "FrontLayer", "HotRoute", "NOT_FOUND", "Observer", "canonical_path", "count_events",
           "cors_headers", "default_access"]
