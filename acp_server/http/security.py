"""The network guard in front of every door: Origin policy, CORS, bearer token.

    policy = GuardPolicy(token="s3cret", health_needs_auth=False, allow_origins=())
    app = Starlette(routes=..., middleware=[Middleware(SecurityMiddleware, policy=policy,
                                                       unauthorized=[("/lmsp/", ctype, body)])])

Contracts (``qwen serve`` 0.24.4, qwen-serve.md §1.1 and §3.5):

* A request with an ``Origin`` header gets ``403 {"error":"Request denied by CORS
  policy"}`` unless the origin is allow-listed (``--allow-origin``; ``*`` allows any).
  A loopback self-origin (``http://127.0.0.1:<our port>``, ``localhost``, ``[::1]``)
  from a loopback client is treated as no Origin at all.
* Allowed origins get ``Access-Control-Allow-Origin`` and ``-Expose-Headers`` on every
  answer; a preflight ``OPTIONS`` answers 204 with the allowed methods and headers,
  before (and without) authentication.
* With a token configured every request needs ``Authorization: Bearer <token>``,
  compared in constant time; every failure is the same ``401 {"error":"Unauthorized"}``.
  ``/health`` and ``/metrics`` are exempt on a loopback bind unless ``--require-auth``,
  and so are the ``public`` requests (the web console's static files).
* The checks run before the body is read and add no per-request allocation on the
  common path (no Origin, no token).
* The guard knows no door: the 401 / 403 bodies under a path prefix are given by the
  composer (``acp_server.app``); elsewhere they are ``{"error": ...}`` JSON objects.
  Each door maps its own errors behind it. WebSocket scopes pass through: the ``/acp``
  door checks its handshake with the same ``GuardPolicy`` (``is_self_origin``).
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

ALLOW_METHODS = b"GET, POST, PATCH, DELETE, OPTIONS"
ALLOW_HEADERS = (b"Authorization, Content-Type, X-Qwen-Client-Id, Last-Event-ID, X-Qwen-Event-Epoch, "
                 b"Acp-Connection-Id, Acp-Session-Id, Idempotency-Key")
EXPOSE_HEADERS = (b"Retry-After, X-Qwen-Event-Epoch, X-Qwen-SSE-Stream-Id, Acp-Connection-Id, "
                  b"Idempotent-Replayed, Location, x-should-retry")
_UNAUTHORIZED = b'{"error":"Unauthorized"}'
_CORS_DENIED = b'{"error":"Request denied by CORS policy"}'
_JSON = (b"content-type", b"application/json")
OPEN_PATHS = frozenset({"/health", "/metrics"})   # the health_needs_auth rule


@dataclass(frozen=True, slots=True)
class GuardPolicy:
    """What the guard enforces: the token (``None`` = none), whether ``OPEN_PATHS``
    need it too, and the allow-listed origins (``*`` = any)."""

    token: str | None = None
    health_needs_auth: bool = False
    allow_origins: tuple[str, ...] = ()


def is_loopback(hostname: str) -> bool:
    host = hostname.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


def is_self_origin(origin: str, scope: Scope) -> bool:
    """A loopback origin naming our own port, sent by a loopback client."""
    client = scope.get("client")
    server = scope.get("server")
    if not client or not server or not is_loopback(client[0]):
        return False
    try:
        parts = urlsplit(origin)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and is_loopback(parts.hostname or "") \
        and port == server[1]


class SecurityMiddleware:
    def __init__(self, app: ASGIApp, policy: GuardPolicy,
                 unauthorized: Sequence[tuple[str, bytes, bytes]] = (),
                 denied: Sequence[tuple[str, bytes, bytes]] = (),
                 public: Callable[[str, str], bool] | None = None) -> None:
        """``unauthorized`` / ``denied``: (path prefix, content type, body) of the 401 /
        CORS 403 answered under that prefix instead of the plain JSON body (e.g. a
        problem object for LMSP). ``public(method, path)``: requests served without the token
        (the web console's static files); the Origin rules still apply to them."""
        self.app = app
        self.public = public
        self.unauthorized = tuple(unauthorized)
        self.denied = tuple(denied)
        self.token = policy.token.encode() if policy.token is not None else None
        self.health_open = not policy.health_needs_auth
        self.allow_any = "*" in policy.allow_origins
        self.allowed = frozenset(o.rstrip("/").lower() for o in policy.allow_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        origin_raw = _header(scope, b"origin")
        allowed_origin: bytes | None = None
        if origin_raw is not None:
            origin = origin_raw.decode("latin-1")
            if self.allow_any or origin.rstrip("/").lower() in self.allowed:
                allowed_origin = origin_raw
            elif not is_self_origin(origin, scope):
                content_type, body = _for_path(scope, self.denied, _CORS_DENIED)
                await _send(send, 403, body, content_type=content_type)
                return
        if allowed_origin is not None and scope["method"] == "OPTIONS" \
                and _header(scope, b"access-control-request-method") is not None:
            await send({"type": "http.response.start", "status": 204, "headers": [
                *_cors_headers(allowed_origin),
                (b"access-control-allow-methods", ALLOW_METHODS),
                (b"access-control-allow-headers", ALLOW_HEADERS),
                (b"access-control-max-age", b"600"),
            ]})
            await send({"type": "http.response.body", "body": b""})
            return
        if self.token is not None and not self._authorized(scope):
            content_type, body = _for_path(scope, self.unauthorized, _UNAUTHORIZED)
            await _send(send, 401, body, allowed_origin, content_type)
            return
        if allowed_origin is None:
            await self.app(scope, receive, send)
            return
        cors = _cors_headers(allowed_origin)

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), *cors]
            await send(message)

        await self.app(scope, receive, send_with_cors)

    def _authorized(self, scope: Scope) -> bool:
        if self.health_open and scope["path"] in OPEN_PATHS:
            return True
        if self.public is not None and self.public(scope["method"], scope["path"]):
            return True
        assert self.token is not None
        value = _header(scope, b"authorization")
        if value is None or len(value) < 7 or value[:7].lower() != b"bearer ":
            # Still compare, so a missing header costs what a wrong one does.
            hmac.compare_digest(self.token, b"")
            return False
        return hmac.compare_digest(self.token, value[7:].strip())


def _for_path(scope: Scope, overrides: Sequence[tuple[str, bytes, bytes]],
              default: bytes) -> tuple[bytes, bytes]:
    for prefix, content_type, body in overrides:
        if scope["path"].startswith(prefix):
            return content_type, body
    return _JSON[1], default


def _cors_headers(origin: bytes) -> list[tuple[bytes, bytes]]:
    return [(b"access-control-allow-origin", origin), (b"vary", b"Origin"),
            (b"access-control-expose-headers", EXPOSE_HEADERS)]


async def _send(send: Send, status: int, body: bytes, origin: bytes | None = None,
                content_type: bytes = _JSON[1]) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    if origin is not None:
        headers.extend(_cors_headers(origin))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
