"""Reads of sessions another instance runs, served here from the journal (issue #24).

    replicas = JournalReplicas(bridge, journal, poll_s=1.0)
    store.on_sessions = replicas.wake          # the owners' NOTIFY (``pg_engine``)
    async with anyio.create_task_group() as tg:
        tg.start_soon(replicas.run)            # owns the tails below
        view = await replicas.view(sid)        # SessionNotFoundError when unknown/closed
        view.status(); view.pending(); view.load_info()
        others = await replicas.statuses_elsewhere()   # the listings' sessions run elsewhere
        subscription = replicas.subscribe(view, last_event_id=12, epoch=epoch)

Contracts:

* ``view`` reads one session back from the journal (``StoreSessionJournal.read``): no
  agent, no lease, no FIFO, nothing taken over. Its status, pending prompts and
  ``/load`` answer are the owner's as of the last commit: the prompts accepted and not
  settled (the first one whose turn started is the active one), the event ring, the
  prompt terminals, the epoch its record carries. A ``/load`` answer mints a client id
  (``client_…``) that the owner accepts when that client prompts (a restored session
  accepts the ids its clients bring back); the agent's own state (``state``) is not in
  the journal and is answered empty.
* ``subscribe``: the event stream of a session owned elsewhere. One tail per session
  (while it has readers) holds a replica ``EventBus`` restored from the journal and
  follows the journal: woken by the owner's commit NOTIFY (``wake``), or every
  ``poll_s`` (a lost LISTEN, this instance's own commits), it reads the rows after its
  last id and hands them to the bus (``EventBus.follow``). So frames, ids and epoch are
  the owner's; ``Last-Event-ID`` replay and resync work as on the owner; a slow reader
  is warned and evicted as on the owner (the held bus's flow control: bounded memory).
  A session closed or deleted ends the streams (after what was committed), as on the
  owner; so does a new epoch (an adoption that found a gap): the client resumes and
  gets ``state_resync_required``. A store outage keeps the streams open and silent
  until it heals. A clean stop (the journal closing) ends them, and starts no new one
  (``JournalUnavailableError``): the readers resume by cursor, here after the restart
  or on another instance. Only committed events are read: with ``--session-write-behind`` a
  reader here sees an event once it is committed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Container
import logging

import anyio
import anyio.abc
import msgspec

from acp_server.store.sessions import StoreSessionJournal
from bridge import Bridge, EventBus, Subscription
from bridge import events as ev
from bridge.errors import STOPPING, JournalUnavailableError, SessionNotFoundError
from bridge.history import history_of
from bridge.ids import uuid4_str
from bridge.journal import RestoredSession
from bridge.session import QUEUED, RUNNING, prompt_text
from bridge.status import (
    AskedPermission,
    PendingPromptInfo,
    SessionInfo,
    SessionStatus,
    TurnFailure,
    refused,
)
from bridge.wire import event_from_envelope

log = logging.getLogger("acp_server.fleet")
BATCH = 512   # rows a tail reads at a time
QUESTIONS = (ev.PERMISSION_REQUEST, ev.PERMISSION_RESOLVED,   # a status's open permissions,
             ev.TURN_ERROR)             # and how its last turn failed


@dataclasses.dataclass
class SessionView:
    """One session as its journal has it (see the module docstring)."""

    found: RestoredSession
    limit: int | None
    subscribers: int = 0

    @property
    def session_id(self) -> str:
        return self.found.record.session_id

    def active(self) -> str | None:
        return next((p.prompt_id for p in self.found.unsettled
                     if p.prompt_id in self.found.started), None)

    def open_permissions(self) -> int:
        """Permission requests asked and not resolved: the owner's
        ``pending_permissions`` (its ``PermissionMediator.count``; elicitations are not
        counted there either)."""
        return len(self.asked())

    def asked(self) -> tuple[AskedPermission, ...]:
        """Its permission requests asked and not resolved, oldest first, as the owner's
        ``PermissionMediator.asked`` (asked when the event was published)."""
        asked: dict[str, AskedPermission] = {}
        for event in self.found.events:
            if event.type == ev.PERMISSION_REQUEST:
                at = (event.timestamp_ms or 0) / 1000
                asked[event.data.request_id] = AskedPermission(
                    event.data.request_id, event.data.params, at)
            elif event.type == ev.PERMISSION_RESOLVED:
                asked.pop(event.data.request_id, None)
        return tuple(asked.values())

    def last_turn(self) -> tuple[float | None, TurnFailure | None]:
        """When its last turn ended (epoch seconds) and how it failed, as the owner
        reports them (``Session.turn_ended_at``, ``turn_failure``), from its newest
        prompt terminal (not one refused at admission: it never ran); a failure is
        over once another prompt's turn started. The journal does not say whether a
        prompt ended in the queue ran, so one ended there counts as the owner's last
        turn here."""
        ended = next((t for t in reversed(self.found.terminals) if not refused(t)), None)
        if ended is None:
            return None, None
        if ended.terminal != "failed" or self.active() is not None:
            return ended.at / 1000, None
        said = next((e.data for e in reversed(self.found.events) if e.type == ev.TURN_ERROR
                     and e.data.prompt_id == ended.prompt_id), None)
        code = ended.error_code or "internal_error"
        failure = TurnFailure(code, code) if said is None \
            else TurnFailure(said.message, said.code, said.error_kind)
        return ended.at / 1000, failure

    def status(self) -> SessionStatus:
        found, record = self.found, self.found.record
        turn_ended_at, turn_failure = self.last_turn()
        active = self.active()
        pending = len(found.unsettled)
        active_text = next((prompt_text(p.prompt) for p in found.unsettled
                            if p.prompt_id == active), None)
        return SessionStatus(
            session_id=self.session_id, workspace_cwd=record.cwd,
            created_at=record.created_at, client_count=0, active_prompt_id=active,
            pending_prompts=pending, queued_prompts=pending - (active is not None),
            pending_permissions=self.open_permissions(), subscribers=self.subscribers,
            last_event_id=found.last_event_id, event_epoch=record.epoch, agent=record.agent,
            max_pending_prompts=self.limit, active_prompt_text=active_text,
            updated_at=found.last_activity(), origin=record.origin,
            turn_ended_at=turn_ended_at, turn_failure=turn_failure, asked=self.asked(),
            display_name=record.display_name,
            earliest_event_id=found.events[0].id if found.events  # type: ignore[arg-type]
            else found.last_event_id + 1)

    def pending(self) -> list[PendingPromptInfo]:
        active = self.active()
        return [PendingPromptInfo(p.prompt_id, p.queued_at_ms, prompt_text(p.prompt),
                                  RUNNING if p.prompt_id == active else QUEUED)
                for p in self.found.unsettled]

    def load_info(self) -> SessionInfo:
        """``/load``'s answer, with the history, taking nothing over."""
        found, record = self.found, self.found.record
        history = history_of(found.events, self.active(), list(found.terminals),
                             found.last_event_id)
        return SessionInfo(
            session_id=self.session_id, workspace_cwd=record.cwd, attached=True,
            client_id=f"client_{uuid4_str()}", created_at=record.created_at,
            event_epoch=record.epoch, last_event_id=history.last_event_id,
            has_active_prompt=bool(found.unsettled), forked_from=record.forked_from,
            agent=record.agent, history=history)


class _Tail:
    __slots__ = ("bus", "woken")

    def __init__(self, bus: EventBus) -> None:
        self.bus = bus
        self.woken = anyio.Event()

    def wake(self) -> None:
        self.woken.set()


class JournalReplicas:
    """See the module docstring."""

    def __init__(self, bridge: Bridge, journal: StoreSessionJournal, *,
                 poll_s: float = 1.0) -> None:
        self.bridge = bridge
        self.journal = journal
        self.poll_s = poll_s
        self._tails: dict[str, _Tail] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        self._listed: tuple[float, list[SessionStatus]] | None = None   # (when, what)
        self._listing = anyio.Lock()

    async def run(self) -> None:
        """Own the tails until cancelled (the server's task group) or the journal
        closes (a clean stop: the streams end after what they were given, as the
        sessions run here do, and no new one starts)."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            try:
                await self.journal.closing.wait()
            finally:
                self._tg = None
                for tail in list(self._tails.values()):
                    tail.bus.close()
                tg.cancel_scope.cancel()   # the tails' reads of the store

    @property
    def followed(self) -> Container[str]:
        """The sessions tailed here, as a container another thread may test (``in``):
        the store's listener skips the notices of the others."""
        return self._tails.keys()

    def following(self) -> list[str]:
        """The sessions whose journal a tail follows now (they have readers here)."""
        return list(self._tails)

    def wake(self, session_ids: list[str]) -> None:
        """Other instances committed events of these sessions (their NOTIFY)."""
        for sid in session_ids:
            tail = self._tails.get(sid)
            if tail is not None:
                tail.wake()

    async def view(self, session_id: str, *, ring: bool = True) -> SessionView:
        """``ring=False``: enough for ``status`` and ``pending`` (of its events, the
        newest and its questions only)."""
        try:
            found = await self.journal.read(session_id, only=None if ring else QUESTIONS)
        except Exception as exc:   # noqa: BLE001 - the store: the door's own 503
            raise JournalUnavailableError(str(exc) or type(exc).__name__) from exc
        if found is None or found.closed_at is not None:
            raise SessionNotFoundError(session_id)
        # who made it, so the doors can tell who sees it (``remember_owner``)
        self.bridge.remember_owner(session_id, found.record.owner)
        return self._view_of(found)

    def _view_of(self, found: RestoredSession) -> SessionView:
        tail = self._tails.get(found.record.session_id)
        return SessionView(found, self.bridge.options.pending_prompt_limit,
                           tail.bus.subscriber_count if tail is not None else 0)

    async def statuses_elsewhere(self) -> list[SessionStatus]:
        """The sessions the journal holds open that are not live here (another instance
        runs them, or one will adopt them), each as its ``view``'s status: what the
        listings add to this instance's own (``Bridge.list_all_sessions``). One read
        of the store (``read_open``) at most once a ``poll_s``, concurrent listings
        sharing it; the owners are remembered, so the doors tell who sees each.
        ``JournalUnavailableError`` when the store cannot answer."""
        async with self._listing:
            now = anyio.current_time()
            if self._listed is not None and now - self._listed[0] < self.poll_s:
                return self._listed[1]
            try:
                live = {session.session_id for session in self.bridge.sessions()}
                found = await self.journal.read_open(QUESTIONS, live)
            except Exception as exc:   # noqa: BLE001 - the store: the caller's choice
                raise JournalUnavailableError(str(exc) or type(exc).__name__) from exc
            statuses = []
            for one in found:
                sid = one.record.session_id
                if self.bridge.has_session(sid) or sid in self.bridge.unrestored:
                    continue   # made live here meanwhile; its restore here failed
                self.bridge.remember_owner(sid, one.record.owner)   # who sees it
                statuses.append(self._view_of(one).status())
            self._listed = anyio.current_time(), statuses
            return statuses

    def subscribe(self, view: SessionView, *, last_event_id: int | None = None,
                  epoch: str | None = None, max_queued: int | None = None) -> Subscription:
        """The session's events, followed from the journal (the module docstring)."""
        sid = view.session_id
        tail = self._tails.get(sid)
        if tail is None:
            if self._tg is None:
                raise JournalUnavailableError(STOPPING)
            tail = self._tails[sid] = _Tail(self._bus(view.found))
            self._tg.start_soon(self._follow, sid, tail)
        else:   # the view may be newer than the tail: a cursor from it is not ahead
            bus = tail.bus
            newer = [e for e in view.found.events if e.id > bus.last_event_id]  # type: ignore[operator]
            if newer and newer[0].id == bus.last_event_id + 1 \
                    and view.found.record.epoch == bus.epoch:
                bus.follow(newer)
            tail.wake()
        return tail.bus.subscribe(last_event_id=last_event_id, epoch=epoch,
                                  max_queued=max_queued)

    def _bus(self, found: RestoredSession) -> EventBus:
        options = self.bridge.options
        bus = EventBus(ring_size=options.event_ring_size, ring_bytes=options.event_ring_bytes,
                       max_subscribers=options.max_subscribers_per_session,
                       max_queued=options.subscriber_max_queued,
                       max_queued_bytes=options.subscriber_max_queued_bytes,
                       flow_wait_s=options.subscriber_flow_wait_ms / 1000,
                       session_id=found.record.session_id, epoch=found.record.epoch)
        bus.hold = True   # readers are fed from the ring as they read (bounded)
        bus.restore(found.events, found.last_event_id)
        return bus

    async def _follow(self, sid: str, tail: _Tail) -> None:
        bus = tail.bus
        try:
            while bus.subscriber_count:
                try:
                    ended = await self._catch_up(sid, bus)
                except Exception as exc:   # noqa: BLE001 - a store outage: next time
                    log.warning("session %s: its journal could not be read (%s)", sid, exc)
                    ended = False
                if ended:
                    return
                with anyio.move_on_after(self.poll_s):
                    await tail.woken.wait()
                tail.woken = anyio.Event()
        finally:
            if self._tails.get(sid) is tail:
                del self._tails[sid]
            bus.close()

    async def _catch_up(self, sid: str, bus: EventBus) -> bool:
        """Read what was committed after the bus's last id; whether the streams end."""
        while True:
            record, closed, rows = await self.journal.read_after(sid, bus.last_event_id,
                                                                  BATCH)
            if record is None or record.epoch != bus.epoch:
                return True   # deleted, or a new epoch: readers resume and resync
            events = []
            for event_id, raw in rows:
                if event_id <= bus.last_event_id:
                    continue   # a newer view gave them to the bus meanwhile (``subscribe``)
                try:
                    events.append(event_from_envelope(raw))
                except msgspec.MsgspecError as exc:
                    log.error("session %s: event %s is unreadable (%s): its readers "
                              "resume", sid, event_id, exc)
                    return True
            if events and events[0].id != bus.last_event_id + 1:
                return True   # trimmed past this tail: its readers resume (ring_evicted)
            bus.follow(events)
            if len(rows) < BATCH:
                return closed


__all__ = ["JournalReplicas", "SessionView"]

