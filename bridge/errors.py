"""Errors raised by the bridge: a stable ``code`` and typed fields, in no door's wire.

    try:
        ticket = bridge.send_prompt(session_id, prompt)
    except PromptQueueFullError as exc:
        exc.code, exc.session_id, exc.limit, exc.pending_count   # "prompt_queue_full", ...

Contracts:

* Every error has a stable snake_case ``code`` (the machine-readable name both doors
  send) and its facts as typed, snake_case attributes. Nothing here knows a status
  code or a JSON-RPC code: the REST door maps errors to HTTP statuses
  (``acp_server.rest.errors``), the ``/acp`` door to JSON-RPC errors
  (``acp_server.acp_http.errors``), and both name the fields as the peer does with
  ``bridge.wire.error_details``.
* ``AgentError`` is an agent's own JSON-RPC error answer: ``rpc_code``, ``message`` and
  ``data`` are what the agent sent (the bridge speaks JSON-RPC to its agents),
  bounded as it is made, whoever makes it (our agent connections, an embedder's own
  ``AgentConnection``): the message cut at ``MAX_AGENT_MESSAGE`` characters, a ``data``
  over ``MAX_AGENT_DATA`` bytes of JSON (or one that does not encode) replaced by the
  marker ``{errorKind?, truncated: true, bytes}`` (``bridge.wire.cut_agent_data``).
* Errors the doors' callers (the LMSP runner, embedders) may want to wait out rather
  than fail on: ``SessionLimitExceededError`` (no session slot now: retry when one
  frees, ``Bridge.wait_for_session_slot``) and ``AgentRequestTimeoutError`` (an
  agent did not answer ``session/new``, ``load``, ``resume``, ``fork`` or ``close``
  within ``BridgeOptions.agent_request_timeout_ms``; the slot it held is free again).
  ``AgentUnavailableError`` with ``transient`` (the machine was short of descriptors,
  processes or memory when the agent's process was to start) is one too.
* ``AgentUnavailableError`` (``agent_unavailable``) is every failure to start an agent:
  its process could not be spawned, or (``AgentStartError``) it did not complete ACP
  ``initialize``. ``AgentTimeoutError`` (``init_timeout``) is one that did not answer.
"""

from __future__ import annotations

import errno
import os
from typing import Any

import msgspec

from bridge.loggable import loggable


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
    """No session slot: the workspace's cap (``scope == "workspace"``) or the share
    of it one agent may hold (``scope == "agent"``, ``agent`` names it; see
    ``Bridge`` "The session cap")."""

    code = "session_limit_exceeded"

    def __init__(self, limit: int, *, scope: str = "workspace", agent: str | None = None) -> None:
        if scope == "agent":
            message = f'Session limit reached for agent "{agent}" ({limit} sessions, its share)'
        else:
            message = f"Session limit reached ({limit} live sessions)"
        super().__init__(message)
        self.limit = limit
        self.scope = scope
        self.agent = agent


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


MAX_WORKSPACE_PATH = 4096   # characters of a refused workspace path named (as qwen 0.24.4)


class WorkspaceMismatchError(BridgeError):
    """Another folder than the server's workspace asked for (``session/new``, ``POST
    /session``, a load): ``qwen serve`` 0.24.4's message, the requested path cut at
    ``MAX_WORKSPACE_PATH`` characters (``…[truncated]``) there and in
    ``requested_workspace``."""

    code = "workspace_mismatch"

    def __init__(self, bound_workspace: str, requested_workspace: str) -> None:
        if len(requested_workspace) > MAX_WORKSPACE_PATH:
            requested_workspace = requested_workspace[:MAX_WORKSPACE_PATH] + "\u2026[truncated]"
        super().__init__(
            f'Workspace mismatch: runtime is bound to "{bound_workspace}" but request asked '
            f'for "{requested_workspace}". Select a registered runtime for '
            f'"{requested_workspace}" or register it before retrying; this bridge will not '
            "fall back to the primary workspace.")
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
        shown = name if len(name) <= 80 else name[:80] + "…"   # the client's string, echoed
        super().__init__(f'No agent named "{shown}" (available: {", ".join(available)})')
        self.name = shown
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


MAX_AGENT_MESSAGE = 1000   # characters of an agent error's message kept
MAX_AGENT_DATA = 16_384   # bytes of an agent error's data, JSON-encoded, kept as it is


class AgentError(BridgeError):
    """A JSON-RPC error answered by the agent: its integer ``rpc_code``, ``message``
    and ``data``, as sent, bounded here (the module contracts): a hostile agent, or an
    embedder's connection passing one on, never makes an answer megabytes."""

    code = "agent_error"

    def __init__(self, rpc_code: int, message: str, data: Any = None) -> None:
        message = str(message)[:MAX_AGENT_MESSAGE]
        if data is not None:
            try:
                size: int | None = len(msgspec.json.encode(data))
            except (TypeError, ValueError, OverflowError):   # an in-process value
                size = None
            if size is None or size > MAX_AGENT_DATA:
                from bridge.wire import cut_agent_data   # the marker's wire (it imports us)
                data = cut_agent_data(data, size)
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


# Why a spawn failed when the machine was short of something that may come back. An
# errno the event loop could not name (uvloop reports some EMFILE as -1) counts too.
TRANSIENT_SPAWN_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.ENOMEM})


class AgentUnavailableError(AgentDiedError):
    """The agent's process could not be started: nothing ran. ``reason`` is the errno's
    name (``ENOENT``: the command or its folder is gone, ``EACCES``: not executable,
    ``EMFILE`` / ``ENFILE`` / ``EAGAIN`` / ``ENOMEM``: the machine is short of
    descriptors, processes or memory; ``unknown`` when the system did not say);
    ``transient`` for the shortages (and ``unknown``). The next request tries again."""

    code = "agent_unavailable"

    def __init__(self, agent: str, error: OSError, cwd: str | None = None) -> None:
        number = error.errno if isinstance(error.errno, int) and error.errno > 0 else None
        self.agent = agent
        self.reason = errno.errorcode.get(number, "unknown") if number else "unknown"
        self.transient = number is None or number in TRANSIENT_SPAWN_ERRNOS
        why = error.strerror if number else "the system refused (out of descriptors or " \
            "processes?)"
        if number == errno.ENOENT and cwd is not None and not os.path.isdir(cwd):
            why = f"its folder {cwd} is gone"   # not the command: say which
        super().__init__(f"Cannot start agent {agent!r}: {why}")


MAX_SAID = 600   # characters of what an agent said, in the message of its failed start


def said_line(text: str, limit: int) -> str:
    """What an agent wrote or answered, as one line (runs of whitespace, line breaks
    included, one space) of at most ``limit`` characters, cut with "…"; then what is
    left that a log line must not hold (ESC, NUL, bidi overrides) escaped as
    ``bridge.loggable`` does (a message may be logged)."""
    line = " ".join(text.split())
    line = line if len(line) <= limit else line[:limit - 1] + "…"
    return loggable(line, len(line))


class AgentStartError(AgentUnavailableError):
    """The agent's process started but did not complete ACP ``initialize``: it exited
    (``exit_code``, when it did), answered an error, or answered something that is no
    ``InitializeResponse`` object. ``reason`` is ``initialize_failed``; the message
    names the agent and says what it said (bounded). Not ``transient``: a command
    that does not speak ACP does not get better by waiting, but the next request
    tries again."""

    def __init__(self, agent: str, said: str, exit_code: int | None = None) -> None:
        AgentDiedError.__init__(self, f"Agent {agent!r} did not complete ACP initialize: "
                                      f"{said[:MAX_SAID]}", exit_code)
        self.agent = agent
        self.reason = "initialize_failed"
        self.transient = False


class AgentTimeoutError(BridgeError):
    """The agent did not answer ``initialize`` in time (``phase`` names the request);
    ``said``, when given, is what it wrote meanwhile, added to the message."""

    code = "init_timeout"

    def __init__(self, phase: str, timeout_ms: int, said: str = "") -> None:
        super().__init__(f"Agent did not answer {phase} within {timeout_ms}ms"
                         + (f"; {said[:MAX_SAID]}" if said else ""))
        self.phase = phase
        self.timeout_ms = timeout_ms


class AgentRequestTimeoutError(AgentTimeoutError):
    """The agent did not answer ``session/new``, ``session/load``, ``session/resume``,
    ``session/fork`` or ``session/close`` (``phase``) within
    ``BridgeOptions.agent_request_timeout_ms``. The request is abandoned (a late
    answer is ignored) and any slot it held is free again."""

    code = "agent_request_timeout"


class AgentProtocolError(BridgeError):
    """The agent broke the protocol in a way that cannot be passed on: e.g. it
    answered ``session/new`` with the id of a session that is live on the bridge
    (that session is left untouched)."""

    code = "agent_protocol_error"

    def __init__(self, message: str, agent: str) -> None:
        super().__init__(message)
        self.agent = agent


class InvalidPromptError(BridgeError, ValueError):
    """``prompt`` is not a non-empty array of content blocks (JSON objects)."""

    code = "invalid_prompt"

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


class PromptIdInUseError(BridgeError):
    """A prompt id given to ``send_prompt`` that a pending prompt of the session has."""

    code = "prompt_id_in_use"

    def __init__(self, session_id: str, prompt_id: str) -> None:
        super().__init__(f"Prompt {prompt_id!r} is already pending on this session")
        self.session_id = session_id
        self.prompt_id = prompt_id


class InvalidDeadlineError(BridgeError, ValueError):
    """A prompt deadline that is not a positive integer of milliseconds (at most 2**31-1)."""

    code = "invalid_deadline_ms"

    def __init__(self, deadline_ms: object) -> None:
        super().__init__(f"deadline_ms must be a positive integer (milliseconds), not {deadline_ms!r}")
        self.deadline_ms = deadline_ms


STOPPING = "the server is stopping"   # a JournalUnavailableError's reason at a clean stop


class JournalUnavailableError(BridgeError):
    """The session journal could not commit (the store is down, the disk full, the
    server stopping: ``STOPPING``): the request that needed the commit is refused (each
    door's 503); nothing was acknowledged."""

    code = "store_unavailable"

    def __init__(self, reason: str, retry_after: int = 5) -> None:
        super().__init__(f"The session journal is unavailable: {reason}")
        self.reason = reason
        self.retry_after = retry_after   # seconds


class SessionMovedError(JournalUnavailableError):
    """The session's journal commit was refused because another instance took the
    session over meanwhile (its lease moved: issue #24). Retryable at once: the next
    attempt is routed to the new owner (each door's 503, ``session_moved``)."""

    code = "session_moved"

    def __init__(self, reason: str, retry_after: int = 1) -> None:
        super().__init__(reason, retry_after)


class SessionBusyElsewhereError(JournalUnavailableError):
    """A ``session/load`` or ``session/resume`` of a session another instance runs,
    which did not hand it over in time (a prompt running or queued, a question
    pending, or the owner paused or unreachable: issue #24). Retryable: each door's
    503 / ``-32603`` with ``session_busy_elsewhere`` and ``retry_after`` seconds."""

    code = "session_busy_elsewhere"

    def __init__(self, session_id: str, retry_after: int = 2) -> None:
        BridgeError.__init__(self, f"Session {session_id} is busy on another instance; "
                                   f"retry later")
        self.reason = "busy on another instance"
        self.retry_after = retry_after   # seconds


class SessionNotRestorableError(BridgeError):
    """A session restored from the journal whose agent side could not be restored:
    its history stays readable, a new prompt is refused."""

    code = "session_not_restorable"

    def __init__(self, session_id: str, reason: str) -> None:
        super().__init__(f'Session "{session_id}" was restored after a restart but its agent '
                         f"could not restore it ({reason}); its history is readable, start a "
                         f"new session to go on")
        self.session_id = session_id
        self.reason = reason


class ServerRestartedError(BridgeError):
    """The prompt was running when the server stopped (``--session-on-restart fail``)."""

    code = "server_restarted"

    def __init__(self, prompt_id: str) -> None:
        super().__init__(f'Prompt "{prompt_id}" was interrupted by a server restart')
        self.prompt_id = prompt_id
