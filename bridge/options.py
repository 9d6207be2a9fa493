"""Bridge options, validated once at construction.

    options = BridgeOptions(max_pending_prompts_per_session=0)   # no cap
    options.pending_prompt_limit      # None: unlimited

Counting limits (``max_pending_prompts_per_session``, ``max_sessions``) accept a
non-negative integer or ``math.inf``; ``0`` and ``inf`` mean unlimited. Bools, NaN,
fractions, negatives and non-numbers are refused with ``InvalidOptionError`` whose
message names the option and the value.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from bridge.errors import InvalidOptionError

MAX_TIMER_MS = 2**31 - 1


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_count_limit(name: str, value: Any) -> int | float:
    """Non-negative integer or infinity (0 / inf = unlimited)."""
    ok = (_is_int(value) and value >= 0) or (isinstance(value, float) and value == math.inf)
    if not ok:
        raise InvalidOptionError(
            f"Invalid {name}: {_show(value)}. Must be a non-negative integer (0 / inf = unlimited)."
        )
    return value


def validate_positive_ms(name: str, value: Any, *, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if not (_is_int(value) and 0 < value <= MAX_TIMER_MS):
        raise InvalidOptionError(
            f"Invalid {name}: {_show(value)}. Must be a positive integer (milliseconds)."
        )
    return value


def validate_non_negative_ms(name: str, value: Any) -> int:
    if not (_is_int(value) and 0 <= value <= MAX_TIMER_MS):
        raise InvalidOptionError(
            f"Invalid {name}: {_show(value)}. Must be a non-negative integer (milliseconds, 0 = disabled)."
        )
    return value


def validate_int_range(name: str, value: Any, low: int, high: int) -> int:
    if not (_is_int(value) and low <= value <= high):
        raise InvalidOptionError(
            f"Invalid {name}: {_show(value)}. Must be a positive integer in [{low}, {high}]."
        )
    return value


def _show(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if value.is_integer() and math.isfinite(value):
            return repr(value)
    if isinstance(value, str):
        return repr(value)
    return str(value)


def limit_or_none(value: int | float) -> int | None:
    """``0`` / ``inf`` → ``None`` (unlimited), else the integer limit."""
    if value == 0 or value == math.inf:
        return None
    return int(value)


@dataclasses.dataclass(frozen=True, slots=True)
class BridgeOptions:
    max_pending_prompts_per_session: int | float = 5
    max_sessions: int | float = 32
    prompt_deadline_ms: int | None = None
    event_ring_size: int = 8000
    # The ring in bytes too (its events' envelopes): an agent's lines may be 64 MiB.
    event_ring_bytes: int = 64 * 1024 * 1024
    session_idle_timeout_ms: int = 1_800_000
    session_reap_interval_ms: int = 60_000
    permission_response_timeout_ms: int = 0
    initialize_timeout_ms: int = 10_000
    # The deadline of every other request the bridge awaits from an agent:
    # session/new, session/load, session/resume, session/fork, session/close.
    agent_request_timeout_ms: int = 30_000
    max_subscribers_per_session: int = 64
    subscriber_max_queued: int = 256
    subscriber_max_queued_bytes: int = 2 * 1024 * 1024
    # How long a cancelled or timed-out prompt may keep the FIFO busy while the
    # agent winds down before the bridge abandons the agent call.
    cancel_grace_ms: int = 5_000
    # How long past that grace a stdio agent may go on without answering the cancelled
    # turn before the bridge gives up on the agent (``bridge.abandoning``): its process
    # stopped (this session its only user) or the session detached from it, then the
    # session's agent side restored anew as after a restart.
    abandoned_turn_timeout_ms: int = 60_000
    # Content blocks per prompt; more is refused before admission (each block of a
    # prompt becomes one user_message_chunk event).
    max_prompt_blocks: int = 1024
    # Flow control: the longest a publisher that can wait waits for slow readers
    # (bus.wait_for_readers); 0 = never waits.
    subscriber_flow_wait_ms: int = 500
    # A journaled session's prompt that was running when the server stopped: "fail"
    # (its terminal is server_restarted) or "continue" (bridge.restore).
    session_on_restart: str = "fail"

    def __post_init__(self) -> None:
        validate_count_limit("max_pending_prompts_per_session", self.max_pending_prompts_per_session)
        validate_count_limit("max_sessions", self.max_sessions)
        validate_positive_ms("prompt_deadline_ms", self.prompt_deadline_ms, optional=True)
        validate_int_range("event_ring_size", self.event_ring_size, 1, 1_000_000)
        validate_int_range("event_ring_bytes", self.event_ring_bytes, 1 << 20, 1 << 40)
        validate_non_negative_ms("session_idle_timeout_ms", self.session_idle_timeout_ms)
        validate_non_negative_ms("session_reap_interval_ms", self.session_reap_interval_ms)
        validate_non_negative_ms("permission_response_timeout_ms", self.permission_response_timeout_ms)
        validate_positive_ms("initialize_timeout_ms", self.initialize_timeout_ms)
        validate_positive_ms("agent_request_timeout_ms", self.agent_request_timeout_ms)
        validate_int_range("max_subscribers_per_session", self.max_subscribers_per_session, 1, 65_536)
        validate_int_range("subscriber_max_queued", self.subscriber_max_queued, 16, 2048)
        validate_int_range("subscriber_max_queued_bytes", self.subscriber_max_queued_bytes, 1024, 1 << 30)
        validate_positive_ms("cancel_grace_ms", self.cancel_grace_ms)
        validate_positive_ms("abandoned_turn_timeout_ms", self.abandoned_turn_timeout_ms)
        validate_int_range("max_prompt_blocks", self.max_prompt_blocks, 1, 1_000_000)
        validate_non_negative_ms("subscriber_flow_wait_ms", self.subscriber_flow_wait_ms)
        if self.session_on_restart not in ("fail", "continue"):
            raise InvalidOptionError(f"Invalid session_on_restart: {self.session_on_restart!r}. "
                                     "Must be fail or continue.")

    @property
    def pending_prompt_limit(self) -> int | None:
        return limit_or_none(self.max_pending_prompts_per_session)

    @property
    def session_limit(self) -> int | None:
        return limit_or_none(self.max_sessions)

    @property
    def restore_timeout_ms(self) -> int:
        """The longest restoring a session's agent takes: its start (``initialize``),
        ``session/load``, and a ``session/new`` when the agent no longer knows it; its
        kept settings are applied again within what is left of it (``bridge.settings``)."""
        return self.initialize_timeout_ms + 2 * self.agent_request_timeout_ms
