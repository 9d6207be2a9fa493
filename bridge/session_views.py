"""What a session reports: its ``SessionInfo`` (a create, attach, load, resume or branch
answers it) and its ``SessionStatus``, built from its state.

    info = session_info(session, attached=False)        # a new client id registered
    status = session_status(session, pending_permissions=0)

Contracts: ``session_info`` registers a new client id and touches the session; both
report as ``last_event_id`` the last event readers may see (``EventBus.released_id``:
on a durable journal the last committed); nothing else changes. A prompt settled whose
terminal events readers cannot see yet (held until committed: ``HeldTurn``) is
reported as still running, with the last turn's end and failure readers saw, so that a
status never runs ahead of the stream and ``/load``.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

from bridge.pending import DONE
from bridge.status import (
    AskedPermission,
    SessionHistory,
    SessionInfo,
    SessionStatus,
    TurnFailure,
)

if TYPE_CHECKING:
    from bridge.pending import PendingPrompt
    from bridge.session import Session


@dataclasses.dataclass(frozen=True, slots=True)
class HeldTurn:
    """A turn settled whose terminal events are not released to readers yet (a durable
    journal holds them until committed): its last event id, its prompt and the last
    turn's end and failure readers saw before it."""

    through: int
    prompt_id: str
    text: str
    turn_ended_at: float | None
    turn_failure: TurnFailure | None


def hold_turn(session: Session, pending: PendingPrompt, turn_ended_at: float | None,
              turn_failure: TurnFailure | None) -> None:
    """Called by ``Session._settle`` after publishing the terminal of a prompt that ran
    (only such a prompt was acknowledged and seen pending: a refused one never was)
    when readers cannot see it yet."""
    turn = HeldTurn(session.bus.last_event_id, pending.prompt_id, pending.text,
                    turn_ended_at, turn_failure)
    held = held_turns(session)
    if held:
        held.append(turn)
    else:
        session.held_turns = [turn]


def held_turns(session: Session) -> list[HeldTurn] | None:
    """The session's turns settled that readers cannot see end yet, oldest first (those
    released dropped), else ``None``."""
    held = session.held_turns
    if held is not None:
        released = session.bus.released_id
        while held and held[0].through <= released:
            del held[0]
        if not held:
            session.held_turns = held = None
    return held


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
        has_active_prompt=session.pending_count > 0 or held_turns(session) is not None,
        forked_from=session.forked_from,
        agent=session.agent_name, agent_result=session.agent_result,
        history=history)


def session_status(session: Session, pending_permissions: int,
                   asked: tuple[AskedPermission, ...] = ()) -> SessionStatus:
    active, held = session.active, held_turns(session)
    active_id = active.prompt_id if active else None
    active_text = active.text if active else None
    pending, queued = session.pending_count, session.queued_count
    ended, failure = session.turn_ended_at, session.turn_failure
    if held is not None:   # what readers see: the first running, any other queued
        first = held[0]
        pending += len(held)
        # the active prompt queued behind it, unless settled (one of the held: a prompt
        # past its deadline settles while its agent still runs the turn)
        queued += len(held) - 1 + (active is not None and active.state != DONE)
        active_id, active_text = first.prompt_id, first.text
        ended, failure = first.turn_ended_at, first.turn_failure
    return SessionStatus(
        session_id=session.session_id, workspace_cwd=session.workspace_cwd,
        created_at=session.created_at, client_count=len(session.clients),
        active_prompt_id=active_id, pending_prompts=pending, queued_prompts=queued,
        pending_permissions=pending_permissions, subscribers=session.bus.subscriber_count,
        last_event_id=session.bus.released_id, event_epoch=session.bus.epoch,
        agent=session.agent_name, max_pending_prompts=session.limit,
        active_prompt_text=active_text,
        updated_at=session.journaled_activity if session.journaled_activity is not None
        else time.time() - max(0.0, time.monotonic() - session.last_seen),
        origin=session.origin, earliest_event_id=session.bus.earliest_available_id,
        turn_ended_at=ended, turn_failure=failure, asked=asked,
        display_name=session.display_name)
