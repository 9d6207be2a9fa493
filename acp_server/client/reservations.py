"""Local per-session prompt reservations: the SDK's early-fail guard.

    reservations = PromptReservations()
    slot = reservations.reserve("s-1", limit=5)   # raises DaemonPendingPromptLimitError at 5
    try:
        ...                                         # send the prompt, await its turn
    finally:
        slot.release()                              # exactly once; later calls do nothing

Contracts: the server is the authority; this only saves a request that would be
refused. ``reserve`` and ``release`` never await, so under one event loop a check and
its increment cannot interleave with another task's. Counts never go negative and a
session whose count returns to 0 is forgotten (the table stays bounded by the
sessions with prompts in flight). ``normalize_pending_prompt_limit`` accepts exactly
what ``/capabilities`` ``limits.maxPendingPromptsPerSession`` can hold.
"""

from __future__ import annotations

import math
from types import TracebackType
from typing import Any

from acp_server.client.errors import DaemonPendingPromptLimitError

DEFAULT_MAX_PENDING_PROMPTS_PER_SESSION = 5


def normalize_pending_prompt_limit(value: Any) -> int | None:
    """``None``, ``0`` and ``math.inf`` → ``None`` (no local cap); a positive ``int`` →
    itself. Anything else (negative, fraction, NaN, bool, str…) → ``ValueError``."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"bad max_pending_prompts_per_session: {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"bad max_pending_prompts_per_session: {value!r}")
        return value or None
    if isinstance(value, float) and value == math.inf:
        return None
    raise ValueError(f"bad max_pending_prompts_per_session: {value!r}")


class Reservation:
    """One reserved slot. ``release()`` is idempotent; usable as a (sync) context
    manager that releases on exit."""

    __slots__ = ("_owner", "released", "session_id")

    def __init__(self, owner: PromptReservations, session_id: str) -> None:
        self._owner = owner
        self.session_id = session_id
        self.released = False

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        self._owner._decrement(self.session_id)

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


class PromptReservations:
    """Per-session counters of locally reserved prompt slots."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}

    def count(self, session_id: str) -> int:
        return self._counts.get(session_id, 0)

    @property
    def total(self) -> int:
        return sum(self._counts.values())

    def reserve(self, session_id: str, limit: int | None) -> Reservation:
        """Take a slot or raise ``DaemonPendingPromptLimitError`` (``limit`` ``None`` =
        no cap)."""
        current = self._counts.get(session_id, 0)
        if limit is not None and current >= limit:
            raise DaemonPendingPromptLimitError(session_id, limit, current)
        self._counts[session_id] = current + 1
        return Reservation(self, session_id)

    def _decrement(self, session_id: str) -> None:
        current = self._counts.get(session_id, 0) - 1
        if current > 0:
            self._counts[session_id] = current
        else:
            self._counts.pop(session_id, None)
