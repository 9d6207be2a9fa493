"""Bridge errors → the peer's HTTP answers (``qwen serve`` 0.24.4 ``sendBridgeError``).

    try:
        ticket = bridge.send_prompt(session_id, prompt)
    except BridgeError as exc:
        return error_response(exc)        # 503 + Retry-After: 5 for a full queue

Contracts:

* Every error body is a JSON object with ``error`` (a message) and, where the peer
  has one, ``code`` plus the extra fields of its table; ``Retry-After: 5`` on the
  retryable 503/429 answers.
* ``RestError`` is raised by the route layer itself (validation) and carries its own
  status, body and headers.
* ``StoreUnavailableError`` (``acp_server.store``) is a 503 ``{error, code:
  "store_unavailable"}`` with ``Retry-After``.
* Anything unrecognised is a 500 ``{"error": "Internal error"}``: no message from an
  unexpected exception reaches the client.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import msgspec
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from acp_server.http.body import ClientDisconnected
from acp_server.http.handlers import handle_disconnect
from acp_server.http.policy import Refusal
from acp_server.store.errors import StoreUnavailableError
from bridge.errors import (
    AgentDiedError,
    AgentError,
    AgentTimeoutError,
    BridgeError,
    InvalidDeadlineError,
    InvalidPromptError,
    NotSupportedError,
    PermissionNotFoundError,
    PromptDeadlineExceededError,
    SessionClosedError,
)

RETRY_AFTER = {"Retry-After": "5"}
_encoder = msgspec.json.Encoder()


class RestError(Exception):
    """An error answer decided by the route layer."""

    def __init__(self, status: int, body: dict[str, Any],
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(body.get("error", ""))
        self.status = status
        self.body = body
        self.headers = headers


def json_response(status: int, body: Any, headers: Mapping[str, str] | None = None) -> Response:
    return Response(_encoder.encode(body), status, headers, "application/json")


def bad_request(message: str, code: str | None = None, **extra: Any) -> RestError:
    body: dict[str, Any] = {"error": message}
    if code is not None:
        body["code"] = code
    body.update(extra)
    return RestError(400, body)


PROMPT_REQUIRED = "`prompt` is required and must be a non-empty array of content blocks"
RETRY_STATUSES = frozenset({429, 503})


def _permission_not_found(exc: Any) -> dict[str, Any]:
    if exc.session_id is None:  # the legacy route
        return {"error": "No pending permission request", "requestId": exc.request_id}
    return {"error": "No pending permission request for session",
            "sessionId": exc.session_id, "requestId": exc.request_id}


def _short(exc: Any) -> dict[str, Any]:
    return {"error": str(exc), "code": exc.code}


# The bodies that differ from {"error": message, "code": code, **details()}, by the
# error's exact class.
BODIES: dict[type[BridgeError], Callable[[Any], dict[str, Any]]] = {
    SessionClosedError: lambda exc: {"error": str(exc), "code": "session_closing",
                                     "sessionId": exc.session_id},
    PermissionNotFoundError: _permission_not_found,
    InvalidPromptError: lambda exc: {"error": PROMPT_REQUIRED},
    InvalidDeadlineError: lambda exc: {"error": "`deadlineMs` must be a positive integer "
                                                "(milliseconds)", "code": exc.code},
    AgentTimeoutError: lambda exc: {"error": str(exc), "code": exc.code, "errorKind": exc.code,
                                    "retryable": True, **exc.details()},
    NotSupportedError: lambda exc: {"error": str(exc) or "Not supported", "code": exc.code},
    AgentError: lambda exc: {"error": "Internal error", "code": exc.rpc_code, "data": exc.data},
    AgentDiedError: _short,
    PromptDeadlineExceededError: _short,
}


def describe(exc: BaseException) -> tuple[int, dict[str, Any], dict[str, str] | None]:
    """Status, body and headers for an error raised by the bridge or a route;
    ``Retry-After: 5`` on 429 and 503."""
    if isinstance(exc, RestError):
        return exc.status, exc.body, exc.headers
    if isinstance(exc, StoreUnavailableError):
        return 503, {"error": "The store is unavailable; retry later", "code": exc.code}, \
            {"Retry-After": str(exc.retry_after)}
    if not isinstance(exc, BridgeError):
        return 500, {"error": "Internal error"}, None
    special = BODIES.get(type(exc))
    body = special(exc) if special is not None else {"error": str(exc), "code": exc.code,
                                                      **exc.details()}
    status = exc.http_status
    return status, body, RETRY_AFTER if status in RETRY_STATUSES else None


def error_response(exc: BaseException) -> Response:
    status, body, headers = describe(exc)
    return json_response(status, body, headers)


# -- Starlette exception handlers ----------------------------------------------------------
def render_refusal(refusal: Refusal) -> tuple[bytes, bytes]:
    """The front layer's refusals in this door's shape: the peer's own bytes where
    ``qwen serve`` has them (401, the CORS 403), else ``{"error", "code"}``."""
    if refusal.peer_body is not None:
        return b"application/json", refusal.peer_body
    return b"application/json", _encoder.encode({"error": refusal.message, "code": refusal.code,
                                                 **dict(refusal.extra)})


async def handle_error(request: Request, exc: Exception) -> Response:
    return error_response(exc)


async def handle_unexpected(request: Request, exc: Exception) -> Response:
    # Starlette's ServerErrorMiddleware calls this, then re-raises so the server logs it.
    return error_response(exc)


async def handle_http(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return json_response(exc.status_code, {"error": exc.detail}, exc.headers)


EXCEPTION_HANDLERS: dict[Any, Any] = {
    ClientDisconnected: handle_disconnect,
    ClientDisconnect: handle_disconnect,
    RestError: handle_error,
    BridgeError: handle_error,
    StoreUnavailableError: handle_error,
    HTTPException: handle_http,
    Exception: handle_unexpected,
}
