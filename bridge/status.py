"""What the bridge reports: typed values, snake_case, times as epoch seconds.

    info = await bridge.create_session()          # SessionInfo
    status = bridge.session_status(info.session_id)
    status.pending_prompts, status.created_at     # 0, 1767225600.123
    bridge.stats().prompt_queue_wait.mean_ms

No wire names here: each front door formats these values for its own wire (REST's
camelCase bodies and ISO-8601 times live in ``acp_server.rest``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from bridge.history import SessionHistory


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
    origin: str | None = None              # create_session's label ("lmsp", …); None: a person's

    @property
    def has_active_prompt(self) -> bool:
        return self.active_prompt_id is not None


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
