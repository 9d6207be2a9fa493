"""One security check for every transport: ``GuardPolicy.check(scope) -> Refusal | None``.

    policy = GuardPolicy(token="s3cret", loopback_bind=True, allow_hosts=("dev.box",))
    refusal = policy.check(scope)          # an ASGI http or websocket scope
    if refusal is not None:
        content_type, body = render(refusal)   # the door's own renderer (its error shape)

The HTTP front layer (``acp_server.http.front``) and the ``/acp`` WebSocket handshake
both call it, as the MCP SDK's ``transport_security`` is called by each transport.

Contracts (the checks run in this order; the first that fails is the answer):

1. **Sizes** (a second line behind the HTTP server's own caps, the same on every
   server and on HTTP/2): a request line (method, target, version) over
   ``max_request_line`` bytes → ``414``; more than ``max_headers`` header fields, or
   more than ``max_header_bytes`` of names and values → ``431``.
2. **Transfer codings** (http scopes): a ``Transfer-Encoding`` other than ``chunked``
   alone (``gzip, chunked``, ``identity``, …) → ``501``; we decode no coding.
3. **Host** (DNS rebinding): on a loopback bind only ``localhost``, ``127.0.0.1``,
   ``[::1]`` (any loopback address), with any port (a local relay or port forward
   names its own; a rebound name is never one of these), are accepted, plus the
   ``allow_hosts`` entries (``name`` = any port, ``name:port`` = that port); anything
   else → ``421``. With ``allow_hosts`` given the same holds on any bind;
   on a non-loopback bind without it the Host is not checked. A request with no
   ``Host`` (HTTP/1.0 tools; no browser sends one) passes.
4. **Origin**: an ``Origin`` not allow-listed (``allow_origins``; ``*`` = any) and not
   our own loopback origin seen from a loopback client → ``403`` (the peer's bytes,
   ``{"error":"Request denied by CORS policy"}``).
5. **Credentials** (``acp_server.principals``): when a credential is required (a
   bootstrap ``token``, or a live stored token in the gate's store), every request
   needs ``Authorization: Bearer <credential>`` (a WebSocket may carry it as
   ``Sec-WebSocket-Protocol: qwen-bearer.<base64url>``, the first such entry only):
   the bootstrap token or a stored ``acps_…`` token, compared in constant time → ``401`` otherwise (one
   answer for missing, unknown, wrong, revoked and expired; each failure is an
   ``auth.failed`` audit record, sampled). A client not on loopback that offered a
   wrong credential (or two) ``FAILURE_TIERS`` times (20 at once, then one every 3 s: ``Gate.failures``) → ``429``
   ``too_many_failed_credentials`` with ``Retry-After``, its credential not compared,
   until its bucket holds one again (a loopback client is never throttled: all local
   processes share its address, and they can be refused by other means). ``OPEN_PATHS`` are exempt unless
   ``health_needs_auth``, and so are ``public(method, path)`` requests (the web
   console's files; never a WebSocket), and so is an allowed CORS preflight
   (``OPTIONS`` with ``Access-Control-Request-Method``). **Without** any credential
   configured only loopback clients are served, on HTTP and WebSocket alike → ``403``;
   a loopback client is then the ``local`` principal (admin).

A request that passes carries its ``Caller`` (``acp_server.principals``) in the scope
under ``CALLER_KEY`` (an exempt one carries none). ``check`` is synchronous: it reads
the scope, allocates nothing on the common path (no Origin, a cached credential, a
loopback Host) and never awaits; a stored token that is not cached makes it answer
``LOOKUP``, and ``admit`` (the same checks, awaited) reads the store then (503
``store_unavailable`` when it cannot). ``inspect`` also returns the Origin to echo in
CORS headers (the front layer needs it; the WebSocket does not).
"""

from __future__ import annotations

import base64
import dataclasses
import ipaddress
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from acp_server.principals import CALLER_KEY, LOCAL, Caller, Denial, Gate
from acp_server.principals.auth import MISS, bootstrap_only
from acp_server.principals.limits import CREDENTIAL_FAILURE
from acp_server.principals.model import Principal
from acp_server.principals.tokens import parse as parse_token
from acp_server.principals.tokens import public_id
from acp_server.store.errors import StoreUnavailableError

OPEN_PATHS = frozenset({"/health", "/metrics"})   # the health_needs_auth rule
BEARER_PROTOCOL = "qwen-bearer."
DEFAULT_MAX_HEADER_BYTES = 64 * 1024
DEFAULT_MAX_HEADERS = 100
DEFAULT_MAX_REQUEST_LINE = 8 * 1024
MEMO_KEPT = 256   # entries of each of the policy's memos (filled by refused requests too)
MEMO_HOST_BYTES = 256   # Host values kept in its memo at most this long (a head: 64 KiB)


@dataclass(frozen=True, slots=True)
class Refusal:
    """An answer given before any door runs; each door renders it in its own shape
    (``Renderer``). ``code`` is machine-readable (REST ``code``, ``/acp``
    ``data.errorKind``, LMSP problem ``code``); ``peer_body`` is the exact body
    ``qwen serve`` answers (401, CORS 403), which REST and ``/acp`` keep."""

    status: int
    code: str
    message: str
    peer_body: bytes | None = None
    headers: tuple[tuple[bytes, bytes], ...] = ()
    extra: tuple[tuple[str, object], ...] = ()   # more members of the body (or ``data``)
    # Its bytes may be kept per door (the front layer's cache): not for per-request ones.
    cacheable: bool = field(default=True, compare=False)

    @classmethod
    def of(cls, denial: Denial) -> Refusal:
        """The principals' 403 / 429 as a refusal (a 429 is per request: not cached)."""
        return cls(denial.status, denial.code, denial.message, headers=denial.headers,
                   extra=denial.extra, cacheable=denial.status != 429)


UNAUTHORIZED = Refusal(401, "unauthorized", "A valid bearer token is required.",
                       peer_body=b'{"error":"Unauthorized"}')
CORS_DENIED = Refusal(403, "forbidden", "Request denied by CORS policy.",
                      peer_body=b'{"error":"Request denied by CORS policy"}')
NOT_LOOPBACK = Refusal(403, "forbidden",
                       "No token is configured: only loopback clients are served.")
MISDIRECTED = Refusal(421, "misdirected_request",
                      "Host not accepted by this server (see --allow-host).")
HTTP_1_0 = ("1.0", "1")   # ``http_version`` of an HTTP/1.0 request (granian's ASGI: "1")
# RFC 9112 §3.2: a request with more than one Host field is answered 400 (each server
# hands them all to the app; which one a proxy in front read is unknown).
TWO_HOSTS = Refusal(400, "bad_request", "More than one Host header field.")
LINE_TOO_LONG = Refusal(414, "uri_too_long", "Request line too long.")
TOO_MANY_HEADERS = Refusal(431, "header_fields_too_large", "Too many header fields.")
HEADERS_TOO_LARGE = Refusal(431, "header_fields_too_large", "Header fields too large.")
CODING_UNSUPPORTED = Refusal(501, "transfer_coding_unsupported",
                             "Transfer-Encoding other than chunked is not supported.")
# A client not on loopback past its failed credentials (``GuardPolicy._guessing``): its
# ``Retry-After`` is set per answer.
TOO_MANY_FAILURES = Refusal(429, "too_many_failed_credentials",
                            "Too many failed credentials from this address; retry later.",
                            cacheable=False)
STORE_UNAVAILABLE = Refusal(503, "store_unavailable",
                            "The token store is unavailable; retry later.",
                            headers=((b"retry-after", b"5"),))
# Not an answer: ``check`` needs the store to tell (``admit`` awaits it).
LOOKUP = Refusal(0, "lookup", "")


Renderer = Callable[[Refusal], tuple[bytes, bytes]]   # -> (content type, body)


def is_loopback(hostname: str) -> bool:
    host = hostname.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)   # ::ffff:127.0.0.1 on a dual-stack bind
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def _port(value: Any) -> int | None:
    try:
        return int(value)   # some servers (granian) give ports as strings
    except (TypeError, ValueError):
        return None


def is_self_origin(origin: str, scope: Any) -> bool:
    """A loopback origin naming our own port, sent by a loopback client."""
    client = scope.get("client")
    server = scope.get("server")
    if not client or not server or not is_loopback(str(client[0])):
        return False
    try:
        parts = urlsplit(origin)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and is_loopback(parts.hostname or "") \
        and port == _port(server[1])


def split_host(value: str) -> tuple[str, int | None] | None:
    """``Host`` → (lowercase name, port or None); ``None`` when malformed."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[:end + 1], value[end + 1:]
        if not rest:
            return name, None
        if not rest.startswith(":"):
            return None
        port_text = rest[1:]
    else:
        name, sep, port_text = value.rpartition(":")
        if not sep:
            return value, None
        if ":" in name:   # a bare IPv6 address is not a valid Host
            return None
    if not port_text.isdigit() or len(port_text) > 5:
        return None
    return name, int(port_text)


@dataclass(frozen=True)
class GuardPolicy:
    """What the guard enforces (see the module docstring for the rules)."""

    token: str | None = None
    health_needs_auth: bool = False
    allow_origins: tuple[str, ...] = ()
    loopback_bind: bool = True
    allow_hosts: tuple[str, ...] = ()
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    max_headers: int = DEFAULT_MAX_HEADERS
    max_request_line: int = DEFAULT_MAX_REQUEST_LINE
    public: Callable[[str, str], bool] | None = field(default=None, compare=False)
    # The principals (stored tokens, audit, limits); default: ``token`` alone.
    gate: Gate | None = field(default=None, compare=False)
    # Sets ``scope["client"]`` to the caller behind a trusted proxy or a forwarding
    # instance (``acp_server.http.clients.ClientResolver``), first: None when off.
    clients: Callable[[Any], None] | None = field(default=None, compare=False)
    # Derived from the fields above (``__post_init__``).
    _allow_any: bool = field(init=False, repr=False, compare=False)
    _origins: frozenset[str] = field(init=False, repr=False, compare=False)
    _hosts_any_port: frozenset[str] = field(init=False, repr=False, compare=False)
    _hosts_exact: frozenset[tuple[str, int | None]] = field(init=False, repr=False,
                                                            compare=False)
    _check_host: bool = field(init=False, repr=False, compare=False)
    # Memos (at most ``MEMO_KEPT`` entries each; past it the answer is computed again):
    # Host header values (up to ``MEMO_HOST_BYTES``) -> accepted; the common case is one
    # lookup.
    _good_hosts: dict[bytes, bool] = field(init=False, repr=False, compare=False,
                                           default_factory=dict)
    # client address -> loopback
    _clients: dict[Any, bool] = field(init=False, repr=False, compare=False,
                                      default_factory=dict)
    # loopback client address -> its local Caller, when no credential is configured
    _local_callers: dict[Any, Caller] = field(init=False, repr=False, compare=False,
                                              default_factory=dict)

    def __post_init__(self) -> None:
        setattr_ = object.__setattr__
        if self.gate is None:
            setattr_(self, "gate", Gate(bootstrap_only(self.token)))
        setattr_(self, "_allow_any", "*" in self.allow_origins)
        setattr_(self, "_origins", frozenset(o.rstrip("/").lower() for o in self.allow_origins))
        any_port, exact = set(), set()
        for entry in self.allow_hosts:
            parsed = split_host(entry)
            if parsed is None:
                raise ValueError(f"Invalid allow-host: {entry!r}. Must be a host name, "
                                 "optionally with :port.")
            (exact.add(parsed) if parsed[1] is not None else any_port.add(parsed[0]))
        setattr_(self, "_hosts_any_port", frozenset(any_port))
        setattr_(self, "_hosts_exact", frozenset(exact))
        setattr_(self, "_check_host", self.loopback_bind or bool(self.allow_hosts))

    # -- the check ------------------------------------------------------------------
    def check(self, scope: Any) -> Refusal | None:
        """The refusal for this http or websocket scope, or ``None`` to serve it."""
        return self.inspect(scope)[0]

    def inspect(self, scope: Any) -> tuple[Refusal | None, bytes | None]:
        """(refusal or None, the allow-listed ``Origin`` to echo or None)."""
        if self.clients is not None:
            self.clients(scope)
        headers = scope["headers"]
        if len(headers) > self.max_headers:
            return TOO_MANY_HEADERS, None
        line = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"") \
            + len(scope.get("method", "GET")) + 11
        if line > self.max_request_line:
            return LINE_TOO_LONG, None
        host = origin = authorization = coding = protocols = None
        preflight = repeated = hosts = False
        size = 0
        for name, value in headers:
            size += len(name) + len(value)
            if name == b"host":
                hosts = host is not None
                host = value
            elif name == b"origin":
                origin = value
            elif name == b"authorization":
                repeated = authorization is not None
                authorization = value if not repeated else authorization
            elif name == b"transfer-encoding":
                coding = value if coding is None else coding + b"," + value
            elif name == b"sec-websocket-protocol":
                protocols = value
            elif name == b"access-control-request-method":
                preflight = True
        if size > self.max_header_bytes:
            return HEADERS_TOO_LARGE, None
        if coding is not None and coding.strip().lower() != b"chunked" \
                and scope["type"] == "http":
            return CODING_UNSUPPORTED, None
        if hosts:
            return TWO_HOSTS, None
        # HTTP/1.0 without a Host: granian's ASGI side gives ``host: ""`` (and its
        # ``http_version`` is "1"); none passes
        if host is not None and self._check_host \
                and not (self._good_hosts.get(host) or self._host_ok(host)) \
                and (host or scope.get("http_version") not in HTTP_1_0):
            return MISDIRECTED, None
        allowed: bytes | None = None
        if origin is not None:
            text = origin.decode("latin-1")
            if self._allow_any or text.rstrip("/").lower() in self._origins:
                allowed = origin
            elif not is_self_origin(text, scope):
                return CORS_DENIED, None
            if preflight and allowed is not None and scope.get("method") == "OPTIONS":
                return None, allowed   # a preflight is answered before authentication
        gate: Gate = self.gate   # type: ignore[assignment]
        if repeated:   # two credentials: neither is taken (RFC 9110 allows one field)
            if not gate.authenticator.required:
                return self._local(scope), allowed   # what is offered is ignored
            if self._exempt(scope):
                return None, allowed
            throttled = self._guessing(scope)
            if throttled is not None:
                return throttled, allowed
            self._failed(scope, None, reason="repeated_credential")
            return UNAUTHORIZED, allowed
        if not gate.authenticator.required:
            found = None if authorization is None and protocols is None \
                else self._offered_token(scope, authorization, protocols)
            if found is MISS:
                return LOOKUP, allowed
            if found is not None:   # a stored token's principal (see _offered_token)
                self._admit_as(scope, found)  # type: ignore[arg-type]
                return None, allowed
            return self._local(scope), allowed
        if self._exempt(scope):
            return None, allowed
        throttled = self._guessing(scope)
        if throttled is not None:
            return throttled, allowed
        return self._authenticate(scope, authorization, protocols), allowed

    async def admit(self, scope: Any) -> tuple[Refusal | None, bytes | None]:
        """``inspect``, reading the store when a stored token is not cached."""
        refusal, origin = self.inspect(scope)
        if refusal is not LOOKUP:
            return refusal, origin
        gate: Gate = self.gate   # type: ignore[assignment]
        refused = None
        for credential in self._credentials(scope):
            try:
                found = await gate.authenticator.lookup(credential)
            except StoreUnavailableError:
                if not gate.authenticator.required:
                    break   # no credential needed: the store's answer can wait
                return STORE_UNAVAILABLE, origin
            if found is not None:
                self._admit_as(scope, found)
                return None, origin
            refused = credential
        if not gate.authenticator.required:   # none needed, none of those is a token
            return self._local(scope), origin
        self._failed(scope, refused)
        return UNAUTHORIZED, origin

    async def check_async(self, scope: Any) -> Refusal | None:
        """``check`` with the store's answer awaited (the WebSocket handshake)."""
        return (await self.admit(scope))[0]

    # -- parts ----------------------------------------------------------------------
    def _host_ok(self, value: bytes) -> bool:
        good = self._good_hosts
        known = good.get(value)
        if known is not None:
            return known
        parsed = split_host(value.decode("latin-1"))
        ok = False
        if parsed is not None:
            name = parsed[0]
            ok = name in self._hosts_any_port or parsed in self._hosts_exact \
                or (self.loopback_bind and is_loopback(name))
        if len(good) < MEMO_KEPT and len(value) <= MEMO_HOST_BYTES:
            good[value] = ok   # hostile values beyond the bounds are just parsed again
        return ok

    def _loopback_client(self, address: Any) -> bool:
        seen = self._clients
        known = seen.get(address)
        if known is None:
            known = is_loopback(str(address))
            if len(seen) < MEMO_KEPT:
                seen[address] = known
        return known

    def _exempt(self, scope: Any) -> bool:
        if scope["type"] != "http":
            return False
        path = scope["path"]
        if not self.health_needs_auth and path in OPEN_PATHS:
            return True
        return self.public is not None and self.public(scope["method"], path)

    def _local(self, scope: Any) -> Refusal | None:
        """No credential is required: a loopback client is ``LOCAL`` (its ``Caller``
        set), any other is refused."""
        gate: Gate = self.gate   # type: ignore[assignment]
        client = scope.get("client")
        address = client[0] if client else None
        local = self._local_callers.get(address)
        if local is None:
            if client and not self._loopback_client(address):
                return NOT_LOOPBACK
            local = gate.caller(LOCAL, address)
            if len(self._local_callers) < MEMO_KEPT:
                self._local_callers[address] = local
        scope[CALLER_KEY] = local
        return None

    def _offered_token(self, scope: Any, authorization: bytes | None,
                       protocols: bytes | None) -> Principal | object | None:
        """No credential is required, yet one is offered: the principal of the stored
        token offered when the cache knows it, ``MISS`` when only the store can tell,
        else ``None`` (what is offered is ignored, as with no token at all). So the
        first token made while the server runs (``token create`` on the store, which
        the server sees within ``TTL_S``) is its principal from its first use, never
        ``local``."""
        auth = self.gate.authenticator   # type: ignore[union-attr]
        offered = [_bearer(authorization)]
        if protocols is not None and scope["type"] == "websocket":
            offered += _protocol_credentials(protocols)
        for credential in offered:
            if credential is not None and parse_token(credential) is not None:
                found = auth.cached(credential)
                if found is not None:
                    return found
        return None

    def _authenticate(self, scope: Any, authorization: bytes | None,
                      protocols: bytes | None) -> Refusal | None:
        """The credential step: ``None`` (the ``Caller`` set), ``UNAUTHORIZED`` or
        ``LOOKUP``."""
        auth = self.gate.authenticator   # type: ignore[union-attr]
        if authorization is not None and len(authorization) >= 7 \
                and authorization[:7].lower() == b"bearer ":
            found = auth.cached(authorization[7:].strip())
        else:   # still compare, so a missing header costs what a wrong one does
            found = auth.cached(b"")
        if found is None and protocols is not None and scope["type"] == "websocket":
            for given in _protocol_credentials(protocols):
                found = auth.cached(given)
                if found is not None:
                    break
        if found is MISS:
            return LOOKUP
        if found is None:
            self._failed(scope, _bearer(authorization))
            return UNAUTHORIZED
        self._admit_as(scope, found)  # type: ignore[arg-type]
        return None

    def _admit_as(self, scope: Any, principal: Principal) -> None:
        """The request is ``principal``'s: its ``Caller`` (with the client's address)."""
        client = scope.get("client")
        scope[CALLER_KEY] = self.gate.caller(  # type: ignore[union-attr]
            principal, client[0] if client else None)

    def _credentials(self, scope: Any) -> list[bytes]:
        """Every credential the request offers: the bearer, then a WebSocket's."""
        found = []
        protocols = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                bearer = _bearer(value)
                if bearer is not None:
                    found.insert(0, bearer)
            elif name == b"sec-websocket-protocol" and scope["type"] == "websocket":
                protocols = value
        return found + (_protocol_credentials(protocols) if protocols is not None else [])

    def _guessing(self, scope: Any) -> Refusal | None:
        """``TOO_MANY_FAILURES`` (429, its wait) when the client, not on loopback, has
        used up its failed credentials (``Gate.failures``): its credential is then not
        even compared, so guessing a token runs at that rate, not the server's."""
        client = scope.get("client")
        if not client or self._loopback_client(client[0]):
            return None
        wait = self.gate.failures.waiting(str(client[0]), CREDENTIAL_FAILURE)  # type: ignore[union-attr]
        if wait is None:
            return None
        return dataclasses.replace(TOO_MANY_FAILURES, headers=(
            (b"retry-after", str(max(1, math.ceil(wait))).encode()),))

    def _failed(self, scope: Any, credential: bytes | None, reason: str | None = None) -> None:
        client = scope.get("client")
        gate: Gate = self.gate   # type: ignore[assignment]
        reason = reason or ("missing_credential" if not credential else "invalid_credential")
        gate.audit.auth_failed(
            client=str(client[0]) if client else None, reason=reason,
            path=scope.get("path", ""), token_id=public_id(credential) if credential else None)
        if reason != "missing_credential" and client \
                and not self._loopback_client(client[0]):   # a guess (``_guessing``)
            gate.failures.take(str(client[0]), CREDENTIAL_FAILURE)


def _bearer(value: bytes | None) -> bytes | None:
    if value is not None and len(value) >= 7 and value[:7].lower() == b"bearer ":
        return value[7:].strip()
    return None


def _protocol_credentials(value: bytes | None) -> list[bytes]:
    """The credential of the first ``qwen-bearer.*`` entry, if any (never echoed in the
    handshake's answer: ``acp_http.websocket.chosen_subprotocol``): one handshake costs
    at most two store reads (with ``Authorization``), not
    one per entry of a 64 KiB header."""
    for protocol in bearer_protocols(value)[:1]:
        encoded = protocol[len(BEARER_PROTOCOL):]
        try:
            return [base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))]
        except ValueError:
            return []
    return []


def bearer_protocols(value: bytes | None) -> list[str]:
    """The ``qwen-bearer.*`` entries of a ``Sec-WebSocket-Protocol`` value."""
    if not value:
        return []
    return [p.strip() for p in value.decode("latin-1").split(",")
            if p.strip().startswith(BEARER_PROTOCOL)]


__all__ = ["BEARER_PROTOCOL", "CORS_DENIED", "GuardPolicy", "LOOKUP", "OPEN_PATHS", "Refusal",
           "Renderer", "STORE_UNAVAILABLE", "UNAUTHORIZED", "bearer_protocols", "is_loopback", "is_self_origin", "split_host"]
