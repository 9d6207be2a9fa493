"""A prompt's turn on its agent: echoed, its start committed, sent, answered, stopped.

    await run_turn(session, pending)   # the FIFO worker (Session._worker), one at a time
    forward_cancel(session, pending)   # a cancel or deadline of the running turn

The turn of one admitted prompt of a ``bridge.session.Session``, which owns the prompt
(its slot, its ticket) and settles it (``Session._settle``, once, whatever the turn's
outcome). Contracts:

* A prompt runs only once its admission is committed and its session's agent side is
  there (``Session._admitted``: a restored session's first use); one settled
  meanwhile is not run.
* The prompt is echoed to readers (``user_message_chunk``, ``_meta.source =
  "bridge-echo"``) before the agent gets it. On a durable journal it reaches its agent
  only once that start (its echo) is committed, so after a crash it is known started,
  never run twice; a ``contained`` agent's (``bridge.agents.base``) at once. A store
  outage holds the turn there until the commit lands; a cancel, the deadline or a
  close ends it meanwhile, and the agent never sees it.
* A turn interrupted by a restart and continued (``bridge.restore``) carries
  ``_meta[CONTINUED_META]`` on its echo and on its ``session/prompt``.
* Whatever happens (an agent error, its death, an invalid answer, a cancel), the turn
  ends in one outcome handed to ``Session._settle``: a failed turn never blocks the
  FIFO.
* A cancel of the running turn (``forward_cancel``) ends at once a turn its agent
  does not have yet; otherwise the agent gets ACP ``session/cancel`` and at most
  ``cancel_grace_ms`` more to answer, and never once the next turn went out.
* An agent in another process (``out_of_process``: a stdio child) that lets the grace
  pass still runs that turn: it is the session's ``straggler`` until the agent answers
  it (or dies). Its updates and questions are dropped meanwhile (``bridge.agent_client``),
  and the session's next prompt is sent only after it (ACP: one prompt at a time per
  session), waiting as an unsent prompt does: a cancel, its deadline or a close ends it
  at once. So the updates of a turn given up on never show up in the next one. Once
  the session is closed (``Session.stop``) its prompt's answer is awaited
  ``cancel_grace_ms`` more, then given up (a late answer is logged and ignored).
* An agent that has not answered that turn ``abandoned_turn_timeout_ms`` later is
  given up on for the session (``bridge.abandoning``): its process stopped, or the
  session detached from it, the straggler released; the prompt that waited then runs
  once the session's agent side is restored anew (``Session.agent_side``), or fails
  with ``session_not_restorable``.
"""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel

from bridge import events as ev
from bridge.abandoning import give_up_after
from bridge.errors import (
    AgentDiedError,
    AgentError,
    JournalUnavailableError,
    SessionClosedError,
    SessionNotRestorableError,
)
from bridge.pending import DONE, QUEUED, RUNNING, PendingPrompt
from bridge.ticket import PromptResult
from bridge.wire import agent_error

if TYPE_CHECKING:
    from bridge.session import Session

log = logging.getLogger("bridge.session")

ECHO_SLICE = 64   # prompt blocks echoed between two checkpoints of the event loop
# ``_meta`` key of a continued turn's echo and ``session/prompt`` (bridge.restore).
CONTINUED_META = "acp-server/continued"


async def run_turn(session: Session, pending: PendingPrompt) -> None:
    """Run ``pending`` on the session's agent and settle it (the module's contracts)."""
    if pending.commit_seq or session.agent_side is not None \
            or session.not_restorable is not None:
        try:   # never run what was not committed, nor on an agent side not restored
            await session._admitted(pending)
        except (JournalUnavailableError, SessionNotRestorableError, SessionClosedError):
            return
        if pending.state != QUEUED:
            return
    pending.state = RUNNING
    session.active = pending
    session.turn_failure = None   # the last turn's failure: cleared as the next runs
    pending.started_at = time.monotonic()
    waited = pending.started_at - pending.admitted_at
    session._queue_wait.record(waited * 1000.0)
    session.observer.turn_started(waited)
    sid, pid = session.session_id, pending.prompt_id
    if pending.was_queued:
        session.bus.publish(ev.PENDING_PROMPT_STARTED, ev.PendingPromptStarted(
            session_id=sid, prompt_id=pid, text=pending.text), prompt_id=pid,
            originator_client_id=pending.client_id)
    echo: dict[str, Any] = {"source": "bridge-echo"}
    params: dict[str, Any] = {"sessionId": sid, "prompt": pending.prompt}
    if pending.continued is not None:   # a turn interrupted by a restart, continued
        echo[CONTINUED_META] = pending.continued
        params["_meta"] = {CONTINUED_META: pending.continued}
    outcome: PromptResult | BaseException
    unsent = True
    journal = session.journal
    # its start (the echo) committed first: after a crash the prompt is known
    # started (``session_on_restart``), never run a second time; never shed
    held = journal.durable and not getattr(session.agent, "contained", False)
    if held:
        journal.hold(sid, True)
    try:
        # One scope per turn (each costs ~2.7 µs on asyncio): shielded while the
        # prompt is echoed (bounded: FLOW_WAIT_S per stalled reader), then the
        # scope that cancels the turn (run_scope).
        with anyio.CancelScope(shield=True) as scope:
            for i, block in enumerate(pending.prompt):
                session.bus.publish(ev.SESSION_UPDATE, {"sessionId": sid, "update": {
                    "sessionUpdate": "user_message_chunk", "content": block,
                    "_meta": echo}}, prompt_id=pid, originator_client_id=pending.client_id)
                await session.bus.wait_for_readers()   # readers that keep up: never evicted
                if i % ECHO_SLICE == ECHO_SLICE - 1:
                    await anyio.lowlevel.checkpoint()   # a large prompt, in slices
            scope.shield = False
            pending.run_scope = scope
            if held:
                await session.bus.wait_released(session.bus.last_event_id)
                if session.journal is not journal:   # released by a stop, not a commit:
                    await anyio.sleep_forever()      # never sent; the close settles it
                journal.hold(sid, False)
                held = False
            if session.straggler is not None:   # the agent still runs a turn given up on
                await session.straggler.wait()
                if session.agent_side is not None:   # the agent given up on in turn
                    await session._admitted(pending)   # (bridge.abandoning): restored
            # cancelled (or past its deadline) while echoed: the agent never sees
            # it (a session/cancel it got meanwhile was for nothing)
            unsent = pending.cancel_requested or pending.state == DONE
            if not unsent:
                pending.sent = True
                if getattr(session.agent, "out_of_process", False):
                    response = await _prompt_elsewhere(session, pending, params)
                else:
                    response = await session.agent.request("session/prompt", params)
        if unsent or scope.cancelled_caught:
            outcome = PromptResult("cancelled", {"stopReason": "cancelled"})
        else:
            outcome = prompt_result(response)
    except (AgentError, AgentDiedError) as exc:
        outcome = exc
    except (SessionNotRestorableError, SessionClosedError, JournalUnavailableError) as exc:
        outcome = exc   # its restore after a give-up failed: settled already (_admitted)
    except Exception as exc:
        log.exception("session %s: prompt %s failed", sid, pid)
        outcome = agent_error(-32603, f"Internal error: {exc}")
    finally:
        if held:
            journal.hold(sid, False)
        pending.run_scope = None
        session.active = None
    session._settle(pending, outcome)


async def _prompt_elsewhere(session: Session, pending: PendingPrompt,
                            params: dict[str, Any]) -> Any:
    """``session/prompt`` to an agent in another process, asked in a task of its own:
    a turn given up on (cancelled past ``cancel_grace_ms``) leaves that task waiting
    for the agent's answer as the session's ``straggler``, for at most
    ``abandoned_turn_timeout_ms`` more (the module's contracts)."""
    agent = session.agent
    assert agent is not None
    done = anyio.Event()
    answer: list[Any] = []
    asking = anyio.CancelScope()   # the wait for its answer (ended by a give-up)
    handed = pending.handed = anyio.Event()

    async def ask() -> None:
        # A close gives the agent ``cancel_grace_ms`` more, then gives it up (``Session.
        # stop``): an agent that never answers holds no task nor request for ever.
        with session.awaited():
            try:
                if session._stopped:   # closed before this task ran: it never goes out
                    return
                handed.set()   # and, with no checkpoint between, the prompt goes out
                with asking:
                    answer.append(await agent.request("session/prompt", params))
            except Exception as exc:
                answer.append(exc)
            finally:
                done.set()
                if session.straggler is done:
                    session.straggler = None
                    if not session.closing and not agent.closed:
                        log.info("session %s: the agent ended the turn given up on",
                                 session.session_id)

    session._running().start_soon(ask)
    try:
        await done.wait()
    finally:
        if not done.is_set():   # given up on (its cancel's grace, a close)
            session.straggler = done
            if not session.closing:
                log.warning("session %s: agent %s did not end its cancelled turn within "
                            "%d ms: ended for its clients; its updates are dropped and the "
                            "next prompt waits until it ends it", session.session_id,
                            session.agent_name, session.options.cancel_grace_ms)
                session._start_side(partial(give_up_after, session, done, asking), pending)
    if not answer:   # given up on at a close (its cancel was not delivered here first)
        raise AgentDiedError("The session closed before its agent answered the prompt")
    if isinstance(answer[0], Exception):
        raise answer[0]
    return answer[0]


def prompt_result(response: Any) -> PromptResult:
    """The agent's ``session/prompt`` answer as the turn's outcome (``AgentError`` for
    one without a ``stopReason``)."""
    if not isinstance(response, dict):
        raise agent_error(-32603, f"Invalid session/prompt response: {response!r}")
    stop_reason = response.get("stopReason")
    if not isinstance(stop_reason, str):
        raise AgentError(-32603, "Invalid session/prompt response: missing stopReason")
    return PromptResult(stop_reason, response)


def forward_cancel(session: Session, pending: PendingPrompt) -> None:
    """Send ACP ``session/cancel`` and bound how long the agent may take to stop;
    a turn whose agent does not have the prompt yet (waiting for its start's
    commit) just ends."""
    if pending.run_scope is not None and not pending.sent:
        pending.run_scope.cancel()
        return
    if pending.run_scope is not None:
        pending.run_scope.deadline = min(
            pending.run_scope.deadline,
            anyio.current_time() + session.options.cancel_grace_ms / 1000)
    session._start_side(partial(_notify_cancel, session), pending)


async def _notify_cancel(session: Session, pending: PendingPrompt) -> None:
    """ACP ``session/cancel`` names the session only: sent while ``pending`` is
    still the turn running, never once the next prompt went out (its answer and the
    next ``session/prompt`` may come before this task runs)."""
    if session.agent is None:   # a restored session whose agent side never came back
        return
    if session.active is not pending:   # (a deadline settles it while it still runs)
        return
    if pending.handed is not None and not pending.handed.is_set():
        # its prompt goes out from a task of its own (``_prompt_elsewhere``) that has not
        # run yet: after it (trio runs ready tasks in any order), never before it
        await pending.handed.wait()
        if session.active is not pending:
            return
    try:
        await session.agent.notify("session/cancel", {"sessionId": session.session_id})
    except Exception as exc:  # the agent may already be gone
        log.debug("session %s: forwarding cancel failed: %s", session.session_id, exc)
