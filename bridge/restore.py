"""Sessions back from the journal at start-up (``Bridge.__aenter__``).

    restored = await restore_sessions(bridge, await bridge.journal.restore())
    session = await restore_session(bridge, found)   # one RestoredSession (issue #24 adopts)

For each journaled session that was not closed, in creation order:

* the bridge side comes back at once: its record (id, agent, cwd, creation time,
  ``forked_from``), its last activity (its ``updated_at`` in the listings until it
  is next used, not the restart's time), its event ring, last event id and epoch (a
  new epoch when the journal lost events: readers get ``state_resync_required``,
  never a silent gap),
  its prompt terminals (a new epoch is journaled at once: the next start keeps it,
  ``RestoredSession.gap`` is set by the journal, see ``acp_server.store.sessions``
  for when). List, history, events and status need nothing more;
* the agent side is restored on first use (``Session.agent_side``), never at start:
  the first prompt (before its acknowledgement, or before it runs when it was queued
  at the stop), a load or resume, a fork, a forwarded request. Concurrent first users
  share one restore, owned by the bridge's task group (a caller that gives up does
  not abort it). It is ``session/load`` when the agent offers it (its replay is not
  published again: the journal has the events), else, or when the agent does not
  know the session, a fresh ``session/new`` under the same id
  (``acp-server/requestedSessionId``) seeded with the journal's transcript
  (``bridge.transcript``, ``acp-server/transcript``: the reference and model agents
  take it, so the next turn has the conversation). An agent that dies as it is asked
  is started anew and asked once more (its death neither ends the session nor fails
  the prompt that waits for the restore). The settings the session kept are then asked
  of the agent again (``bridge.settings``) within what is left of
  ``BridgeOptions.restore_timeout_ms`` since the restore began (the start, the load
  and the new have their own deadlines, which add up to it): one restore, one bound
  (an agent that died and is asked once more may take longer). When neither works the session
  keeps its readable history and refuses prompts with ``SessionNotRestorableError``
  (``session_not_restorable``, a 409: the one that found out, and every later one);
  so does a session whose agent is not configured (another agent never takes over its
  conversation: a model its model server does not list, an ``--agent`` renamed). With
  an ``agent_finder`` (``--model-server``, ``bridge.agents.catalog``) that refusal is
  not for ever: each first use while the agent is missing asks the finder to list
  again (rate-limited) and is refused (409) only while it still is missing; once the
  agent is offered, the next use restores the agent side as above. Without a finder
  it is refused for good. Its slot is held on its own agent's name, missing or not
  (``bridge.capacity``), never on another agent's share;
* a ``single``-scope session is its agent's default session again (the newest, when
  there are several: ``Bridge.attach_session`` replaces a default its agent cannot
  restore with a new one);
* a permission request or elicitation still open is resolved as cancelled (reason
  ``server_restarted``), at once: the turn that asked is gone;
* its prompts: one with a cancel in the journal (acknowledged, its turn's end lost)
  ends cancelled, at once; the one that was running when the server stopped follows
  ``BridgeOptions.session_on_restart``: ``fail`` gives it its terminal with
  ``ServerRestartedError`` (``server_restarted``) at once; ``continue`` runs it again,
  first, under its prompt id, marked ``_meta["acp-server/continued"] = {"reason":
  "server_restarted"}`` on its echo and on its ``session/prompt``. An agent that
  restored its session by ``session/load`` (it has the turn so far) is asked to
  continue it (``CONTINUE_TEXT``); one that came back through ``session/new`` gets
  the prompt again (and a transcript without that turn); one that could not be
  restored fails it with ``server_restarted``. A turn is continued once: one whose
  continued run had started (its marked echo is journaled) fails with
  ``server_restarted`` at the next start (no crash loop on a turn that brings the
  server down). The queued ones take their slots back
  and run in their order (their first one restores the agent side), or fail with
  ``session_not_restorable``.

A closed session's prompt terminals are kept for a later cold load. A failure to
restore one session is logged with its id and never stops the start; it is all or
nothing: the session is not live nor listed, holds no slot, and its journal is left as
it was (nothing it would have journaled is written), so the next start tries again.

A closed session the journal keeps (agent death, idle timeout), loaded again when its
agent cannot load it, is seeded the same way (``reseed_closed``): a fresh
``session/new`` under its id with the transcript, its conversation published again
as the new life's first events.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from bridge import events as ev
from bridge.errors import (
    AgentDiedError,
    AgentError,
    BridgeError,
    NotSupportedError,
    ServerRestartedError,
    SessionIdNotHonoredError,
    SessionLimitExceededError,
    SessionNotFoundError,
)
from bridge.ids import uuid4_str
from bridge.journal import EventRecord, EventsReset, RestoredSession
from bridge.jsonrpc import RESOURCE_NOT_FOUND
from bridge.session import NO_JOURNAL, QUEUED, Session
from bridge.settings import apply_again
from bridge.spawning import REQUESTED_SESSION_ID_META, spawn
from bridge.terminals import Terminals
from bridge.ticket import PromptResult
from bridge.transcript import TRANSCRIPT_META, after_seed, transcript
from bridge.turn import CONTINUED_META
from bridge.wire import envelope

if TYPE_CHECKING:
    from bridge.bridge import Bridge

log = logging.getLogger("bridge.restore")

RESTARTED = "server_restarted"
CONTINUE_TEXT = ("The server restarted while you were answering the previous prompt; your "
                 "turn was interrupted. Continue it from where it stopped.")


async def restore_sessions(bridge: Bridge, journaled: list[RestoredSession]) -> list[str]:
    """Bring ``journaled`` back (see the module docstring); the ids restored live."""
    restored: list[str] = []
    for found in journaled:
        sid = found.record.session_id
        if found.closed_at is not None:
            bridge.remember_owner(sid, found.record.owner)
            if found.terminals:
                bridge._closed_terminals[sid] = Terminals(found.terminals)
            continue
        if sid in bridge._sessions:
            continue
        try:
            session = await restore_session(bridge, found)
        except Exception:   # noqa: BLE001 - one bad session never stops the start
            bridge.unrestored.add(sid)   # nor listed from the journal (a fleet's listing)
            log.exception("session %s: could not be restored; not live, its journal "
                          "left as it was (the next start tries again)", sid)
            continue
        bridge.unrestored.discard(sid)
        if found.record.scope == "single":   # in creation order: the newest is the default
            bridge._default_session_ids[session.agent_name] = sid
        restored.append(sid)
    if restored:
        log.info("restored %d session(s) from the journal", len(restored))
    return restored


async def restore_session(bridge: Bridge, found: RestoredSession) -> Session:
    """One journaled session live again on ``bridge``: its bridge side now, its agent
    side on first use (the module docstring). ``found.record.session_id`` must not be
    live on ``bridge``. It is journaled from now on (its record is already in the
    journal). All or nothing: should a step raise (a bug, a record that decodes but
    makes no sense), the session is not registered, holds no slot, and nothing of it
    reached the journal (what it would have journaled is held until every step
    succeeded, ``_Deferred``), so a later start tries again; the exception is raised
    (the caller logs it)."""
    session = _bridge_side(bridge, found)
    durable = bridge.journal.durable and not bridge._closed
    deferred = _Deferred()
    try:
        session.start(bridge._tasks())
        if durable:
            session.journal_to(deferred)   # type: ignore[arg-type]
        side = _restore_prompts(bridge, session, found)
        # every step done: the session is live, and what it journaled goes to the journal
        sid, name = session.session_id, session.agent_name
        bridge._sessions[sid] = session
        try:
            bridge.capacity.take(name)
            session.holds_slot = True
        except SessionLimitExceededError:
            log.warning("session %s restored past the session cap", sid)
        if found.record.scope == "single" and side is not None:
            bridge._default_session_ids.setdefault(name, sid)
        if durable:
            bridge._journal_session(session)
            for record in deferred.records:
                bridge.journal.append(record)
    except BaseException:
        _undo(bridge, session)
        raise
    return session


def _bridge_side(bridge: Bridge, found: RestoredSession) -> Session:
    """The session as the journal has it, not started nor registered."""
    record = found.record
    session = Session(record.session_id, bridge.workspace_cwd, None,  # type: ignore[arg-type]
                      bridge.options, bridge.queue_wait, observer=bridge.observer)
    session.agent_name = record.agent   # its slot is counted there, listed or not
    session.on_cancel = bridge._cancel_questions
    session.on_turn_end = bridge._end_turn_questions
    session.on_abandoned = bridge._agent_abandoned
    session.created_at = record.created_at
    session.forked_from = record.forked_from
    session.seed = record.seed
    session.scope = record.scope
    session.settings = dict(record.settings or {})
    session.origin = record.origin
    session.owner = record.owner
    session.display_name = record.display_name
    session.restored = True
    session.recorded = True
    session.journaled_activity = found.last_activity()
    session.bus.epoch = uuid4_str() if found.gap else record.epoch
    session.bus.restore(found.events, found.last_event_id)
    session.prompt_terminals.keep_all(found.terminals)
    return session


def _restore_prompts(bridge: Bridge, session: Session, found: RestoredSession
                     ) -> AgentSideRestore | None:
    """The started session's agent side to restore on first use (``None``: its agent
    is not configured), its open questions resolved and its prompts taken back (the
    module docstring)."""
    record = found.record
    known = record.agent in bridge.agents
    side = AgentSideRestore(bridge, session)
    session.agent_side = side.ensure
    if not known:   # never another agent in its place: the conversation is not its own
        session.not_restorable = missing_text(record.agent)
        if bridge.agent_finder is None:   # it never will be: refused for good
            session.agent_side = None
    if found.gap and session.journal.durable:   # the new epoch is the session's from now on
        session.journal.append(msgspec.structs.replace(record, epoch=session.bus.epoch))
    cancel_open_questions(session)
    # a cancel the journal holds was acknowledged: that prompt ends cancelled, whatever
    # the policy (its turn's end was lost, not the cancel)
    cancelled = {e.prompt_id for e in found.events if e.type == ev.PROMPT_CANCELLED}
    continued = continued_before(found.events)
    for accepted in found.unsettled:
        pending = session.readmit(accepted)
        if accepted.prompt_id in cancelled:
            session.fail_restored(pending, PromptResult("cancelled",
                                                        {"stopReason": "cancelled"}))
            continue
        if accepted.prompt_id not in found.started:
            continue
        # continued once already (the stop came during that run): never again, so a
        # turn that brings the server down does not do it at every start
        if bridge.options.session_on_restart == "continue" and known \
                and accepted.prompt_id not in continued:
            pending.continued = {"reason": RESTARTED}
            side.rerun.add(accepted.prompt_id)
        else:
            session.fail_restored(pending, ServerRestartedError(accepted.prompt_id))
    return side if known else None


_CONTINUED_KEY = CONTINUED_META.encode()


def continued_before(events: list[Any]) -> set[str]:
    """The prompts whose continued turn had started (its echo, marked
    ``acp-server/continued``, is among ``events``)."""
    found: set[str] = set()
    for event in events:
        if event.type != ev.SESSION_UPDATE or event.prompt_id is None:
            continue
        data = event.data   # as journaled: its JSON (``msgspec.Raw``), read only if marked
        if isinstance(data, msgspec.Raw):
            if _CONTINUED_KEY not in bytes(data):
                continue
            data = msgspec.json.decode(data)
        update = data.get("update") if isinstance(data, dict) else None
        meta = update.get("_meta") if isinstance(update, dict) else None
        if isinstance(meta, dict) and CONTINUED_META in meta \
                and update.get("sessionUpdate") == "user_message_chunk":
            found.add(event.prompt_id)
    return found


class _Deferred:
    """The journal of a session being restored until every step succeeded: its
    records in order (``restore_session`` appends them to the journal then; a restore
    that failed drops them, leaving the journal as it found it)."""

    durable = True

    def __init__(self) -> None:
        self.records: list[Any] = []

    def append(self, record: Any) -> int:
        self.records.append(record)
        return 0


def _undo(bridge: Bridge, session: Session) -> None:
    """A restore that failed: the session is no longer registered nor holds a slot,
    records nothing (its deferred records are dropped) and its worker stops."""
    sid = session.session_id
    session.journal = NO_JOURNAL
    session.bus.sink = None
    session.agent_side = None
    if bridge._sessions.get(sid) is session:
        del bridge._sessions[sid]
    if session.holds_slot:
        session.holds_slot = False
        bridge.capacity.release(session.agent_name)
    if bridge._default_session_ids.get(session.agent_name) == sid:
        del bridge._default_session_ids[session.agent_name]
    bridge._held.pop((sid, session.bus.epoch), None)
    session.stop()


_restore_one = restore_session   # the name it had


async def restore_cold(bridge: Bridge, method: str, agent_name: str, session_id: str,
                       owner: str | None, offered: bool) -> Session | None:
    """A session not live here, restored through its agent's ``method``
    (``session/load`` or ``session/resume``; ``offered``: the agent offers it), else,
    when the agent does not know it (or offers no such method) and the journal keeps
    it closed, reseeded (``reseed_closed``). ``None``: another call made it live
    meanwhile (the caller attaches). ``SessionNotFoundError`` (the agent does not know
    it, the journal keeps nothing to seed from), ``NotSupportedError``, or the agent's
    error; a closed session that does not come back keeps its journaled conversation
    (``rejournal_closed``)."""
    # read before the agent's load: a load it refuses resets the id's events
    kept = await bridge.journal.read(session_id, seed=True)
    if session_id in bridge._sessions:
        return None
    try:
        return await _load_or_reseed(bridge, method, agent_name, session_id, owner,
                                     offered, kept)
    except BaseException:
        if kept is not None and kept.closed_at is not None \
                and session_id not in bridge._sessions:
            rejournal_closed(bridge, kept)
        raise


async def _load_or_reseed(bridge: Bridge, method: str, agent_name: str, session_id: str,
                          owner: str | None, offered: bool,
                          kept: RestoredSession | None) -> Session | None:
    try:
        if not offered:
            raise NotSupportedError(f"The agent does not support {method}")
        # a branch's new life keeps what its record says it was forked from
        record = kept.record if kept is not None and kept.record.agent == agent_name \
            else None
        return await spawn(bridge, method, agent_name, restore_id=session_id, owner=owner,
                           forked_from=record.forked_from if record else None,
                           seed=record.seed if record else None,
                           display_name=record.display_name if record else None)
    except (AgentError, NotSupportedError) as exc:
        if isinstance(exc, AgentError) and exc.rpc_code != RESOURCE_NOT_FOUND:
            raise
        if session_id in bridge._sessions:
            return None
        reseeded = await reseed_closed(bridge, agent_name, kept, owner)
        if reseeded is None:   # the agent does not know it: the caller's 404
            if isinstance(exc, NotSupportedError):
                raise
            raise SessionNotFoundError(session_id) from None
        return reseeded


def rejournal_closed(bridge: Bridge, kept: RestoredSession) -> None:
    """A cold load of a closed session that did not make it live again (the agent
    failed it otherwise than "no such session", died, timed out; nothing to reseed; the
    caller gave up): the attempt reset the id's events in the journal, so what was read
    before it is written back (its ring: what a reseed uses), and the conversation is
    kept for the next load. Under the cold-load gate: nothing else writes the id."""
    journal, sid = bridge.journal, kept.record.session_id
    journal.append(EventsReset(session_id=sid))
    for event in kept.events:
        journal.append(EventRecord(session_id=sid, event_id=event.id, type=event.type,
                                   prompt_id=event.prompt_id, envelope=envelope(event),
                                   epoch=kept.record.epoch))


async def reseed_closed(bridge: Bridge, agent_name: str, found: RestoredSession | None,
                        owner: str | None) -> Session | None:
    """A cold load (or resume) of a closed session the journal keeps (idle timeout,
    agent death) that its agent cannot load (it does not offer ``session/load``, or no
    longer knows the session: an agent that kept it in memory and died): a fresh
    ``session/new`` under its id seeded with its transcript, as at a restart (a
    branch's after the conversation it was made from, its record's seed). It is a
    new life of the id, like a load (a new epoch, ids from 1), whose first events are
    the closed life's ``session_update``s published again, as an agent's own load
    replays its conversation: ``/load`` and readers get the history. ``None`` when the
    journal keeps no closed session of that id on ``agent_name`` (another agent never
    takes a conversation over), or the agent makes its new session under another id
    (logged): the caller's 404. ``found``: the id's journal, read before the agent's
    load was tried (a refused load resets the id's events). The caller checked that
    the id is not live."""
    if found is None or found.closed_at is None or found.record.agent != agent_name:
        return None
    session_id = found.record.session_id
    try:
        return await spawn(bridge, "session/new", agent_name, requested_id=session_id,
                           owner=found.record.owner or owner, seeded=found.events,
                           seed=found.record.seed, forked_from=found.record.forked_from,
                           display_name=found.record.display_name)
    except SessionIdNotHonoredError:
        log.warning("session %s: its agent %r made the reseeded session under another id",
                    session_id, agent_name)
        return None


def missing_text(agent: str) -> str:
    return f"its agent {agent!r} is not configured on this server"


class AgentSideRestore:
    """A restored session's agent side, restored once on first use (``ensure``)."""

    def __init__(self, bridge: Bridge, session: Session) -> None:
        self.bridge = bridge
        self.session = session
        self.rerun: set[str] = set()   # interrupted turns that run again (policy continue)
        self._started = False
        self._finished = anyio.Event()

    async def ensure(self) -> None:
        """Return once the agent side is restored or found not restorable
        (``session.not_restorable``)."""
        if not self._started:
            self._started = True
            self.bridge._tasks().start_soon(self._restore)
        await self._finished.wait()

    async def _restore(self) -> None:
        bridge, session = self.bridge, self.session
        sid, name = session.session_id, session.agent_name
        reason: str | None = None
        loaded = False   # the agent restored its own session (session/load)
        started = anyio.current_time()   # the restore's bound: restore_timeout_ms
        if name not in bridge.agents:   # its model may be listed since: look again
            try:
                await bridge.refresh_agents()
            finally:
                if name not in bridge.agents:   # still missing: refused, asked again later
                    self._started = False
                    done, self._finished = self._finished, anyio.Event()
                    done.set()
            if name not in bridge.agents:
                return
            log.info("session %s: its agent %r is offered now; restoring it", sid, name)
        session.not_restorable = None
        try:
            try:
                session.agent = await bridge._ensure_agent(name)
            except BridgeError as exc:
                reason = f"agent {name!r} did not start: {exc}"
            else:
                try:
                    session.agent_result, loaded = await self._at_agent()
                    if session.settings:   # as acknowledged before the restart,
                        # within what is left of the restore's bound
                        left = (bridge.options.restore_timeout_ms / 1000
                                - (anyio.current_time() - started))
                        await apply_again(bridge, session, session.agent_result,
                                          within_s=left)
                except Exception as exc:   # noqa: BLE001 - the history stays readable
                    reason = str(exc) or type(exc).__name__
            if reason is not None:
                log.warning("session %s: the agent side could not be restored: %s", sid,
                            reason)
                session.not_restorable = reason
                if session.agent is not None and session.agent.closed:
                    session.agent = None   # as before its first use: no agent's death
                    # (another's, later) ends it; its history stays readable
            elif session.closing:   # closed meanwhile: the agent learns of it too
                await bridge._close_at_agent(session, False)
            for pending in list(session.pending.values()):
                if pending.continued is None or pending.state != QUEUED:
                    continue
                if reason is not None:
                    session.fail_restored(pending, ServerRestartedError(pending.prompt_id))
                elif loaded:
                    pending.prompt = [{"type": "text", "text": CONTINUE_TEXT}]
                    pending.text = CONTINUE_TEXT
        finally:
            session.agent_side = None
            self._finished.set()


    async def _at_agent(self) -> tuple[dict[str, Any], bool]:
        """``_restore_at_agent``; an agent that died as it was asked (maybe dying
        already: a crash a moment before) is started anew and asked once more, never
        the session refused for good for that death."""
        bridge, session = self.bridge, self.session
        try:
            return await _restore_at_agent(bridge, session, self.rerun)
        except AgentDiedError:
            if not session.agent.closed:
                raise
            log.warning("session %s: agent %s died as the session was restored; asking "
                        "it again, started anew", session.session_id, session.agent_name)
            session.agent = await bridge._ensure_agent(session.agent_name)
            return await _restore_at_agent(bridge, session, self.rerun)


def cancel_open_questions(session: Session) -> None:
    """Permission requests and elicitations still open at the stop were asked by a turn
    that is gone: each gets its resolution, cancelled with reason ``server_restarted``
    (the stream, the console and ``/load`` show it; an answer to it is a 404)."""
    asked: dict[str, str] = {}
    for event in session.bus.ring_events():
        if event.type in (ev.PERMISSION_REQUEST, ev.ELICITATION_REQUEST):
            asked[event.data.request_id] = event.type
        elif event.type in (ev.PERMISSION_RESOLVED, ev.ELICITATION_RESOLVED):
            asked.pop(event.data.request_id, None)
    sid = session.session_id
    for request_id, kind in asked.items():
        if kind == ev.PERMISSION_REQUEST:
            session.bus.publish(ev.PERMISSION_RESOLVED, ev.PermissionResolved(
                request_id=request_id, session_id=sid, outcome={"outcome": "cancelled"},
                reason=RESTARTED))
        else:
            session.bus.publish(ev.ELICITATION_RESOLVED, ev.ElicitationResolved(
                request_id=request_id, session_id=sid, action="cancel", reason=RESTARTED))


async def _restore_at_agent(bridge: Bridge, session: Session, rerun: set[str]
                            ) -> tuple[dict[str, Any], bool]:
    """``session/load``, else a fresh ``session/new`` under the same id seeded with the
    transcript (without the turns in ``rerun``): (the agent's answer, whether it was a
    load)."""
    sid = session.session_id
    params: dict[str, Any] = {"cwd": bridge.workspace_cwd, "mcpServers": []}
    if bridge.agents.capability(session.agent_name, "loadSession"):
        session.replaying = True
        try:
            result = await bridge._agent_request(session.agent, "session/load",
                                                 {**params, "sessionId": sid})
            return (result if isinstance(result, dict) else {}), True
        except AgentError as exc:   # it does not know the session (any more)
            log.debug("session %s: session/load refused (%s); a new agent session", sid, exc)
        finally:
            session.replaying = False
    said = after_seed(session.seed, transcript(session.bus.ring_events(), skip=rerun))
    result = await bridge._agent_request(session.agent, "session/new", {
        **params, "_meta": {REQUESTED_SESSION_ID_META: sid, TRANSCRIPT_META: said}})
    got = result.get("sessionId") if isinstance(result, dict) else None
    if not isinstance(got, str) or got.lower() != sid.lower():
        raise RuntimeError("the agent can neither load the session nor make a new one "
                           "under its id")
    return result, False


async def journaled_agent(bridge: Bridge, session_id: str, default: str) -> str:
    """The agent the journal's record of ``session_id`` names, when one of that name is
    configured, else ``default``: a load (or resume) that names no agent restores a
    session on its own, never asks the default agent for another's."""
    record = await bridge.journal.record_of(session_id)
    if record is None or record.agent == default or record.agent not in bridge.agents:
        return default
    return record.agent
