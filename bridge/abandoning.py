"""Giving up on an agent that never ends a cancelled turn.

    give_up_after(session, pending, done, asking)   # bridge.turn, as a turn is given up on

A cancelled turn its stdio agent does not end within ``cancel_grace_ms`` ends for the
session's clients, and stays the session's ``straggler`` (``bridge.turn``): the next
prompt waits for the agent to end it (ACP: one prompt at a time per session). An agent
that never does (hung, hostile) would hold the session for ever. Contracts:

* Past ``abandoned_turn_timeout_ms`` more (anyio's clock), with the straggler still
  there and the session still open, the bridge gives up on the agent, for this
  session only (``give_up``):

  - the session's agent side is to be restored anew (``Session.agent_side``, as after a
    restart: ``bridge.restore.AgentSideRestore``), so the agent's death neither ends the
    session nor fails its prompts;
  - ``agent_abandoned`` is published on its bus (``action`` ``agent_stopped`` or
    ``session_detached``, the prompt given up on, the time waited), and the bridge's
    observer told (``agent_abandoned``: the metric
    ``acp_server_agent_abandoned_total{action}``);
  - when no other session uses the agent's connection (no live session on it, no
    session being made on its name), its process is stopped (``aclose``: stdin closed,
    SIGTERM, SIGKILL; bounded) and the next use starts it anew (``agent_stopped``);
    otherwise the process stays for the others, and only this session lets go of it:
    the wait for that turn's answer ends (a late answer is an unknown id, ignored) and
    the agent gets ``session/close`` when it offers it (``session_detached``);
  - the straggler is released: the prompt that waited (and every later one) runs once
    the agent side is restored (``session/load`` when the agent offers it, else
    ``session/new`` under the same id seeded with the transcript), or fails with
    ``session_not_restorable`` when neither works, and the session refuses prompts
    from then on (its history stays readable), as a session restored at a start.
* Other sessions are not touched: a shared process is never stopped, and its
  other sessions' turns go on.
* The give-up runs in the bridge's task group (a close of the session meanwhile does
  not cut a process's stop short); the timer is the session's, ended by its stop.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import anyio

from bridge import events as ev

if TYPE_CHECKING:
    from bridge.bridge import Bridge
    from bridge.pending import PendingPrompt
    from bridge.session import Session

log = logging.getLogger("bridge.session")

AGENT_STOPPED = "agent_stopped"
SESSION_DETACHED = "session_detached"


async def give_up_after(session: Session, done: anyio.Event, asking: anyio.CancelScope,
                        pending: PendingPrompt) -> None:
    """The session's timer for the turn ``pending`` given up on (``done``: set when
    its agent answers it; ``asking``: the wait for that answer): past
    ``abandoned_turn_timeout_ms``, the session's ``on_abandoned`` (the bridge's
    ``give_up``)."""
    started = anyio.current_time()
    with anyio.move_on_after(session.options.abandoned_turn_timeout_ms / 1000):
        await done.wait()
        return
    if session.straggler is not done or session.closing or done.is_set():
        return
    waited_ms = int((anyio.current_time() - started) * 1000)
    session.on_abandoned(session, pending.prompt_id, done, asking, waited_ms)


def shared(bridge: Bridge, session: Session) -> bool:
    """Whether anything else may be using ``session``'s agent connection: another live
    session on it, or a session being made on its agent's name (its slot taken, not
    registered yet)."""
    agent, name = session.agent, session.agent_name
    live = 0
    for other in bridge._sessions.values():
        if other is not session and other.agent is agent:
            return True
        if other.holds_slot and other.agent_name == name:
            live += 1
    return bridge.capacity.held(name) > live


async def give_up(bridge: Bridge, session: Session, prompt_id: str | None, done: anyio.Event,
                  asking: anyio.CancelScope, waited_ms: int) -> None:
    """Give up on ``session``'s agent (the module's contracts)."""
    from bridge.restore import AgentSideRestore   # (bridge.restore imports bridge.session)

    agent = session.agent
    if session.straggler is not done or session.closing or agent is None or agent.closed:
        return
    sid = session.session_id
    action = SESSION_DETACHED if shared(bridge, session) else AGENT_STOPPED
    log.warning("session %s: agent %s has not ended its cancelled turn %s ms after its "
                "grace: given up on (%s); the session's agent side is restored anew",
                sid, session.agent_name, waited_ms, action)
    session.agent_side = AgentSideRestore(bridge, session).ensure
    message = (f"agent {session.agent_name!r} did not end the cancelled turn within "
               f"{waited_ms} ms of its grace: " +
               ("its process was stopped" if action == AGENT_STOPPED else
                "the session was detached from it (other sessions share its process)") +
               "; the next prompt runs on the session restored anew")
    session.bus.publish(ev.AGENT_ABANDONED, ev.AgentAbandoned(
        session_id=sid, action=action, waited_ms=waited_ms, message=message,
        prompt_id=prompt_id), prompt_id=prompt_id)
    bridge.observer.agent_abandoned(session.agent_name, action)
    with anyio.CancelScope(shield=True):
        try:
            if action == AGENT_STOPPED:
                await agent.aclose()   # bounded: stdin closed, SIGTERM, SIGKILL
            else:
                if bridge.agents.capability(session.agent_name, "sessionCapabilities",
                                            "close") is not None:
                    await bridge._agent_request(agent, "session/close", {"sessionId": sid})
        except Exception as exc:   # noqa: BLE001 - the agent's business: we let go of it
            log.debug("session %s: letting go of agent %s: %s", sid, session.agent_name, exc)
        finally:
            asking.cancel()   # its answer, should it come, is an unknown id
            if session.straggler is done:
                session.straggler = None
            done.set()   # the prompt that waited goes on (its agent side restored first)
