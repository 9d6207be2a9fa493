"""First-responder mediation of ACP ``elicitation/create`` (agent → client), the way
``permissions`` mediates permission requests.

    mediator = ElicitationMediator(timeout_ms=600_000)
    answer = await mediator.request(session, params)   # publishes elicitation_request
    mediator.respond(request_id, {"action": "accept", "content": {"name": "x"}})
    mediator.complete(session, {"elicitationId": "e-1"})   # publishes elicitation_complete

Contracts: the first valid answer resolves a request; a later answer, or one for an
unknown request, raises ``ElicitationNotFoundError``; an answer whose ``action`` is not
a string (``accept``, ``decline``, ``cancel``, or an extension) raises
``InvalidElicitationAnswerError`` and leaves it pending. A timeout (``timeout_ms``,
always set: an elicitation nobody answers must not hold a turn forever), a cancel, a
close or the agent's death resolve it as ``{"action": "cancel"}``. Each resolution
publishes one ``elicitation_resolved``. The agent's ``elicitation/complete`` (a URL
elicitation finished) is published as ``elicitation_complete``, its params unchanged.
The events are typed (``bridge.events.ElicitationRequest``, ``ElicitationResolved``,
``ElicitationComplete``); their wire shape is ``bridge.wire``'s.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import anyio

from bridge import events as ev
from bridge.errors import BridgeError
from bridge.ids import uuid4_str

if TYPE_CHECKING:
    from bridge.session import Session

CANCEL: dict[str, Any] = {"action": "cancel"}
DEFAULT_TIMEOUT_MS = 600_000
MAX_PENDING_PER_SESSION = 16
MAX_REMEMBERED = 1024

ELICITATION_COMPLETE = ev.ELICITATION_COMPLETE
ELICITATION_REQUEST = ev.ELICITATION_REQUEST
ELICITATION_RESOLVED = ev.ELICITATION_RESOLVED


class ElicitationNotFoundError(BridgeError, LookupError):
    code = "elicitation_not_found"

    def __init__(self, request_id: str) -> None:
        super().__init__(f'No pending elicitation with id "{request_id}"')
        self.request_id = request_id


class InvalidElicitationAnswerError(BridgeError, ValueError):
    code = "invalid_elicitation_answer"

    def __init__(self, request_id: str) -> None:
        super().__init__(f'Invalid answer to elicitation "{request_id}": "action" must be '
                         'a string ("accept", "decline", "cancel")')
        self.request_id = request_id


class _Pending:
    __slots__ = ("request_id", "session", "done", "answer", "prompt_id")

    def __init__(self, request_id: str, session: Session, prompt_id: str | None) -> None:
        self.request_id = request_id
        self.session = session
        self.done = anyio.Event()
        self.answer: dict[str, Any] | None = None
        self.prompt_id = prompt_id


class ElicitationMediator:
    def __init__(self, timeout_ms: int = 0) -> None:
        self.timeout_ms = timeout_ms or DEFAULT_TIMEOUT_MS
        self._by_id: dict[str, _Pending] = {}
        # A URL elicitation's id -> its session's id, for elicitation/complete (which
        # names only the elicitation). Bounded: the oldest go first. Ids, not sessions:
        # a closed session (its event ring) is not kept alive by it.
        self._sessions: OrderedDict[str, str] = OrderedDict()

    @property
    def pending_count(self) -> int:
        return len(self._by_id)

    def is_pending(self, request_id: str) -> bool:
        return request_id in self._by_id

    def _of(self, session: Session) -> list[_Pending]:
        return [p for p in self._by_id.values() if p.session is session]

    async def request(self, session: Session, params: dict[str, Any]) -> dict[str, Any]:
        """Publish the request, wait for the first valid answer (or the timeout)."""
        if session.closing or len(self._of(session)) >= MAX_PENDING_PER_SESSION:
            return dict(CANCEL)
        request_id = uuid4_str()
        prompt_id = session.active.prompt_id if session.active is not None else None
        pending = self._by_id[request_id] = _Pending(request_id, session, prompt_id)
        elicitation_id = params.get("elicitationId")
        if isinstance(elicitation_id, str):
            self._sessions[elicitation_id] = session.session_id
            while len(self._sessions) > MAX_REMEMBERED:
                self._sessions.popitem(last=False)
        session.bus.publish(ELICITATION_REQUEST, ev.ElicitationRequest(
            request_id=request_id, session_id=session.session_id, params=params),
            prompt_id=prompt_id)
        reason = "request_cancelled"   # our caller was cancelled (the agent withdrew it)
        try:
            with anyio.move_on_after(self.timeout_ms / 1000) as waiting:
                await pending.done.wait()
            if waiting.cancelled_caught:
                reason = "timeout"
        finally:
            if pending.answer is None:
                self._resolve(pending, dict(CANCEL), reason=reason)
        assert pending.answer is not None
        return pending.answer

    def respond(self, request_id: str, answer: dict[str, Any], *,
                session_id: str | None = None) -> None:
        pending = self._by_id.get(request_id)
        if pending is None or (session_id is not None
                               and pending.session.session_id != session_id):
            raise ElicitationNotFoundError(request_id)
        if not isinstance(answer, dict) or not isinstance(answer.get("action"), str):
            raise InvalidElicitationAnswerError(request_id)
        self._resolve(pending, answer)

    def session_of(self, elicitation_id: Any) -> str | None:
        """The session id of a URL elicitation (by its ``elicitationId``)."""
        return self._sessions.get(elicitation_id) if isinstance(elicitation_id, str) else None

    def complete(self, session: Session, params: dict[str, Any]) -> None:
        session.bus.publish(ELICITATION_COMPLETE, ev.ElicitationComplete(
            session_id=session.session_id, params=params))

    def cancel_session(self, session: Session, reason: str = "cancelled",
                       prompt_id: str | None = None) -> None:
        """The session's requests; with ``prompt_id``, those asked during its turn."""
        for pending in self._of(session):
            if prompt_id is None or pending.prompt_id == prompt_id:
                self._resolve(pending, dict(CANCEL), reason=reason)

    def _resolve(self, pending: _Pending, answer: dict[str, Any],
                 reason: str | None = None) -> None:
        if pending.answer is not None:
            return
        pending.answer = answer
        del self._by_id[pending.request_id]
        pending.session.bus.publish(ELICITATION_RESOLVED, ev.ElicitationResolved(
            request_id=pending.request_id, session_id=pending.session.session_id,
            action=answer.get("action"), reason=reason))
        pending.done.set()


__all__ = ["CANCEL", "ELICITATION_COMPLETE", "ELICITATION_REQUEST", "ELICITATION_RESOLVED",
           "ElicitationMediator", "ElicitationNotFoundError", "InvalidElicitationAnswerError"]
