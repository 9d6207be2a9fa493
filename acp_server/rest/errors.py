"""Bridge errors → the peer's HTTP answers (``qwen serve`` 0.24.4 ``sendBridgeError``).

    try:
        ticket = bridge.send_prompt(session_id, prompt)
    except BridgeError as exc:
        return error_response(exc)        # 503 + Retry-After: 5 for a full queue

Contracts:

* The status of a bridge error is ``STATUS``'s, looked up along the error's MRO (the
  peer's status for it); an error not in the table is a 500. Where the peer answers
  500 for an agent that is gone (``AgentDiedError``: it died as it was asked, and
  again when asked anew; ``AgentUnavailableError``: it could not be started or did
  not complete ``initialize``) this door answers 503 with ``Retry-After: 5``: the
  next request starts the agent anew. An agent's own JSON-RPC error stays the
  peer's 500.
* Every error body is a JSON object with ``error`` (a message) and, where the peer
  has one, ``code`` plus the error's fields under the peer's names
  (``bridge.wire.error_details``) or the body of ``BODIES``; ``Retry-After: 5`` on the
  retryable 503/429 answers.
* ``RestError`` is raised by the route layer itself (validation) and carries its own
  status, body and headers.
* ``StoreUnavailableError`` (``acp_server.store``) and the bridge's
  ``JournalUnavailableError`` (the session journal's commit failed) are a 503 ``{error, code:
  "store_unavailable"}`` with ``Retry-After``; ``SessionMovedError`` (the commit was
  refused: another instance took the session over) the same with ``code:
  "session_moved"`` and ``Retry-After: 1``. A write the store refused for good (an
  engine's own error, ``store.errors.ENGINE_ERRORS``: a constraint, a trigger) is
  answered the same as an outage, and logged with the database's first line.
* Anything unrecognised is a 500 ``{"error": "Internal error"}``: no message from an
  unexpected exception reaches the client; it is logged with its traceback.
* Starlette's own ``HTTPException`` is ``{"error": <its detail>}`` with its status,
  except the 404 of a ``GET /workspace/{a/b}/sessions``: qwen's listing takes its
  ``:id`` decoded, so an id with a ``/`` in it (``rel%2Fx``) is its 400 ``NOT_AN_ID``
  there, not an unknown path (``rest.workspace``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from acp_server.http.body import ClientDisconnected
from acp_server.http.handlers import handle_disconnect, request_line
from acp_server.http.policy import Refusal
from acp_server.store.errors import (
    ENGINE_ERRORS,
    RETRY_AFTER_S,
    StoreUnavailableError,
    first_line,
)
from bridge import errors as be
from bridge.elicitation import ElicitationNotFoundError, InvalidElicitationAnswerError
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
from bridge.wire import error_details

log = logging.getLogger("acp_server.rest")
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


encode_body = _encoder.encode   # ``json_response``'s body bytes


def bad_request(message: str, code: str | None = None, **extra: Any) -> RestError:
    body: dict[str, Any] = {"error": message}
    if code is not None:
        body["code"] = code
    body.update(extra)
    return RestError(400, body)


PROMPT_REQUIRED = "`prompt` is required and must be a non-empty array of content blocks"
RETRY_STATUSES = frozenset({429, 503})

# The HTTP status of each bridge error (the peer's), looked up along the error's MRO.
STATUS: dict[type[BridgeError], int] = {
    be.InvalidOptionError: 400,
    be.SessionNotFoundError: 404,
    be.SessionLimitExceededError: 503,
    be.PromptQueueFullError: 503,
    be.BranchWhilePromptActiveError: 409,
    be.WorkspaceMismatchError: 400,
    be.InvalidClientIdError: 400,
    be.SubscriberLimitExceededError: 429,
    be.PermissionNotFoundError: 404,
    be.InvalidPermissionOptionError: 400,
    be.PromptNotFoundError: 404,
    be.AgentNotFoundError: 400,
    be.NotSupportedError: 501,
    be.PromptCancelledError: 409,
    be.SessionClosedError: 404,
    be.AgentTimeoutError: 504,
    be.AgentDiedError: 503,
    be.AgentUnavailableError: 503,
    be.AgentProtocolError: 502,
    be.InvalidPromptError: 400,
    be.InvalidDeadlineError: 400,
    be.PromptIdInUseError: 409,
    be.JournalUnavailableError: 503,
    be.SessionNotRestorableError: 409,
    be.ServerRestartedError: 503,
    ElicitationNotFoundError: 404,
    InvalidElicitationAnswerError: 400,
}


def status_of(exc: BridgeError) -> int:
    """The HTTP status of a bridge error: ``STATUS``'s, else 500."""
    for cls in type(exc).__mro__:
        status = STATUS.get(cls)
        if status is not None:
            return status
    return 500


def _permission_not_found(exc: Any) -> dict[str, Any]:
    if exc.session_id is None:  # the legacy route
        return {"error": "No pending permission request", "requestId": exc.request_id}
    return {"error": "No pending permission request for session",
            "sessionId": exc.session_id, "requestId": exc.request_id}


def _retryable_timeout(exc: Any) -> dict[str, Any]:
    return {"error": str(exc), "code": exc.code, "errorKind": exc.code, "retryable": True,
            **error_details(exc)}


def _short(exc: Any) -> dict[str, Any]:
    return {"error": str(exc), "code": exc.code}


# The bodies that differ from {"error": message, "code": code, **error_details(exc)},
# by the error's exact class.
BODIES: dict[type[BridgeError], Callable[[Any], dict[str, Any]]] = {
    SessionClosedError: lambda exc: {"error": str(exc), "code": "session_closing",
                                     "sessionId": exc.session_id},
    PermissionNotFoundError: _permission_not_found,
    InvalidPromptError: lambda exc: {"error": PROMPT_REQUIRED},
    InvalidDeadlineError: lambda exc: {"error": "`deadlineMs` must be a positive integer "
                                                "(milliseconds)", "code": exc.code},
    AgentTimeoutError: _retryable_timeout,
    be.AgentRequestTimeoutError: _retryable_timeout,
    NotSupportedError: lambda exc: {"error": str(exc) or "Not supported", "code": exc.code},
    AgentError: lambda exc: {"error": "Internal error", "code": exc.rpc_code, "data": exc.data},
    AgentDiedError: _short,
    PromptDeadlineExceededError: _short,
}


UNAVAILABLE = {"": "The store is unavailable; retry later",
               "session_moved": "The session moved to another instance; retry",
               "session_busy_elsewhere": "The session is busy on another instance; retry"}


def describe(exc: BaseException) -> tuple[int, dict[str, Any], dict[str, str] | None]:
    """Status, body and headers for an error raised by the bridge or a route;
    ``Retry-After: 5`` on 429 and 503."""
    if isinstance(exc, RestError):
        return exc.status, exc.body, exc.headers
    if isinstance(exc, (StoreUnavailableError, be.JournalUnavailableError)):
        return 503, {"error": UNAVAILABLE.get(exc.code, UNAVAILABLE[""]), "code": exc.code}, \
            {"Retry-After": str(exc.retry_after)}
    if isinstance(exc, ENGINE_ERRORS):   # the store refused this write for good
        log.warning("rest: the store refused the write: %s", first_line(exc, 200))
        return 503, {"error": UNAVAILABLE[""], "code": "store_unavailable"}, \
            {"Retry-After": str(RETRY_AFTER_S)}
    if not isinstance(exc, BridgeError):
        return 500, {"error": "Internal error"}, None
    special = BODIES.get(type(exc))
    body = special(exc) if special is not None else {"error": str(exc), "code": exc.code,
                                                      **error_details(exc)}
    status = status_of(exc)
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
    # Starlette's ServerErrorMiddleware calls this, then re-raises it to the HTTP server,
    # which logs nothing of it in the daemon (granian runs with its log off): logged here
    log.error("rest: %s failed", request_line(request), exc_info=exc)
    return error_response(exc)


NOT_AN_ID = "`:id` must decode to a workspace id or absolute path"   # qwen 0.24.4's


def _relative_workspace(request: Request) -> bool:
    """``GET /workspace/{a/b}/sessions``: qwen's listing under an ``:id`` with a ``/``
    in it (``rel%2Fx``, which the server decodes into segments no route has)."""
    path = request.scope["path"]
    return request.method in ("GET", "HEAD") and path.startswith("/workspace/") \
        and path.endswith("/sessions") and path.count("/") > 3


async def handle_http(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404 and _relative_workspace(request):   # qwen's 400 for it
        selector = request.scope["path"][len("/workspace/"):-len("/sessions")]
        return json_response(400, {"error": NOT_AN_ID, "code": "workspace_not_found",
                                   "workspace": selector[:256]})
    return json_response(exc.status_code, {"error": exc.detail}, exc.headers)


EXCEPTION_HANDLERS: dict[Any, Any] = {
    ClientDisconnected: handle_disconnect,
    ClientDisconnect: handle_disconnect,
    RestError: handle_error,
    BridgeError: handle_error,
    StoreUnavailableError: handle_error,
    **{engine_error: handle_error for engine_error in ENGINE_ERRORS},   # logged in describe
    HTTPException: handle_http,
    Exception: handle_unexpected,
}
