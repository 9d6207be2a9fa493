"""Errors of the ``/acp`` door, and every error mapped onto a JSON-RPC error (the
peer's ``toRpcError``).

    code, message, data = to_rpc_error(exc)       # (-32603, "...", {"errorKind": ...})
    payload = encode_bridge_error(rpc_id, exc)     # the JSON-RPC error response

Error mapping (stable; documented in README "ACP over HTTP"):

==================================  =======  =================================================
bridge error                        code     data
==================================  =======  =================================================
``PromptQueueFullError``            -32603   ``{errorKind: "prompt_queue_full", sessionId,
                                             limit, pendingCount}``
``SessionNotFoundError``, bad       -32602   (none)
params, workspace mismatch
``SessionLimitExceededError``       -32603   ``{errorKind: "session_limit_exceeded", limit,
                                             scope, retryable: true}``
``AgentError`` (agent's JSON-RPC)   as sent  as sent
``AgentRequestTimeoutError``        -32603   ``{errorKind: "agent_request_timeout",
                                             httpStatus: 504, retryable: true, phase,
                                             timeoutMs}``
``StoreUnavailableError`` (store)    -32603   ``{errorKind: "store_unavailable",
and ``ENGINE_ERRORS`` (a write                retryable: true, retryAfterSeconds}``
refused for good; logged)
``SessionMovedError`` (fenced)      -32603   ``{errorKind: "session_moved",
                                             retryable: true, retryAfterSeconds: 1}``
``SessionBusyElsewhereError``       -32603   ``{errorKind: "session_busy_elsewhere",
(load/resume, not handed over)               retryable: true, retryAfterSeconds}``
other ``BridgeError``               -32603   ``{errorKind: <error code>, ...}``
anything else                       -32603   ``{errorKind: "internal"}`` ("Internal error")
==================================  =======  =================================================

The caller's mistakes (``CALLER_ERRORS``, looked up along the error's MRO) are
-32602; ``DATA`` and ``ANSWERS`` hold the answers that carry more, or differ. Field
names are the peer's (``bridge.wire.error_details``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import msgspec

from acp_server.http.policy import Refusal
from acp_server.store.errors import (
    ENGINE_ERRORS,
    RETRY_AFTER_S,
    StoreUnavailableError,
    first_line,
)
from bridge.errors import (
    AgentDiedError,
    AgentError,
    AgentNotFoundError,
    AgentRequestTimeoutError,
    AgentStartError,
    AgentTimeoutError,
    AgentUnavailableError,
    BridgeError,
    InvalidClientIdError,
    InvalidDeadlineError,
    InvalidPermissionOptionError,
    InvalidPromptError,
    PermissionNotFoundError,
    PromptDeadlineExceededError,
    PromptIdInUseError,
    PromptQueueFullError,
    JournalUnavailableError,
    SessionBusyElsewhereError,
    SessionNotRestorableError,
    SessionClosedError,
    SessionLimitExceededError,
    SessionNotFoundError,
    SubscriberLimitExceededError,
    WorkspaceMismatchError,
)
from bridge.jsonrpc import (INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND,
                            REQUEST_CANCELLED, encode_error)
from bridge.wire import error_details

log = logging.getLogger("acp_server.acp_http")
RpcId = int | str | None


class ConnectionClosedError(BridgeError):
    """The connection was closed (DELETE, reaping) while a request was running."""

    code = "connection_closed"

    def __init__(self, connection_id: str) -> None:
        super().__init__(f'ACP connection "{connection_id}" is closed')


class ChannelLimitError(BridgeError):
    code = "session_stream_limit_exceeded"

    def __init__(self, limit: int) -> None:
        super().__init__(f"Too many sessions on one ACP connection (limit {limit})")
        self.limit = limit


class InvalidParamsError(BridgeError):
    code = "invalid_params"


# The caller's mistakes: -32602 with no data.
CALLER_ERRORS: tuple[type[BridgeError], ...] = (
    SessionNotFoundError, WorkspaceMismatchError, InvalidClientIdError, PermissionNotFoundError,
    InvalidPermissionOptionError, AgentNotFoundError, InvalidPromptError, InvalidDeadlineError,
    InvalidParamsError, PromptIdInUseError,
)


class MethodNotFoundError(BridgeError):
    """Neither ours nor advertised by the session's agent (-32601, ``data: {method}``)."""

    code = "method_not_found"

    def __init__(self, method: str) -> None:
        super().__init__(f"Unknown method: {method}")
        self.method = method


class RequestCancelledError(BridgeError):
    """The request was cancelled by ``$/cancel_request`` (-32800)."""

    code = "request_cancelled"

    def __init__(self) -> None:
        super().__init__("Request cancelled")


class PromptFailedError(BridgeError):
    """A prompt sent again under its id had failed: its terminal's error code."""

    code = "prompt_failed"

    def __init__(self, prompt_id: str, error_code: str) -> None:
        super().__init__(f'Prompt "{prompt_id}" failed ({error_code})')
        self.prompt_id = prompt_id
        self.error_code = error_code


PROMPT_REQUIRED = 'Invalid params: "prompt" must be a non-empty array of content blocks'
RpcError = tuple[int, str, dict[str, Any] | None]


# The fields of this door's own errors; the bridge's are named by bridge.wire.
DOOR_DETAILS: dict[type[BridgeError], Callable[[Any], dict[str, Any]]] = {
    ChannelLimitError: lambda exc: {"limit": exc.limit},
    PromptFailedError: lambda exc: {"promptId": exc.prompt_id, "errorCode": exc.error_code},
}


def _details(exc: Any) -> dict[str, Any]:
    door = DOOR_DETAILS.get(type(exc))
    return door(exc) if door is not None else error_details(exc)


def _kind(exc: Any) -> dict[str, Any]:
    return {"errorKind": exc.code, **_details(exc)}


def _retryable(exc: Any) -> dict[str, Any]:
    return {"errorKind": exc.code, **_details(exc), "retryable": True}


def _timeout(exc: Any) -> dict[str, Any]:
    return {"errorKind": exc.code, "httpStatus": 504, "retryable": True, **_details(exc)}


# ``data`` of the -32603 answers that carry more than ``{errorKind}``, by exact class.
DATA: dict[type[BridgeError], Callable[[Any], dict[str, Any]]] = {
    PromptQueueFullError: _kind,
    SessionLimitExceededError: _retryable,
    SubscriberLimitExceededError: _retryable,
    ChannelLimitError: _retryable,
    AgentTimeoutError: _timeout,
    AgentRequestTimeoutError: _timeout,
    SessionClosedError: _kind,
    PromptDeadlineExceededError: _kind,
    AgentDiedError: _kind,
    AgentUnavailableError: _retryable,
    AgentStartError: _retryable,
    PromptFailedError: _kind,
    SessionNotRestorableError: _kind,
}
# Answers that follow neither rule, by exact class.
ANSWERS: dict[type[BridgeError], Callable[[Any], RpcError]] = {
    AgentError: lambda exc: (exc.rpc_code, exc.message, exc.data),
    AgentNotFoundError: lambda exc: (INVALID_PARAMS, str(exc),
                                     {"errorKind": exc.code, "available": exc.available}),
    InvalidPromptError: lambda exc: (INVALID_PARAMS, PROMPT_REQUIRED, None),
    MethodNotFoundError: lambda exc: (METHOD_NOT_FOUND, str(exc), {"method": exc.method}),
    RequestCancelledError: lambda exc: (REQUEST_CANCELLED, str(exc), None),
}


def to_rpc_error(exc: BaseException) -> RpcError:
    """``(code, message, data)`` for an error raised by the bridge or a method:
    ``-32602`` with no data for the caller's mistakes (``CALLER_ERRORS``), else
    ``-32603`` with ``{errorKind: code, ...}``."""
    if isinstance(exc, (StoreUnavailableError, JournalUnavailableError)):
        message = str(exc) if isinstance(exc, SessionBusyElsewhereError) \
            else "The store is unavailable; retry later"
        return INTERNAL_ERROR, message, {
            "errorKind": exc.code, "retryable": True, "retryAfterSeconds": exc.retry_after}
    if isinstance(exc, ENGINE_ERRORS):   # the store refused a write for good: as REST, LMSP
        log.warning("acp: the store refused the write: %s", first_line(exc, 200))
        return INTERNAL_ERROR, "The store is unavailable; retry later", {
            "errorKind": "store_unavailable", "retryable": True,
            "retryAfterSeconds": RETRY_AFTER_S}
    if not isinstance(exc, BridgeError):
        return INTERNAL_ERROR, "Internal error", {"errorKind": "internal"}
    answer = ANSWERS.get(type(exc))
    if answer is not None:
        return answer(exc)
    if isinstance(exc, CALLER_ERRORS):
        return INVALID_PARAMS, str(exc) or "Invalid params", None
    data = DATA.get(type(exc))
    return (INTERNAL_ERROR, str(exc) or "Internal error",
            data(exc) if data is not None else {"errorKind": exc.code})


def encode_bridge_error(rpc_id: RpcId, exc: BaseException) -> bytes:
    code, message, data = to_rpc_error(exc)
    return encode_error(rpc_id, code, message, data)


def render_refusal(refusal: Refusal) -> tuple[bytes, bytes]:
    """The front layer's refusals (and the WebSocket handshake's) in this door's shape:
    the peer's own bytes where ``qwen serve`` has them (401, the CORS 403), else a
    JSON-RPC error with no id and ``data.errorKind``."""
    if refusal.peer_body is not None:
        return b"application/json", refusal.peer_body
    return b"application/json", msgspec.json.encode({
        "jsonrpc": "2.0", "id": None, "error": {
            "code": INVALID_REQUEST, "message": refusal.message,
            "data": {"errorKind": refusal.code, **dict(refusal.extra)}}})
