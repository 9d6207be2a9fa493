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
* Anything unrecognised is a 500 ``{"error": "Internal error"}``: no message from an
  unexpected exception reaches the client.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from acp_server.http.body import ClientDisconnected
from acp_server.http.handlers import handle_disconnect
from bridge.bridge import InvalidPromptError, TooManyContentBlocksError
from bridge.errors import (
    AgentDiedError,
    AgentNotFoundError,
    AgentError,
    AgentTimeoutError,
    BranchWhilePromptActiveError,
    BridgeError,
    InvalidClientIdError,
    InvalidOptionError,
    InvalidPermissionOptionError,
    NotSupportedError,
    PermissionNotFoundError,
    PromptCancelledError,
    PromptNotFoundError,
    PromptQueueFullError,
    SessionClosedError,
    SessionIdNotHonoredError,
    SessionLimitExceededError,
    SessionNotFoundError,
    SubscriberLimitExceededError,
    WorkspaceMismatchError,
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


def describe(exc: BaseException) -> tuple[int, dict[str, Any], dict[str, str] | None]:
    """Status, body and headers for an error raised by the bridge or a route."""
    if isinstance(exc, RestError):
        return exc.status, exc.body, exc.headers
    if isinstance(exc, PromptQueueFullError):  # the body is exactly these five keys
        return 503, {"error": str(exc), "code": exc.code, "sessionId": exc.session_id,
                     "limit": exc.limit, "pendingCount": exc.pending_count}, RETRY_AFTER
    if isinstance(exc, SessionNotFoundError):
        return 404, {"error": str(exc), "code": exc.code, "sessionId": exc.session_id}, None
    if isinstance(exc, SessionClosedError):
        return 404, {"error": str(exc), "code": "session_closing",
                     "sessionId": exc.session_id}, None
    if isinstance(exc, WorkspaceMismatchError):
        return 400, {"error": str(exc), "code": exc.code, "boundWorkspace": exc.bound_workspace,
                     "requestedWorkspace": exc.requested_workspace}, None
    if isinstance(exc, SessionLimitExceededError):
        return 503, {"error": str(exc), "code": exc.code, "limit": exc.limit,
                     "scope": exc.scope}, RETRY_AFTER
    if isinstance(exc, SubscriberLimitExceededError):
        return 429, {"error": str(exc), "code": exc.code, "limit": exc.limit}, RETRY_AFTER
    if isinstance(exc, BranchWhilePromptActiveError):
        return 409, {"error": str(exc), "code": exc.code, "sessionId": exc.session_id}, None
    if isinstance(exc, InvalidClientIdError):
        return 400, {"error": str(exc), "code": exc.code, "sessionId": exc.session_id,
                     "clientId": exc.client_id}, None
    if isinstance(exc, InvalidPermissionOptionError):
        return 400, {"error": str(exc), "code": exc.code, "requestId": exc.request_id,
                     "optionId": exc.option_id}, None
    if isinstance(exc, PermissionNotFoundError):
        if exc.session_id is None:  # the legacy route
            return 404, {"error": "No pending permission request",
                         "requestId": exc.request_id}, None
        return 404, {"error": "No pending permission request for session",
                     "sessionId": exc.session_id, "requestId": exc.request_id}, None
    if isinstance(exc, PromptNotFoundError):
        return 404, {"error": str(exc), "code": exc.code, "sessionId": exc.session_id,
                     "promptId": exc.prompt_id}, None
    if isinstance(exc, AgentNotFoundError):
        return 400, {"error": str(exc), "code": exc.code, "agent": exc.name,
                     "available": exc.available}, None
    if isinstance(exc, TooManyContentBlocksError):
        return 400, {"error": str(exc), "code": exc.code, "limit": exc.limit}, None
    if isinstance(exc, InvalidPromptError):
        return 400, {"error": "`prompt` is required and must be a non-empty array of content blocks"}, None
    if isinstance(exc, AgentTimeoutError):
        return 504, {"error": str(exc), "code": exc.code, "errorKind": exc.code,
                     "retryable": True, "phase": exc.phase, "timeoutMs": exc.timeout_ms}, None
    if isinstance(exc, NotSupportedError):
        return 501, {"error": str(exc) or "Not supported", "code": exc.code}, None
    if isinstance(exc, SessionIdNotHonoredError):
        return 500, {"error": str(exc), "code": exc.code, "requestedSessionId": exc.requested,
                     "sessionId": exc.actual}, None
    if isinstance(exc, AgentError):
        return 500, {"error": "Internal error", "code": exc.rpc_code, "data": exc.data}, None
    if isinstance(exc, AgentDiedError):
        return 500, {"error": str(exc), "code": exc.code}, None
    if isinstance(exc, PromptCancelledError):
        return 409, {"error": str(exc), "code": exc.code}, None
    if isinstance(exc, InvalidOptionError):
        return 400, {"error": str(exc), "code": exc.code}, None
    if isinstance(exc, BridgeError):
        return 500, {"error": str(exc), "code": exc.code}, None
    return 500, {"error": "Internal error"}, None


def error_response(exc: BaseException) -> Response:
    status, body, headers = describe(exc)
    return json_response(status, body, headers)


# -- Starlette exception handlers ----------------------------------------------------------
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
    InvalidPromptError: handle_error,
    HTTPException: handle_http,
    Exception: handle_unexpected,
}
