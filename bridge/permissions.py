"""First-responder permission mediation: an agent asks, the first valid vote answers.

    mediator = PermissionMediator(timeout_ms=0)
    outcome = await mediator.request(session, params)     # publishes permission_request
    mediator.vote(request_id, {"outcome": "selected", "optionId": "allow_once"})

The API (the bridge calls ``request`` for its agents; doors reach ``vote`` through
``Bridge.respond_to_permission`` and ``is_pending`` through
``Bridge.permission_pending``):

* ``request(session, params) -> {"outcome": {...}}``: ``params`` are the agent's ACP
  ``session/request_permission`` params, kept as sent. Publishes one
  ``permission_request`` event (``bridge.events.PermissionRequest``: a fresh
  ``request_id``, the session id, the params) and waits for the answer.
* ``vote(request_id, outcome, *, session_id=None, voter_client_id=None)``: an ACP
  ``RequestPermissionOutcome`` (``{"outcome": "selected", "optionId": ...}`` or
  ``{"outcome": "cancelled"}``) from any voter (a REST client, an ``/acp`` client, the
  LMSP policy, ...).
* ``cancel_session(session, reason, prompt_id=None)`` (with ``prompt_id``: only the
  requests asked during that prompt's turn), ``count(session)``, ``asked(session)``,
  ``pending_count``, ``is_pending(request_id)``.

Contracts: the first valid vote resolves a request; a later vote, or a vote for an
unknown request (or one of another session, when ``session_id`` is given), raises
``PermissionNotFoundError``; an option id the agent did not offer raises
``InvalidPermissionOptionError`` and leaves the request pending. A timeout (when
set, reason ``timeout``), a cancel, a close, the agent's death, the end of the turn
it was asked in (reason ``turn_ended``: the agent answered its prompt) or the agent
withdrawing its request (``$/cancel_request``: the caller of ``request`` is
cancelled, reason ``request_cancelled``) resolve it as ``{"outcome": "cancelled"}``.
Each resolution publishes one ``permission_resolved``
(``bridge.events.PermissionResolved``: the outcome, the voter, the reason). At most
``MAX_PENDING_PER_SESSION`` requests wait per session; past it (or on a closing
session) a request is answered ``cancelled`` at once.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import anyio

from bridge import events as ev
from bridge.errors import InvalidPermissionOptionError, PermissionNotFoundError
from bridge.ids import uuid4_str
from bridge.status import AskedPermission

if TYPE_CHECKING:
    from bridge.session import Session

CANCELLED: dict[str, Any] = {"outcome": "cancelled"}
RESERVED_OPTION_ID = "__cancelled__"
MAX_PENDING_PER_SESSION = 64


class PendingPermission:
    __slots__ = ("request_id", "session", "params", "option_ids", "done", "outcome", "prompt_id",
                 "asked_at")

    def __init__(self, request_id: str, session: Session, params: dict[str, Any],
                 prompt_id: str | None) -> None:
        self.request_id = request_id
        self.session = session
        self.params = params
        options = params.get("options")
        self.option_ids = {o.get("optionId") for o in options if isinstance(o, dict)} \
            if isinstance(options, list) else set()
        self.done = anyio.Event()
        self.outcome: dict[str, Any] | None = None
        self.prompt_id = prompt_id
        self.asked_at = time.time()


class PermissionMediator:
    """The one registry of pending permission requests, by id and by session."""

    def __init__(self, timeout_ms: int = 0) -> None:
        self.timeout_ms = timeout_ms
        self._by_id: dict[str, PendingPermission] = {}
        self._by_session: dict[str, dict[str, PendingPermission]] = {}

    @property
    def pending_count(self) -> int:
        return len(self._by_id)

    def count(self, session: Session) -> int:
        """The session's pending requests."""
        return len(self._by_session.get(session.session_id, ()))

    def asked(self, session: Session) -> tuple[AskedPermission, ...]:
        """The session's pending requests, oldest first."""
        return tuple(AskedPermission(p.request_id, p.params, p.asked_at)
                     for p in self._by_session.get(session.session_id, {}).values())

    def is_pending(self, request_id: str) -> bool:
        return request_id in self._by_id

    def session_of(self, request_id: str) -> str | None:
        pending = self._by_id.get(request_id)
        return pending.session.session_id if pending is not None else None

    async def request(self, session: Session, params: dict[str, Any]) -> dict[str, Any]:
        """Publish the request, wait for the first valid vote; returns ``{"outcome": ...}``."""
        if session.closing or self.count(session) >= MAX_PENDING_PER_SESSION:
            return {"outcome": dict(CANCELLED)}
        request_id = uuid4_str()
        prompt_id = session.active.prompt_id if session.active is not None else None
        pending = PendingPermission(request_id, session, params, prompt_id)
        self._by_id[request_id] = pending
        self._by_session.setdefault(session.session_id, {})[request_id] = pending
        published = session.bus.publish(ev.PERMISSION_REQUEST, ev.PermissionRequest(
            request_id=request_id, session_id=session.session_id, params=params),
            prompt_id=prompt_id)
        if published is not None and published.timestamp_ms is not None:
            pending.asked_at = published.timestamp_ms / 1000   # as the journal has it
        reason = "request_cancelled"   # our caller was cancelled (the agent withdrew it)
        try:
            if self.timeout_ms:
                with anyio.move_on_after(self.timeout_ms / 1000) as waiting:
                    await pending.done.wait()
                if waiting.cancelled_caught:
                    reason = "timeout"
            else:
                await pending.done.wait()
        finally:
            if pending.outcome is None:
                self._resolve(pending, dict(CANCELLED), None, reason=reason)
        assert pending.outcome is not None
        return {"outcome": pending.outcome}

    def vote(self, request_id: str, outcome: dict[str, Any], *, session_id: str | None = None,
             voter_client_id: str | None = None) -> None:
        pending = self._by_id.get(request_id)
        if pending is None or (session_id is not None and pending.session.session_id != session_id):
            raise PermissionNotFoundError(request_id, session_id)
        if outcome.get("outcome") == "selected":
            option_id = outcome.get("optionId")
            if not isinstance(option_id, str) or option_id == RESERVED_OPTION_ID \
                    or option_id not in pending.option_ids:   # (a dict is unhashable)
                raise InvalidPermissionOptionError(request_id, str(option_id))
            resolved = {"outcome": "selected", "optionId": option_id}
        else:
            resolved = dict(CANCELLED)
        self._resolve(pending, resolved, voter_client_id)

    def cancel_session(self, session: Session, reason: str = "cancelled",
                       prompt_id: str | None = None) -> None:
        """The session's requests; with ``prompt_id``, those asked during its turn."""
        for pending in list(self._by_session.get(session.session_id, {}).values()):
            if prompt_id is None or pending.prompt_id == prompt_id:
                self._resolve(pending, dict(CANCELLED), None, reason=reason)

    def _resolve(self, pending: PendingPermission, outcome: dict[str, Any],
                 voter_client_id: str | None, reason: str | None = None) -> None:
        if pending.outcome is not None:
            return
        pending.outcome = outcome
        del self._by_id[pending.request_id]
        of_session = self._by_session[pending.session.session_id]
        del of_session[pending.request_id]
        if not of_session:
            del self._by_session[pending.session.session_id]
        pending.session.bus.publish(ev.PERMISSION_RESOLVED, ev.PermissionResolved(
            request_id=pending.request_id, session_id=pending.session.session_id,
            outcome=outcome, voter_client_id=voter_client_id, reason=reason),
            prompt_id=pending.prompt_id)
        pending.done.set()
