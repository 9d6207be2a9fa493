"""Connection guard below ASGI: a header timeout, a connection cap and head caps for uvicorn.

    stats = GuardStats()                 # one per server (the composition's), read by /daemon/status
    protocol = guarded_protocol(header_timeout_s=10.0, max_connections=2560,
                                max_header_bytes=65536, max_headers=100, max_request_line=8192,
                                stats=stats)
    uvicorn.Config(app, http=protocol, ...)
    raise_fd_limit()                   # soft RLIMIT_NOFILE -> hard, at start-up

Why here: uvicorn closes an idle keep-alive connection ``timeout_keep_alive`` after a
response, but a fresh connection (or one that sent half a request head) waits
forever, and its ``limit_concurrency`` answers 503 to *requests* (``/health``
included) while the idle sockets keep their file descriptors. Both happen before
the application (and its authentication) sees anything, so the guard is a subclass
of uvicorn's own HTTP protocol.

Contracts:

* A connection that has not sent a complete request head within
  ``header_timeout_s`` of being accepted, or of its previous response, once it
  starts a new one, is closed, at most ``header_timeout_s / SWEEPS`` later. The
  clock ends when the head is complete (the request then runs without a timeout of
  ours but its body's: ``body_clock``) or the connection is upgraded to a WebSocket. Between requests uvicorn's
  keep-alive timeout still applies. One timer per server sweeps the heads being
  received (``HeadDeadlines``): a timer per request cost ~2 µs on uvloop, about a
  tenth of a raw callable's whole request on uvicorn.
* Past ``max_connections`` live connections (HTTP and WebSocket, SSE streams
  included), a new connection is answered ``503`` (``Retry-After: 5``, ``Connection:
  close``) and closed: with HTTP/2 served, in the protocol its first bytes show
  (``h2_refusal``: HTTP/2 by prior knowledge gets its stream answered 503, then
  GOAWAY), else, or with too many refusals waiting, at once without reading it; it is
  counted in
  ``stats["connections"]`` (a header timeout in ``stats["header_timeouts"]``, a head
  over a cap in ``stats["oversized_heads"]``).
* A request head whose request line passes ``max_request_line`` bytes is answered
  ``414``, one with more than ``max_headers`` header lines or more than
  ``max_header_bytes`` bytes after its request line ``431`` (REST shape,
  ``Connection: close``), as soon as the bytes received show it, before the parser
  buffers more, and the connection is closed: a hostile head costs at most the cap in
  memory. The front layer checks the same caps exactly on the parsed request.
* A request asking to upgrade to ``h2c`` is answered in HTTP/1.1, one log line a process
  saying so (uvicorn warned on each), and a request pipelined after it in the same
  bytes is parsed and answered (httptools stopped at the upgrade: uvicorn dropped it).
* ``raise_fd_limit`` raises the soft file-descriptor limit to the hard one and
  returns it; ``connection_cap`` keeps the cap ``FD_RESERVE`` below that limit.
"""

from __future__ import annotations

import importlib.util
import logging
import resource
import sys
from typing import Any

log = logging.getLogger("acp_server.http")

SWEEPS = 8         # header-timeout sweeps per timeout: a head is cut at most 1/8 late
FD_RESERVE = 256   # descriptors left for the store, agents, logs and the listening socket
_REFUSAL_BODY = b'{"error":"Too many connections","code":"connection_limit"}'
_REFUSAL = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
            b"retry-after: 5\r\nconnection: close\r\ncontent-length: "
            + str(len(_REFUSAL_BODY)).encode() + b"\r\n\r\n" + _REFUSAL_BODY)


_h2c_told: list[bool] = []   # the h2c upgrade's one log line of the process was written


class GuardStats(dict[str, int]):
    """The guards' counters, one per server (made by the composition, handed to the
    guards that count and to ``/daemon/status`` that reports): ``connections``
    refused, ``header_timeouts``, ``oversized_heads``."""

    def __init__(self) -> None:
        super().__init__(connections=0, header_timeouts=0, oversized_heads=0)


class HeadDeadlines:
    """The heads being received on one server's connections, each with its deadline,
    and one timer that sweeps them (instead of a timer armed and cancelled per request).

        deadlines = HeadDeadlines(timeout_s=10.0)
        deadlines.arm(protocol, loop)      # a head starts: cut at loop.time() + 10 s
        deadlines.disarm(protocol)         # it is complete: forgotten
        # past the deadline: protocol._head_timeout() is called by the sweep

    Deadlines are kept in arming order, which is deadline order (one timeout for
    all), so a sweep looks at the expired ones and the next only. The sweep runs
    every ``timeout_s / SWEEPS`` while a head is pending, and stops when none is.
    """

    __slots__ = ("_pending", "_tick", "_timeout", "_timer")

    def __init__(self, timeout_s: float) -> None:
        self._timeout = timeout_s
        self._tick = max(timeout_s / SWEEPS, 0.01)
        self._pending: dict[Any, float] = {}
        self._timer: Any = None

    def __len__(self) -> int:
        return len(self._pending)

    def arm(self, protocol: Any, loop: Any) -> None:
        pending = self._pending
        pending.pop(protocol, None)   # re-armed: to the end, where its deadline belongs
        pending[protocol] = loop.time() + self._timeout
        if self._timer is None:
            self._timer = loop.call_later(self._tick, self._sweep, loop)

    def disarm(self, protocol: Any) -> None:
        self._pending.pop(protocol, None)

    def _sweep(self, loop: Any) -> None:
        self._timer = None
        now = loop.time()
        pending = self._pending
        expired = []
        for protocol, deadline in pending.items():
            if deadline > now:
                break
            expired.append(protocol)
        for protocol in expired:
            del pending[protocol]
            try:
                protocol._head_timeout()
            except Exception:   # one connection's close must not stop the sweeps
                log.exception("header timeout: closing a connection failed")
        if pending and self._timer is None:
            self._timer = loop.call_later(self._tick, self._sweep, loop)


def _answer(status: bytes, code: bytes, message: bytes) -> bytes:
    body = b'{"error":"' + message + b'","code":"' + code + b'"}'
    return (b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\nconnection: close"
            b"\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


LINE_TOO_LONG = _answer(b"414 URI Too Long", b"uri_too_long", b"Request line too long.")
HEAD_TOO_LARGE = _answer(b"431 Request Header Fields Too Large", b"header_fields_too_large",
                         b"Header fields too large.")


def raise_fd_limit() -> int:
    """Soft ``RLIMIT_NOFILE`` raised to the hard limit; the soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:   # some sandboxes refuse it
            log.warning("cannot raise the file-descriptor limit to %s: %s", target, exc)
    return int(soft) if soft != resource.RLIM_INFINITY else 1 << 20


def connection_cap(requested: int, fd_limit: int) -> int:
    """The cap in force: ``requested``, kept ``FD_RESERVE`` below the descriptor limit."""
    cap = min(requested, max(1, fd_limit - FD_RESERVE))
    if cap < requested:
        log.warning("--max-connections %s lowered to %s (file-descriptor limit %s)",
                    requested, cap, fd_limit)
    return cap


def _base_protocol() -> type:
    """uvicorn's ``http="auto"`` choice: httptools when installed, else h11."""
    if importlib.util.find_spec("httptools") is not None:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
        return HttpToolsProtocol
    from uvicorn.protocols.http.h11_impl import H11Protocol
    return H11Protocol


def guarded_protocol(*, header_timeout_s: float, max_connections: int,
                     max_header_bytes: int = 64 * 1024, max_headers: int = 100,
                     max_request_line: int = 8 * 1024, stats: GuardStats | None = None,
                     base: type | None = None, http2: Any = None) -> type:
    """An HTTP protocol class for ``uvicorn.Config(http=...)`` with the guards,
    counting in ``stats`` (a fresh ``GuardStats`` when none is given). With ``http2``
    (an ``http2.Http2Limits``) a connection whose first bytes are the HTTP/2 preface,
    or whose TLS handshake chose ``h2``, is handed to ``http2.Http2Connection``."""
    take_over: Any = None
    refusals: Any = None
    if http2 is not None:
        from acp_server.http.h2_machine import PREFACE, starts_http2
        from acp_server.http.h2_refusal import Refusals
        from acp_server.http.http2 import Http2Connection
        take_over = Http2Connection.take_over
        refusals = Refusals(http2, max_waiting=FD_RESERVE // 4)
    counts = stats if stats is not None else GuardStats()
    parent: Any = base or _base_protocol()
    deadlines = HeadDeadlines(header_timeout_s)
    head_bytes = max_header_bytes + 2 * max_headers   # the fields and their CRLFs
    # Data no longer than this holds a request line and fields within their caps; the
    # lines before the blank one that ends the head are then the header count.
    whole_head = min(max_request_line, head_bytes)

    class GuardedProtocol(parent):  # type: ignore[misc, valid-type]
        _refused = False
        _accepted = False
        _first = take_over is not None   # no byte seen yet, and HTTP/2 is served
        _start = b""                     # the first bytes, while they may be the preface
        _timing = False            # a head is being received (its deadline is in ``deadlines``)
        _waiting_for: Any = None   # the cycle in force when the head's clock started
        # The head being received: bytes of its request line (None once complete), of
        # the header lines after it, their count, and the last bytes (a split CRLF).
        _line: int | None = 0
        _fields = 0
        _lines = 0
        _tail = b""
        _fed = b""    # the bytes being parsed (httptools says where an upgrade stopped in them)
        _rest = b""   # what followed a request asking for h2c in them, parsed next
        _feeding = False   # ``_feed_rest``'s loop runs: the calls inside it leave it the rest

        def connection_made(self, transport: Any) -> None:
            if len(self.connections) >= max_connections:
                self._refused = True
                counts["connections"] += 1
                if refusals is None or not refusals.refuse(transport, self.loop):
                    transport.write(_REFUSAL)
                    transport.close()
                return
            super().connection_made(transport)
            self._accepted = True
            if self._first and (tls := transport.get_extra_info("ssl_object")) is not None \
                    and tls.selected_alpn_protocol() == "h2":
                take_over(self, b"", http2, counts)
                return
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._refused and not self._accepted:
                return
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return
            if self._first:   # HTTP/2 by prior knowledge?
                start = self._start + data
                if starts_http2(start):
                    if len(start) < len(PREFACE):   # the head's deadline still runs
                        self._start = start
                        return
                    self._disarm()
                    take_over(self, start, http2, counts)
                    return
                self._first, self._start, data = False, b"", start
            if not self._timing and (self.cycle is None or self.cycle.response_complete):
                # A new request starts after a response. Its whole head at once, within
                # every cap (the common case): nothing to time or measure further.
                if len(data) <= whole_head and (end := data.find(b"\r\n\r\n")) >= 0 \
                        and data.count(b"\n", 0, end) <= max_headers:
                    self._fed = data
                    super().data_received(data)
                    self._fed = b""
                    if self._rest and not self._feeding:
                        self._feed_rest()
                    return
                self._arm()   # else its head is timed and measured as it comes
            if self._timing:
                answer = self._measure(data)
                if answer is not None:
                    counts["oversized_heads"] += 1
                    self._disarm()
                    self.transport.write(answer)
                    self.transport.close()
                    self._refused = True
                    return
            self._fed = data
            super().data_received(data)
            self._fed = b""
            if self._timing and (
                    self.cycle is not self._waiting_for
                    or self.transport.get_protocol() is not self):
                self._disarm()   # the head is complete, or the connection was upgraded
            if self._rest and not self._feeding:
                self._feed_rest()

        def _feed_rest(self) -> None:
            """What followed a request asking for h2c, in the bytes received with it
            (a pipelined request): httptools stopped at the upgrade and uvicorn dropped
            it; parsed now, as any other bytes. In a loop, each rest after the last (a
            write of 1,500 pipelined upgrades nested as deep passed the recursion limit)."""
            self._feeding = True
            try:
                while self._rest and not self.transport.is_closing():
                    rest, self._rest = self._rest, b""
                    self.data_received(rest)
            finally:
                self._feeding = False
                self._rest = b""

        def _measure(self, data: bytes) -> bytes | None:
            """The refusal when the head so far passes a cap, else None."""
            if self._line == 0 and not self._tail:   # a head's first bytes
                end = data.find(b"\r\n\r\n")
                if end >= 0:   # and the whole head: measured without copies
                    newline = data.find(b"\n")
                    if newline > max_request_line:
                        return LINE_TOO_LONG
                    self._line, self._tail = None, data[-3:]
                    self._fields = end + 3 - newline
                    self._lines = data.count(b"\n", newline + 1, end + 4)
                    if self._fields > head_bytes or self._lines > max_headers + 1:
                        return HEAD_TOO_LARGE
                    return None
            seen = self._tail + data
            end = seen.find(b"\r\n\r\n")
            part = data if end < 0 else data[:max(0, end + 4 - len(self._tail))]
            self._tail = seen[-3:]
            if self._line is not None:
                newline = part.find(b"\n")
                if newline < 0:
                    self._line += len(part)
                    return LINE_TOO_LONG if self._line > max_request_line else None
                if self._line + newline > max_request_line:
                    return LINE_TOO_LONG
                self._line = None
                part = part[newline + 1:]
            self._fields += len(part)
            self._lines += part.count(b"\n")
            if self._fields > head_bytes or self._lines > max_headers + 1:
                return HEAD_TOO_LARGE
            return None

        def _unsupported_upgrade_warning(self) -> None:
            """``Upgrade: h2c`` (curl's ``--http2`` on http://) is answered in HTTP/1.1
            (RFC 9113 3.1: h2c by prior knowledge only): said once a process, not
            uvicorn's warning on every such request; other upgrades keep it."""
            if self._get_upgrade() != b"h2c":
                super()._unsupported_upgrade_warning()
                return
            stopped = sys.exc_info()[1]   # httptools' HttpParserUpgrade: where it stopped
            if stopped is not None and stopped.args and isinstance(stopped.args[0], int):
                self._rest = self._fed[stopped.args[0]:]
            if not _h2c_told:
                _h2c_told.append(True)
                log.info("HTTP/1.1 requests asking to upgrade to h2c are answered in "
                         "HTTP/1.1 (HTTP/2 is served by prior knowledge and by ALPN)")

        def _arm(self) -> None:
            self._line, self._fields, self._lines, self._tail = 0, 0, 0, b""
            self._waiting_for = self.cycle
            self._timing = True
            deadlines.arm(self, self.loop)

        def _disarm(self) -> None:
            if self._timing:
                self._timing = False
                deadlines.disarm(self)

        def _head_timeout(self) -> None:
            self._timing = False
            if self.transport.is_closing() or self.transport.get_protocol() is not self:
                return
            counts["header_timeouts"] += 1
            self.transport.close()

    GuardedProtocol.deadlines = deadlines   # type: ignore[attr-defined]
    GuardedProtocol.__name__ = f"Guarded{parent.__name__}"
    return GuardedProtocol


__all__ = ["FD_RESERVE", "GuardStats", "HeadDeadlines", "connection_cap", "guarded_protocol", "raise_fd_limit"]
