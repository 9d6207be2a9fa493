"""Errors raised by the bridge.

Every error a front door maps to a wire answer carries a stable snake_case ``code``
and the fields that the wire body needs, so that ``acp_server.rest`` and
``acp_server.acp_http`` can build their bodies without parsing messages::

    try:
        ticket = bridge.send_prompt(session_id, prompt)
    except PromptQueueFullError as exc:
        body = {"error": str(exc), "code": exc.code, "sessionId": exc.session_id,
                "limit": exc.limit, "pendingCount": exc.pending_count}
"""

from __future__ import annotations

from typing import Any


class BridgeError(Exception):
    """Base class. ``code`` is the stable machine-readable name."""

    code: str = "internal_error"


class InvalidOptionError(BridgeError, ValueError):
    """A ``BridgeOptions`` value is out of range; the message names option and value."""

    code = "invalid_option"


class SessionNotFoundError(BridgeError, LookupError):
    code = "session_not_found"

    def __init__(self, session_id: str) -> None:
        super().__init__(f'No session with id "{session_id}"')
        self.session_id = session_id


class SessionLimitExceededError(BridgeError):
    code = "session_limit_exceeded"

    def __init__(self, limit: int) -> None:
        super().__init__(f"Session limit reached ({limit} live sessions)")
        self.limit = limit
        self.scope = "workspace"


class PromptQueueFullError(BridgeError):
    code = "prompt_queue_full"

    def __init__(self, session_id: str, limit: int, pending_count: int) -> None:
        super().__init__(
            f'Prompt queue full for session "{session_id}" ({pending_count}/{limit} pending)'
        )
        self.session_id = session_id
        self.limit = limit
        self.pending_count = pending_count


class BranchWhilePromptActiveError(BridgeError):
    code = "branch_while_prompt_active"

    def __init__(self, session_id: str) -> None:
        super().__init__(f'Cannot branch session "{session_id}" while a prompt is pending')
        self.session_id = session_id


class WorkspaceMismatchError(BridgeError):
    code = "workspace_mismatch"

    def __init__(self, bound_workspace: str, requested_workspace: str) -> None:
        super().__init__(
            f'Requested workspace "{requested_workspace}" does not match the daemon\'s '
            f'workspace "{bound_workspace}"'
        )
        self.bound_workspace = bound_workspace
        self.requested_workspace = requested_workspace


class InvalidClientIdError(BridgeError):
    code = "invalid_client_id"

    def __init__(self, session_id: str, client_id: str) -> None:
        super().__init__(f'Client id "{client_id}" is not attached to session "{session_id}"')
        self.session_id = session_id
        self.client_id = client_id


class SessionIdNotHonoredError(BridgeError):
    code = "session_id_not_honored"

    def __init__(self, requested: str, actual: str) -> None:
        super().__init__(f'Agent returned session "{actual}" instead of requested "{requested}"')
        self.requested = requested
        self.actual = actual


class SubscriberLimitExceededError(BridgeError):
    code = "subscriber_limit_exceeded"

    def __init__(self, session_id: str, limit: int) -> None:
        super().__init__(f'Too many event subscribers for session "{session_id}" (limit {limit})')
        self.session_id = session_id
        self.limit = limit


class PermissionNotFoundError(BridgeError, LookupError):
    code = "permission_not_found"

    def __init__(self, request_id: str, session_id: str | None = None) -> None:
        super().__init__("No pending permission request")
        self.request_id = request_id
        self.session_id = session_id


class InvalidPermissionOptionError(BridgeError):
    code = "invalid_option_id"

    def __init__(self, request_id: str, option_id: str) -> None:
        super().__init__(f'Option "{option_id}" was not offered by permission request "{request_id}"')
        self.request_id = request_id
        self.option_id = option_id


class PromptNotFoundError(BridgeError, LookupError):
    code = "prompt_not_found"

    def __init__(self, session_id: str, prompt_id: str) -> None:
        super().__init__(f'No pending prompt "{prompt_id}" in session "{session_id}"')
        self.session_id = session_id
        self.prompt_id = prompt_id


class AgentNotFoundError(BridgeError, LookupError):
    """No agent (profile) of that name is configured."""

    code = "agent_not_found"

    def __init__(self, name: str, available: list[str]) -> None:
        super().__init__(f'No agent named "{name}" (available: {", ".join(available)})')
        self.name = name
        self.available = available


class NotSupportedError(BridgeError):
    """The agent does not offer what was asked (e.g. ``session/load``)."""

    code = "not_supported"


# --- prompt outcomes (what a PromptTicket's result raises) ---------------------------


class PromptCancelledError(BridgeError):
    """The prompt was cancelled before it reached the agent, or the request was
    already cancelled at admission (then no slot was taken)."""

    code = "prompt_cancelled"

    def __init__(self, message: str = "Prompt cancelled", reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason


class PromptDeadlineExceededError(BridgeError):
    code = "prompt_deadline_exceeded"

    def __init__(self, deadline_ms: int) -> None:
        super().__init__(f"prompt exceeded the {deadline_ms}ms deadline")
        self.deadline_ms = deadline_ms


class SessionClosedError(BridgeError):
    code = "session_closed"

    def __init__(self, session_id: str, reason: str = "client_close") -> None:
        super().__init__(f'Session "{session_id}" was closed ({reason})')
        self.session_id = session_id
        self.reason = reason


class AgentError(BridgeError):
    """A JSON-RPC error answered by the agent. ``rpc_code`` is the integer code."""

    code = "agent_error"

    def __init__(self, rpc_code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.rpc_code = rpc_code
        self.message = message
        self.data = data


class AgentDiedError(BridgeError):
    """The agent process or connection went away."""

    code = "agent_died"

    def __init__(self, message: str = "Agent process exited", exit_code: int | None = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class AgentTimeoutError(BridgeError):
    code = "init_timeout"

    def __init__(self, phase: str, timeout_ms: int) -> None:
        super().__init__(f"Agent did not answer {phase} within {timeout_ms}ms")
        self.phase = phase
        self.timeout_ms = timeout_ms
