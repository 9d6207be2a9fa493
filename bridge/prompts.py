"""The prompt and question half of the ``Bridge`` API: admission, cancel, the pending
list, and the answers to an agent's permission requests and elicitations.

    ticket = bridge.send_prompt(session_id, [{"type": "text", "text": "hi"}])
    bridge.remove_pending_prompt(session_id, ticket.prompt_id)      # queued or running
    bridge.prompt_ticket(session_id, prompt_id)     # a pending prompt's ticket, or None
    bridge.prompt_terminal(session_id, prompt_id)   # how it ended (bridge.status), or None
    bridge.respond_to_permission(request_id, {"outcome": "selected", "optionId": "allow"})
    bridge.respond_to_elicitation(request_id, {"action": "accept", "content": {...}})

``Bridge`` inherits these; they use only what every ``Bridge`` has (``get_session``,
``options``, the two mediators). Contracts: ``send_prompt`` is synchronous (see
``bridge.session``: admission cannot race); every lookup of an unknown or closed
session raises ``SessionNotFoundError``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bridge.cancel import CancelToken
from bridge.errors import (
    InvalidClientIdError,
    InvalidDeadlineError,
    InvalidPromptError,
    PromptNotFoundError,
    TooManyContentBlocksError,
)
from bridge.session import QUEUED
from bridge.status import PendingPromptInfo, PromptTerminal
from bridge.terminals import Terminals
from bridge.ticket import PromptTicket

if TYPE_CHECKING:
    from bridge.elicitation import ElicitationMediator
    from bridge.options import BridgeOptions
    from bridge.permissions import PermissionMediator
    from bridge.session import Session


class PromptsAPI:
    options: BridgeOptions
    permissions: PermissionMediator
    elicitations: ElicitationMediator

    _sessions: dict[str, Session]
    _closed_terminals: dict[str, Terminals]

    def get_session(self, session_id: str) -> Session:
        raise NotImplementedError   # Bridge's

    # -- prompts -------------------------------------------------------------------------
    def send_prompt(self, session_id: str, prompt: list[Any], *, prompt_id: str | None = None,
                    deadline_ms: int | None = None, cancel: CancelToken | None = None,
                    client_id: str | None = None) -> PromptTicket:
        """Admit a prompt or raise, synchronously (see the module contract). Checked in
        this order: the prompt and the deadline (``check_prompt``), the session, the
        client id (``InvalidClientIdError``), then ``Session.admit``."""
        self.check_prompt(prompt, deadline_ms)
        session = self._client_checked(session_id, client_id)
        return session.admit(prompt, prompt_id, self._effective_deadline(deadline_ms), client_id,
                             cancel)

    def check_prompt(self, prompt: Any, deadline_ms: Any = None) -> None:
        """Raise what ``send_prompt`` raises for the prompt itself (``InvalidPromptError``,
        ``TooManyContentBlocksError``) or its deadline (``InvalidDeadlineError``)."""
        if not isinstance(prompt, list) or not prompt \
                or not all(isinstance(block, dict) for block in prompt):
            raise InvalidPromptError()
        if len(prompt) > self.options.max_prompt_blocks:
            raise TooManyContentBlocksError(len(prompt), self.options.max_prompt_blocks)
        if deadline_ms is not None and not _positive_ms(deadline_ms):
            raise InvalidDeadlineError(deadline_ms)

    def _effective_deadline(self, requested_ms: int | None) -> int | None:
        server_ms = self.options.prompt_deadline_ms
        if server_ms is None:
            return None
        return min(server_ms, requested_ms) if requested_ms is not None else server_ms

    async def cancel_session(self, session_id: str, *, reason: str = "client_cancel") -> bool:
        """Cancel the active prompt only (queued prompts still run) and the session's
        pending permission requests; forwards ACP ``session/cancel``. ``True`` if a
        prompt was running."""
        return self.get_session(session_id).cancel_active(reason,
                                                          permission_reason="prompt_cancelled")

    def pending_prompts(self, session_id: str) -> list[PendingPromptInfo]:
        return [p.info() for p in self.get_session(session_id).pending.values()]

    def remove_pending_prompt(self, session_id: str, prompt_id: str) -> str:
        """Drop a queued prompt (slot freed) or cancel the running one. Returns the
        state it was in (``queued`` or ``running``)."""
        session = self.get_session(session_id)
        pending = session.pending.get(prompt_id)
        if pending is None:
            raise PromptNotFoundError(session_id, prompt_id)
        state = pending.state
        session.cancel_prompt(prompt_id, "removed" if state == QUEUED else "client_cancel")
        return state

    def prompt_ticket(self, session_id: str, prompt_id: str) -> PromptTicket | None:
        """The ticket of a pending (queued or running) prompt, else ``None``."""
        pending = self.get_session(session_id).pending.get(prompt_id)
        return pending.ticket if pending is not None else None

    def prompt_terminal(self, session_id: str, prompt_id: str) -> PromptTerminal | None:
        """How the prompt ended (its latest terminal), else ``None``; ``None`` too for
        a prompt refused at admission (``bridge.status.REFUSED_CODES``: it never ran,
        and its id may be admitted again)."""
        return self.get_session(session_id).prompt_terminals.latest(prompt_id)

    def admitted_prompt(self, session_id: str, prompt_id: str) -> bool:
        """Whether the live session admitted a prompt under ``prompt_id`` already
        (pending, or ended: not refused at admission): sent again, it admits nothing
        new (the doors let it past their rate limits). ``False`` for a session that is
        not live."""
        session = self._sessions.get(session_id)
        return session is not None and (prompt_id in session.pending
                                        or session.prompt_terminals.latest(prompt_id)
                                        is not None)

    def ended_prompt_terminal(self, session_id: str, prompt_id: str) -> PromptTerminal | None:
        """How a prompt of a session that is no longer live ended (its agent died, it
        was closed: the terminals the bridge keeps of closed sessions), else ``None``
        (also for a live session: ``prompt_terminal``)."""
        terminals = self._closed_terminals.get(session_id)
        if terminals is None or session_id in self._sessions:
            return None
        return terminals.latest(prompt_id)

    def check_client(self, session_id: str, client_id: str | None) -> None:
        """``InvalidClientIdError`` when ``client_id`` is not one of the session's (as
        ``send_prompt`` checks it); ``SessionNotFoundError`` for an unknown session."""
        self._client_checked(session_id, client_id)

    def _client_checked(self, session_id: str, client_id: str | None) -> Session:
        session = self.get_session(session_id)
        if client_id is not None and not session.knows_client(client_id):
            raise InvalidClientIdError(session_id, client_id)
        return session

    # -- questions: permission requests and elicitations ---------------------------------
    def respond_to_permission(self, request_id: str, outcome: dict[str, Any], *,
                              session_id: str | None = None,
                              voter_client_id: str | None = None) -> None:
        if session_id is not None:
            self.get_session(session_id)
        self.permissions.vote(request_id, outcome, session_id=session_id,
                              voter_client_id=voter_client_id)

    def respond_to_elicitation(self, request_id: str, answer: dict[str, Any], *,
                               session_id: str | None = None) -> None:
        """First responder wins (``bridge.elicitation``)."""
        if session_id is not None:
            self.get_session(session_id)
        self.elicitations.respond(request_id, answer, session_id=session_id)

    def permission_pending(self, request_id: str) -> bool:
        """The permission request ``request_id`` still waits for a vote."""
        return self.permissions.is_pending(request_id)

    def permission_session(self, request_id: str) -> str | None:
        """The session of the pending permission request ``request_id``, else ``None``."""
        return self.permissions.session_of(request_id)

    def elicitation_pending(self, request_id: str) -> bool:
        """The elicitation ``request_id`` still waits for an answer."""
        return self.elicitations.is_pending(request_id)


def _positive_ms(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= 2**31 - 1
