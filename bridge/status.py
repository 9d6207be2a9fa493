"""What the bridge reports: typed values, snake_case, times as epoch seconds.

    info = await bridge.create_session()          # SessionInfo
    status = bridge.session_status(info.session_id)
    status.pending_prompts, status.created_at     # 0, 1767225600.123
    bridge.stats().prompt_queue_wait.mean_ms
    info = await bridge.load_session(sid)         # info.history: SessionHistory

No wire names here: each front door formats these values for its own wire (REST's
camelCase bodies and ISO-8601 times live in ``acp_server.rest``). This module imports
nothing of the bridge but its events, so any module may use its types.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from bridge.events import Event

MAX_PROMPT_TERMINALS = 256   # kept per session (and across a close, for a cold load)
# The error codes of a prompt refused at admission and settled before it ran: its
# commit failed, another instance took the session over, its agent cannot be restored.
# Sent again under its id, such a prompt is admitted anew (``prompt_terminal``).
REFUSED_CODES = frozenset({"store_unavailable", "session_moved", "session_not_restorable"})


def refused(terminal: PromptTerminal) -> bool:
    """The terminal of a prompt refused at admission (``REFUSED_CODES``)."""
    return terminal.terminal == "failed" and terminal.error_code in REFUSED_CODES


@dataclasses.dataclass(frozen=True, slots=True)
class PromptTerminal:
    """How one prompt ended: ``terminal`` ``completed`` | ``cancelled`` | ``failed``;
    ``at`` in epoch milliseconds."""

    prompt_id: str
    terminal: str
    at: int
    stop_reason: str | None = None
    error_code: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class TurnFailure:
    """How the session's last turn that ran failed (its ``turn_error``'s message, code
    and kind): kept until the session's next prompt starts running."""

    message: str
    code: str
    error_kind: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class AskedPermission:
    """A permission request of the session's agent not answered yet: its id, the
    agent's ``session/request_permission`` params as sent, when it was asked (epoch
    seconds)."""

    request_id: str
    params: dict[str, Any]
    asked_at: float


@dataclasses.dataclass(frozen=True, slots=True)
class SessionHistory:
    """A session's history as ``load`` hands it over (``bridge.history``): the events
    before the running prompt, adjacent text chunks of a prompt joined; the running
    prompt's events as published; how prompts ended; the id to subscribe from."""

    compacted_replay: list[Event]
    live_journal: list[Event]
    prompt_terminals: list[PromptTerminal]
    last_event_id: int


@dataclasses.dataclass(frozen=True, slots=True)
class SessionInfo:
    """A session as created, attached, loaded, resumed or branched."""

    session_id: str
    workspace_cwd: str
    attached: bool
    client_id: str
    created_at: float   # epoch seconds
    event_epoch: str
    last_event_id: int
    has_active_prompt: bool
    forked_from: str | None = None
    agent: str = ""
    # The agent's answer to session/new (or load, resume, fork), unknown fields kept:
    # modes, configOptions, models, ...
    agent_result: dict[str, Any] = dataclasses.field(default_factory=dict)
    # ``load`` only: the session's history (bridge.history), read with last_event_id.
    history: SessionHistory | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class SessionStatus:
    session_id: str
    workspace_cwd: str
    created_at: float   # epoch seconds
    client_count: int
    active_prompt_id: str | None
    pending_prompts: int   # queued plus running
    queued_prompts: int
    pending_permissions: int
    subscribers: int
    last_event_id: int
    event_epoch: str
    agent: str = ""                        # the agent profile it runs on
    max_pending_prompts: int | None = None   # its admission limit (None: no limit)
    active_prompt_text: str | None = None    # the running prompt's text preview
    updated_at: float = 0.0                # epoch seconds of its last activity
    earliest_event_id: int = 1             # the oldest event id its ring still holds
    origin: str | None = None              # create_session's label ("lmsp", …); None: a person's
    # epoch seconds of the end of its last prompt that ran (None before the first, and
    # after a restart: the instance's own observation, as qwen serve's)
    turn_ended_at: float | None = None
    turn_failure: TurnFailure | None = None   # its last turn that ran failed (else None)
    asked: tuple[AskedPermission, ...] = ()   # its permission requests open, oldest first
    display_name: str | None = None   # its first prompt's name (bridge.pending.display_name)

    @property
    def has_active_prompt(self) -> bool:
        return self.active_prompt_id is not None


@dataclasses.dataclass(frozen=True, slots=True)
class AgentStatus:
    """One configured agent (``Bridge.list_agents``)."""

    name: str
    default: bool
    state: str          # not_started | running | exited (restarted on next use)
    sessions: int       # live sessions on it
    info: dict[str, Any]   # its ``initialize`` answer (empty before its first start)


@dataclasses.dataclass(frozen=True, slots=True)
class PendingPromptInfo:
    """A queued or running prompt."""

    prompt_id: str
    queued_at_ms: int   # epoch milliseconds
    text: str           # its text blocks, joined, cut to a preview
    state: str          # queued | running


@dataclasses.dataclass(frozen=True, slots=True)
class QueueWait:
    """Admission to the start of the turn, over every prompt that started."""

    count: int
    mean_ms: float
    max_ms: float
    last_ms: float


@dataclasses.dataclass(frozen=True, slots=True)
class BridgeStats:
    sessions: int
    admission_in_flight: int   # session spawns admitted, not yet registered
    pending_prompts: int
    queued_prompts: int
    active_prompts: int
    pending_permissions: int
    subscribers: int
    prompt_queue_wait: QueueWait
    # Agent messages naming a session the agent does not own, dropped (isolation).
    foreign_messages_dropped: int = 0
