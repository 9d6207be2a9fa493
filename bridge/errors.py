"""Errors raised by the bridge.

    try:
        ticket = bridge.send_prompt(session_id, prompt)
    except BridgeError as exc:
        exc.code, exc.http_status, exc.rpc_code   # "prompt_queue_full", 503, -32603
        exc.details()   # {"sessionId": ..., "limit": 5, "pendingCount": 5}

Every error carries what a front door needs to answer without parsing messages or
testing classes one by one: a stable snake_case ``code``; ``http_status``, the status
of the peer's (``qwen serve``) answer; ``rpc_code``, the JSON-RPC error code; and
``details()``, the error's fields as camelCase wire names, in the peer's order.
Each door keeps a table for the few answers that differ from its general rule.
"""

from __future__ import annotations

from typing import Any

from bridge.jsonrpc import INTERNAL_ERROR, INVALID_PARAMS


class BridgeError(Exception):
    """Base class. ``code`` is the stable machine-readable name."""

    code: str = "internal_error"
    http_status: int = 500
    rpc_code: int = INTERNAL_ERROR

    def details(self) -> dict[str, Any]:
        """The error's fields, camelCase, in wire order (none by default)."""
        return {}


class InvalidOptionError(BridgeError, ValueError):
    """A ``BridgeOptions`` value is out of range; the message names option and value."""

    code = "invalid_option"
    http_status = 400


class SessionNotFoundError(BridgeError, LookupError):
    code = "session_not_found"
    http_status = 404
    rpc_code = INVALID_PARAMS

    def __init__(self, session_id: str) -> None:
        super().__init__(f'No session with id "{session_id}"')
        self.session_id = session_id

    def details(self) -> dict[str, Any]:
        return {"sessionId": self.session_id}


class SessionLimitExceededError(BridgeError):
    code = "session_limit_exceeded"
    http_status = 503

    def __init__(self, limit: int) -> None:
        super().__init__(f"Session limit reached ({limit} live sessions)")
        self.limit = limit
        self.scope = "workspace"

    def details(self) -> dict[str, Any]:
        return {"limit": self.limit, "scope": self.scope}


class PromptQueueFullError(BridgeError):
    code = "prompt_queue_full"
    http_status = 503

    def __init__(self, session_id: str, limit: int, pending_count: int) -> None:
        super().__init__(
            f'Prompt queue full for session "{session_id}" ({pending_count}/{limit} pending)'
        )
        self.session_id = session_id
        self.limit = limit
        self.pending_count = pending_count

    def details(self) -> dict[str, Any]:
        return {"sessionId": self.session_id, "limit": self.limit,
                "pendingCount": self.pending_count}


class BranchWhilePromptActiveError(BridgeError):
    code = "branch_while_prompt_active"
    http_status = 409

    def __init__(self, session_id: str) -> None:
        super().__init__(f'Cannot branch session "{session_id}" while a prompt is pending')
        self.session_id = session_id

    def details(self) -> dict[str, Any]:
        return {"sessionId": self.session_id}


class WorkspaceMismatchError(BridgeError):
    code = "workspace_mismatch"
    http_status = 400
    rpc_code = INVALID_PARAMS

    def __init__(self, bound_workspace: str, requested_workspace: str) -> None:
        super().__init__(
            f'Requested workspace "{requested_workspace}" does not match the daemon\'s '
            f'workspace "{bound_workspace}"'
        )
        self.bound_workspace = bound_workspace
        self.requested_workspace = requested_workspace

    def details(self) -> dict[str, Any]:
        return {"boundWorkspace": self.bound_workspace,
                "requestedWorkspace": self.requested_workspace}


class InvalidClientIdError(BridgeError):
    code = "invalid_client_id"
    http_status = 400
    rpc_code = INVALID_PARAMS

    def __init__(self, session_id: str, client_id: str) -> None:
        super().__init__(f'Client id "{client_id}" is not attached to session "{session_id}"')
        self.session_id = session_id
        self.client_id = client_id

    def details(self) -> dict[str, Any]:
        return {"sessionId": self.session_id, "clientId": self.client_id}


class SessionIdNotHonoredError(BridgeError):
    code = "session_id_not_honored"

    def __init__(self, requested: str, actual: str) -> None:
        super().__init__(f'Agent returned session "{actual}" instead of requested "{requested}"')
        self.requested = requested
        self.actual = actual

    def details(self) -> dict[str, Any]:
        return {"requestedSessionId": self.requested, "sessionId": self.actual}


class SubscriberLimitExceededError(BridgeError):
    code = "subscriber_limit_exceeded"
    http_status = 429

    def __init__(self, session_id: str, limit: int) -> None:
        super().__init__(f'Too many event subscribers for session "{session_id}" (limit {limit})')
        self.session_id = session_id
        self.limit = limit

    def details(self) -> dict[str, Any]:
        return {"limit": self.limit}


class PermissionNotFoundError(BridgeError, LookupError):
    code = "permission_not_found"
    http_status = 404
    rpc_code = INVALID_PARAMS

    def __init__(self, request_id: str, session_id: str | None = None) -> None:
        super().__init__("No pending permission request")
        self.request_id = request_id
        self.session_id = session_id

    def details(self) -> dict[str, Any]:
        return ({} if self.session_id is None else {"sessionId": self.session_id}) | {
            "requestId": self.request_id}


class InvalidPermissionOptionError(BridgeError):
    code = "invalid_option_id"
    http_status = 400
    rpc_code = INVALID_PARAMS

    def __init__(self, request_id: str, option_id: str) -> None:
        super().__init__(f'Option "{option_id}" was not offered by permission request "{request_id}"')
        self.request_id = request_id
        self.option_id = option_id

    def details(self) -> dict[str, Any]:
        return {"requestId": self.request_id, "optionId": self.option_id}


class PromptNotFoundError(BridgeError, LookupError):
    code = "prompt_not_found"
    http_status = 404

    def __init__(self, session_id: str, prompt_id: str) -> None:
        super().__init__(f'No pending prompt "{prompt_id}" in session "{session_id}"')
        self.session_id = session_id
        self.prompt_id = prompt_id

    def details(self) -> dict[str, Any]:
        return {"sessionId": self.session_id, "promptId": self.prompt_id}


class AgentNotFoundError(BridgeError, LookupError):
    """No agent (profile) of that name is configured."""

    code = "agent_not_found"
    http_status = 400
    rpc_code = INVALID_PARAMS

    def __init__(self, name: str, available: list[str]) -> None:
        super().__init__(f'No agent named "{name}" (available: {", ".join(available)})')
        self.name = name
        self.available = available

    def details(self) -> dict[str, Any]:
        return {"agent": self.name, "available": self.available}


class NotSupportedError(BridgeError):
    """The agent does not offer what was asked (e.g. ``session/load``)."""

    code = "not_supported"
    http_status = 501


# --- prompt outcomes (what a PromptTicket's result raises) ---------------------------


class PromptCancelledError(BridgeError):
    """The prompt was cancelled before it reached the agent, or the request was
    already cancelled at admission (then no slot was taken)."""

    code = "prompt_cancelled"
    http_status = 409

    def __init__(self, message: str = "Prompt cancelled", reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason


class PromptDeadlineExceededError(BridgeError):
    code = "prompt_deadline_exceeded"

    def __init__(self, deadline_ms: int) -> None:
        super().__init__(f"prompt exceeded the {deadline_ms}ms deadline")
        self.deadline_ms = deadline_ms

    def details(self) -> dict[str, Any]:
        return {"deadlineMs": self.deadline_ms}


class SessionClosedError(BridgeError):
    code = "session_closed"
    http_status = 404

    def __init__(self, session_id: str, reason: str = "client_close") -> None:
        super().__init__(f'Session "{session_id}" was closed ({reason})')
        self.session_id = session_id
        self.reason = reason

    def details(self) -> dict[str, Any]:
        return {"sessionId": self.session_id, "reason": self.reason}


class AgentError(BridgeError):
    """A JSON-RPC error answered by the agent. ``rpc_code`` is the integer code."""

    code = "agent_error"

    def __init__(self, rpc_code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.rpc_code = rpc_code
        self.message = message
        self.data = data

    def details(self) -> dict[str, Any]:
        return {"data": self.data}


class AgentDiedError(BridgeError):
    """The agent process or connection went away."""

    code = "agent_died"

    def __init__(self, message: str = "Agent process exited", exit_code: int | None = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code

    def details(self) -> dict[str, Any]:
        return {"exitCode": self.exit_code}


class AgentTimeoutError(BridgeError):
    code = "init_timeout"
    http_status = 504

    def __init__(self, phase: str, timeout_ms: int) -> None:
        super().__init__(f"Agent did not answer {phase} within {timeout_ms}ms")
        self.phase = phase
        self.timeout_ms = timeout_ms

    def details(self) -> dict[str, Any]:
        return {"phase": self.phase, "timeoutMs": self.timeout_ms}


class InvalidPromptError(BridgeError, ValueError):
    """``prompt`` is not a non-empty array of content blocks (JSON objects)."""

    code = "invalid_prompt"
    http_status = 400
    rpc_code = INVALID_PARAMS

    def __init__(self, message: str = "`prompt` must be a non-empty array of content blocks"
                 ) -> None:
        super().__init__(message)


class TooManyContentBlocksError(InvalidPromptError):
    """A prompt of more than ``BridgeOptions.max_prompt_blocks`` content blocks."""

    code = "too_many_content_blocks"

    def __init__(self, count: int, limit: int) -> None:
        super().__init__(f"`prompt` has {count} content blocks; at most {limit} are accepted")
        self.count = count
        self.limit = limit

    def details(self) -> dict[str, Any]:
        return {"limit": self.limit}


class InvalidDeadlineError(BridgeError, ValueError):
    """A prompt deadline that is not a positive integer of milliseconds (at most 2**31-1)."""

    code = "invalid_deadline_ms"
    http_status = 400
    rpc_code = INVALID_PARAMS

    def __init__(self, deadline_ms: object) -> None:
        super().__init__(f"deadline_ms must be a positive integer (milliseconds), not {deadline_ms!r}")
        self.deadline_ms = deadline_ms
