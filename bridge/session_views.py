"""What a session reports: its ``SessionInfo`` (a create, attach, load, resume or branch
answers it) and its ``SessionStatus``, built from its state.

    info = session_info(session, attached=False)        # a new client id registered
    status = session_status(session, pending_permissions=0)

Contracts: ``session_info`` registers a new client id and touches the session; both
report as ``last_event_id`` the last event readers may see (``EventBus.released_id``:
on a durable journal the last committed); nothing else changes.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from bridge.status import AskedPermission, SessionHistory, SessionInfo, SessionStatus

if TYPE_CHECKING:
    from bridge.session import Session


def session_info(session: Session, attached: bool,
                 history: SessionHistory | None = None) -> SessionInfo:
    """What a create, attach, load, resume or branch answers (a new client id). Its
    ``last_event_id``, as ``session_status``'s, is the last one readers may see
    (``EventBus.released_id``: on a durable journal, the last committed): an event
    held in a store outage is not yet the session's, and a client resuming from it
    after a restart would skip the one that takes its id."""
    session.touch()
    return SessionInfo(
        session_id=session.session_id, workspace_cwd=session.workspace_cwd,
        attached=attached, client_id=session.register_client(), created_at=session.created_at,
        event_epoch=session.bus.epoch,
        last_event_id=session.bus.released_id if history is None else history.last_event_id,
        has_active_prompt=session.pending_count > 0, forked_from=session.forked_from,
        agent=session.agent_name, agent_result=session.agent_result,
        history=history)


def session_status(session: Session, pending_permissions: int,
                   asked: tuple[AskedPermission, ...] = ()) -> SessionStatus:
    active = session.active
    return SessionStatus(
        session_id=session.session_id, workspace_cwd=session.workspace_cwd,
        created_at=session.created_at, client_count=len(session.clients),
        active_prompt_id=active.prompt_id if active else None,
        pending_prompts=session.pending_count, queued_prompts=session.queued_count,
        pending_permissions=pending_permissions, subscribers=session.bus.subscriber_count,
        last_event_id=session.bus.released_id, event_epoch=session.bus.epoch,
        agent=session.agent_name, max_pending_prompts=session.limit,
        active_prompt_text=active.text if active else None,
        updated_at=session.journaled_activity if session.journaled_activity is not None
        else time.time() - max(0.0, time.monotonic() - session.last_seen),
        origin=session.origin, earliest_event_id=session.bus.earliest_available_id,
        turn_ended_at=session.turn_ended_at, turn_failure=session.turn_failure, asked=asked,
        display_name=session.display_name)
