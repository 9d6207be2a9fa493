"""Typed errors raised by ``acp_server.client``.

    try:
        await client.prompt(session_id, "hello")
    except DaemonPendingPromptLimitError as exc:     # local cap, or the server's 503
        print(exc.session_id, exc.pending_count, exc.limit)
    except DaemonForbiddenError as exc:              # 403: a scope the token lacks
        print(exc.required_scope)
    except DaemonHttpError as exc:                   # any other non-2xx answer
        print(exc.status, exc.code, exc.body)

Contracts: every error derives from ``DaemonError``. ``DaemonPendingPromptLimitError``
takes ``(session_id, limit, pending_count)`` in that order (the SDK's order, not the
bridge's). ``DaemonHttpError.body`` is the decoded JSON body when it was JSON, else
the text (possibly empty; at most ``bounded.MAX_ERROR_BYTES`` of it was read); 401, 403
and the rate limits' 429 are its subclasses ``DaemonUnauthorizedError``,
``DaemonForbiddenError``, ``DaemonRateLimitError``. A text body's message is one line
of at most 200 characters: an HTML page's ``<title>`` (else its text), then ``(a TYPE
answer)``. A redirect (3xx) is never followed: it is ``DaemonHttpError`` "redirected to
LOCATION (not followed)", so the bearer token never goes to another address. The SDK
retries no call by itself (a 429 or 503 is raised at once, ``Retry-After`` not
waited), but a prompt, sent again under its id when a fleet instance answered
``owner_lost`` or ``owner_unreachable`` (``daemon.RESEND_CODES``) or when its send
got no answer (``daemon.DaemonClient._send_prompt``; not after a failure the next
send would repeat: ``lasting_failure``): the last send's error is raised. ``retry_after_s`` is the server's ``retryAfterMs`` in seconds, ``inf`` when
it is too large for a float (a full queue's, else its ``Retry-After`` seconds; ``None``
when the server gave neither, or the cap was the SDK's own). ``one_line`` is how the CLIs print any message: one line,
no control characters (a server's text cannot move the cursor or colour the terminal).
No message shows the credentials of the daemon's address (``--url
http://user:secret@host/?token=…``): ``redact`` hides them wherever an address is put
in a message (the SDK's errors, ``one_line``, the conformance runner's lines and
reports).
"""

from __future__ import annotations

import math
import re
import socket
import ssl
from collections.abc import Mapping
from typing import Any

import httpx
import msgspec

_BREAK = re.compile(r"[\t\n\v\f\r\x85\u2028\u2029]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.IGNORECASE | re.DOTALL)
_TAG = re.compile(r"<[^>]*>")
_JSON = msgspec.json.Decoder()
# An address's userinfo (``user:password@``, up to the authority's last ``@``), and the
# value of a query parameter whose name says it is a credential.
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/?#\s]*@")
_SECRET_PARAM = re.compile(
    r"(?i)([?&;][^=&;#\s]*(?:token|key|secret|passw|pwd|auth|sig|credential)[^=&;#\s]*=)"
    r"[^&;#\s]*")


def redact(text: str) -> str:
    """``text`` with the credentials of every address in it hidden: its userinfo
    (``http://user:secret@host`` → ``http://***@host``) and the values of token-like
    query parameters (``?token=…``, ``api_key``, ``password``, … → ``=***``)."""
    return _SECRET_PARAM.sub(r"\1***", _USERINFO.sub(r"\1***@", text))


def redact_address(value: str) -> str:
    """``value``, given as an address (a flag's, a variable's), with its credentials
    hidden as ``redact`` hides them, also when it has no scheme (``alice:s3cret@host``
    → ``***@host``: ``redact`` leaves a bare ``user@host`` in prose alone)."""
    if "://" not in value:
        authority, slash, rest = value.partition("/")
        if "@" in authority:
            value = "***@" + authority.rpartition("@")[2] + slash + rest
    return redact(value)


def one_line(text: str, limit: int = 1000) -> str:
    """``text`` as one printable line: line breaks become spaces, other control
    characters (an escape sequence's ESC, a bell) are dropped, runs of whitespace are
    one space, credentials in addresses are hidden (``redact``); past ``limit``
    characters it is cut, ending in ``…``."""
    line = redact(" ".join(_CONTROL.sub("", _BREAK.sub(" ", text)).split()))
    return line if len(line) <= limit else line[:limit - 1] + "…"


def text_summary(text: str, content_type: str | None = None) -> str:
    """What a non-JSON answer says, in a line: an HTML page's title, else its text."""
    title = _TITLE.search(text)
    summary = one_line(_TAG.sub(" ", title.group(1) if title else text), 200)
    kind = (content_type or "").partition(";")[0].strip().lower()
    if kind and "json" not in kind:
        return f"{summary} (a {one_line(kind, 60)} answer)" if summary else f"a {kind} answer"
    return summary


def retry_seconds(milliseconds: Any) -> float | None:
    """A ``retryAfterMs`` in seconds: ``None`` when it is not a number of 0 or more,
    ``inf`` when it is too large for a float."""
    if isinstance(milliseconds, bool) or not isinstance(milliseconds, int | float):
        return None
    try:
        seconds = milliseconds / 1000
    except OverflowError:
        return math.inf
    return seconds if seconds >= 0 else None


class DaemonError(Exception):
    """Base class of every client error."""


class DaemonPendingPromptLimitError(DaemonError):
    """The session's pending prompts are at the cap.

    Raised locally (no request was sent) or mapped from a server 503
    ``prompt_queue_full`` (then the values are the server's)."""

    def __init__(self, session_id: str, limit: int, pending_count: int,
                 retry_after_s: float | None = None) -> None:
        self.session_id = session_id
        self.limit = limit
        self.pending_count = pending_count
        self.retry_after_s = retry_after_s   # the server's retryAfterMs or Retry-After
        super().__init__(f'Pending prompts full: "{session_id}" ({pending_count}/{limit})')

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.session_id, self.limit, self.pending_count,
                             self.retry_after_s))


class DaemonHttpError(DaemonError):
    """A non-2xx answer. ``code`` and ``message`` are read from a JSON error body
    (``{"error": …, "code": …}``) when there is one."""

    def __init__(self, status: int, body: Any, message: str | None = None) -> None:
        self.status = status
        self.body = body
        fields = body if isinstance(body, dict) else {}
        code = fields.get("code")
        self.code: str | None = None if code is None else str(code)
        text = message or fields.get("error") or fields.get("message")
        if not text:
            text = text_summary(body) if isinstance(body, str) else ""
            text = text or f"HTTP {status}"
        self.message = str(text)
        suffix = f" ({self.code})" if self.code else ""
        super().__init__(f"HTTP {status}: {self.message}{suffix}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.status, self.body, self.message))


class DaemonUnauthorizedError(DaemonHttpError):
    """401: no credential, or one the server refused (unknown, wrong, revoked or
    expired: the server does not say which)."""


class DaemonForbiddenError(DaemonHttpError):
    """403: the credential lacks a scope (``required_scope``: ``read``, ``prompt`` or
    ``admin``), or the server refused the client (its Origin, or a non-loopback
    client of a server without credentials)."""

    @property
    def required_scope(self) -> str | None:
        scope = self.body.get("requiredScope") if isinstance(self.body, dict) else None
        return scope if isinstance(scope, str) else None


class DaemonRateLimitError(DaemonHttpError):
    """429 ``rate_limit_exceeded``: this credential's rate limit for ``tier``
    (``prompt``, ``mutation``, ``read``); retry after ``retry_after_s``."""

    @property
    def tier(self) -> str | None:
        tier = self.body.get("tier") if isinstance(self.body, dict) else None
        return tier if isinstance(tier, str) else None

    @property
    def retry_after_s(self) -> float | None:
        return retry_seconds(self.body.get("retryAfterMs") if isinstance(self.body, dict)
                             else None)


def hint(status: int, required_scope: str | None = None) -> str:
    """What a person should do about a 401 / 403 (the CLIs print it), else ``""``."""
    if status == 401:
        return " (check --token / $ACP_SERVER_TOKEN: missing, wrong, revoked or expired)"
    if status == 403 and required_scope:
        return f" (ask an admin for a token with the {required_scope!r} scope)"
    return ""


class DaemonTurnError(DaemonHttpError):
    """A prompt's turn ended with ``turn_error``; ``body`` is the event's data
    (``{sessionId, message, code, promptId}``), ``status`` is 500 as in the peer SDK."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.prompt_id: str | None = data.get("promptId")
        self.session_id: str | None = data.get("sessionId")
        super().__init__(500, data, str(data.get("message") or "Prompt failed"))
        if self.code is None:
            self.code = "turn_error"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.body,))


class DaemonStreamEndedError(DaemonError):
    """The event stream ended before the awaited turn's terminal event."""


class DaemonStreamError(DaemonError):
    """The event stream dropped and could not be resumed within the retry budget."""


class DaemonProtocolError(DaemonError):
    """An answer could not be parsed, or broke the protocol (e.g. a session id the
    server did not honour)."""


class DaemonSessionIdProtocolError(DaemonProtocolError):
    def __init__(self, requested: str, returned: str) -> None:
        self.requested = requested
        self.returned = returned
        super().__init__(f"Daemon returned session {returned!r}, requested {requested!r}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.requested, self.returned))


class DaemonConnectionError(DaemonError):
    """The request could not be sent or its answer not received (``__cause__`` is the
    ``httpx`` error). Made by ``from_transport``: ``cannot reach URL: connection
    refused`` when no connection was made, else ``METHOD PATH failed: REASON``."""

    @classmethod
    def from_transport(cls, exc: httpx.TransportError, base_url: str, method: str,
                       path: str) -> DaemonConnectionError:
        reason = transport_reason(exc)
        if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
            return cls(f"cannot reach {redact(base_url.rstrip('/'))}: {reason}")
        return cls(redact(f"{method} {path} failed: {reason}"))


def transport_reason(exc: BaseException) -> str:
    """Why a connection failed, in a few words (``connection refused``, ``name not
    resolved``, ``timed out``, ``certificate verify failed: …``, ``TLS handshake failed:
    …``), read from the causes under an ``httpx`` error (whose own message is often ``All
    connection attempts failed``), exception groups included."""
    chain = _causes(exc)
    for seen in chain:
        if isinstance(seen, socket.gaierror):
            return "name not resolved"
        if isinstance(seen, ConnectionRefusedError):
            return "connection refused"
        if isinstance(seen, (TimeoutError, httpx.TimeoutException)):
            return "timed out"
        if isinstance(seen, ssl.SSLCertVerificationError):
            return f"certificate verify failed: {seen.verify_message or seen.reason}"
        if isinstance(seen, ssl.SSLError) and not isinstance(seen, _PASSING_TLS):
            return f"TLS handshake failed: {_tls_reason(seen)}"
    for seen in chain:
        if isinstance(seen, httpx.RemoteProtocolError):
            return str(seen).lower() or "the server closed the connection"
        if isinstance(seen, OSError) and seen.strerror:
            return seen.strerror.lower()
    return str(exc) or type(exc).__name__


def lasting_failure(exc: BaseException) -> bool:
    """A connection failed in a way the next try would repeat, so nothing is tried
    again: a name the resolver says does not exist (not its ``EAI_AGAIN``, a resolver
    out of reach), a certificate that does not verify, a TLS handshake refused (``wrong
    version number``: https to a plain HTTP port, no protocol or cipher in common).
    A refused or reset connection, a TLS handshake cut short, a timeout are not."""
    for seen in _causes(exc):
        if isinstance(seen, socket.gaierror):
            return seen.errno != socket.EAI_AGAIN
        if isinstance(seen, ssl.SSLError):
            return not isinstance(seen, _PASSING_TLS)
    return False


# TLS errors of a connection cut during its handshake (a restart, a dropped network).
_PASSING_TLS = (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLSyscallError,
                ssl.SSLWantReadError, ssl.SSLWantWriteError)


def _tls_reason(exc: ssl.SSLError) -> str:
    if exc.reason:
        return exc.reason.lower().replace("_", " ")
    return (exc.strerror or str(exc)).lower()


def _causes(exc: BaseException) -> list[BaseException]:
    """``exc`` and what lies under it (causes, contexts, exception groups' members),
    breadth first, at most 50."""
    chain: list[BaseException] = []
    todo: list[BaseException] = [exc]
    while todo and len(chain) < 50:
        seen = todo.pop(0)
        chain.append(seen)
        if isinstance(seen, BaseExceptionGroup):
            todo.extend(seen.exceptions)
        todo.extend(e for e in (seen.__cause__, seen.__context__) if e is not None)
    return chain


def error_from_status(status: int, body: Any, session_id: str | None = None,
                      message: str | None = None) -> DaemonError:
    """The error for a non-2xx answer: a 503 ``prompt_queue_full`` becomes
    ``DaemonPendingPromptLimitError`` with the server's values; anything else
    ``DaemonHttpError``."""
    if status == 503 and isinstance(body, dict) and body.get("code") == "prompt_queue_full":
        sid = body.get("sessionId")
        return DaemonPendingPromptLimitError(
            sid if isinstance(sid, str) else (session_id or ""),
            _int(body.get("limit")), _int(body.get("pendingCount")))
    kind = {401: DaemonUnauthorizedError, 403: DaemonForbiddenError,
            429: DaemonRateLimitError}.get(status, DaemonHttpError)
    if kind is DaemonRateLimitError and not (isinstance(body, dict)
                                             and body.get("code") == "rate_limit_exceeded"):
        kind = DaemonHttpError   # the subscriber cap's 429, say
    return kind(status, body, message)


def redirect_detail(headers: Mapping[str, str]) -> str:
    """What a redirect answer is said to be: where it pointed, never followed."""
    where = one_line(headers.get("location", ""), 200) or "nowhere"
    return f"redirected to {where} (not followed)"


def decode_body(content: bytes) -> Any:
    """An error body: its JSON when it is JSON, else its text."""
    try:
        return _JSON.decode(content) if content else None
    except (msgspec.DecodeError, RecursionError):   # not JSON, or nested too deep
        return content.decode("utf-8", "replace")


def error_from_answer(status: int, content: bytes, headers: Mapping[str, str],
                      session_id: str | None = None) -> DaemonError:
    """The error for a read non-2xx answer (``error_from_status``): a redirect says where
    it pointed (not followed); a text body (a proxy's page) is summed up in a line."""
    body = decode_body(content)
    if 300 <= status < 400:
        return DaemonHttpError(status, body, redirect_detail(headers))
    message = text_summary(body, headers.get("content-type")) if isinstance(body, str) else None
    error = error_from_status(status, body, session_id, message or None)
    if isinstance(error, DaemonPendingPromptLimitError):
        given = body.get("retryAfterMs") if isinstance(body, dict) else None
        error.retry_after_s = retry_seconds(given)
        header = headers.get("retry-after", "").strip()
        if error.retry_after_s is None and header.isascii() and header.isdigit():
            error.retry_after_s = float(header) if len(header) < 10 else math.inf
    return error


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
