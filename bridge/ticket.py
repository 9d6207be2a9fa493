"""What ``Bridge.send_prompt`` hands back: a ``PromptTicket``.

    ticket = bridge.send_prompt(session_id, [{"type": "text", "text": "hi"}])
    ticket.prompt_id, ticket.last_event_id, ticket.epoch   # subscribe from here
    result = await ticket            # PromptResult(stop_reason="end_turn", ...)

Awaiting the ticket returns a ``PromptResult`` (a cancelled prompt is a result with
``stop_reason == "cancelled"``) or raises the prompt's error (``AgentError``,
``AgentDiedError``, ``PromptDeadlineExceededError``, ``SessionClosedError``). A ticket
settles exactly once; its pending slot is released at that moment. With a durable
session journal a door awaits ``ticket.committed()`` before it acknowledges.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Generator
from typing import Any

import anyio
import anyio.lowlevel


@dataclasses.dataclass(frozen=True, slots=True)
class PromptResult:
    stop_reason: str
    response: dict[str, Any]


class PromptTicket:
    __slots__ = ("prompt_id", "session_id", "last_event_id", "epoch", "_done",
                 "_outcome", "_cancel", "_commit")

    def __init__(self, prompt_id: str, session_id: str, last_event_id: int, epoch: str,
                 cancel: Callable[[str | None], None]) -> None:
        self.prompt_id = prompt_id
        self.session_id = session_id
        self.last_event_id = last_event_id
        self.epoch = epoch
        # made by the first ``result()`` only: a door that answers 202 never awaits it
        self._done: anyio.Event | None = None
        self._outcome: PromptResult | BaseException | None = None
        self._cancel = cancel
        # With a durable journal: awaits the commit of the accepted prompt (see
        # ``committed``); ``None`` when there is nothing to wait for.
        self._commit: Callable[[], Awaitable[None]] | None = None

    async def committed(self) -> None:
        """Return once the accepted prompt is committed to the session journal (at
        once without a durable one). Raises ``JournalUnavailableError`` when the
        commit failed: the prompt is then settled with that error, its slot released.
        A door awaits this before it acknowledges the prompt."""
        if self._commit is not None:
            await self._commit()

    @property
    def done(self) -> bool:
        return self._outcome is not None

    @property
    def outcome(self) -> PromptResult | BaseException | None:
        return self._outcome

    def cancel(self, reason: str | None = None) -> None:
        """Queued: dropped without reaching the agent. Running: ACP ``session/cancel``."""
        if self._outcome is None:
            self._cancel(reason)

    async def result(self) -> PromptResult:
        if self._outcome is None:   # (no await between this check and the wait)
            if self._done is None:
                self._done = anyio.Event()
            await self._done.wait()
        else:
            await anyio.lowlevel.checkpoint()   # as the set event's wait() did
        outcome = self._outcome
        if isinstance(outcome, BaseException):
            raise outcome
        assert outcome is not None
        return outcome

    def __await__(self) -> Generator[Any, None, PromptResult]:
        return self.result().__await__()

    def _settle(self, outcome: PromptResult | BaseException) -> bool:
        """Record the outcome; ``False`` when the ticket had already settled."""
        if self._outcome is not None:
            return False
        self._outcome = outcome
        if self._done is not None:
            self._done.set()
        return True
