"""The journal half of the ``Bridge``: what it records and when readers may see it.

    class Bridge(Journaling, PromptsAPI): ...
    await bridge._record_session(session, "thread")   # committed, or the session undone

``Bridge`` inherits these; they use what every ``Bridge`` has (``journal``, ``_held``,
``_sessions``, ``_closed``, ``journal_clock``, ``_drop_session``, ``_close_at_agent``,
``_tasks``). Contracts (``bridge.journal`` has the seam's):

* A session is journaled from its registration (``_journal_session``: its bus held,
  its prompts and terminals recorded) unless its origin is unjournaled.
* Its record is committed before its creation is answered (``_record_session``); a
  failed commit or a caller that gives up meanwhile undoes the session.
* Committed events are released to readers per bus (a session id and its bus's
  epoch), in order (``_events_committed``): a commit of a load the agent refused that
  lands once the same id is loaded again releases the refused load's bus, never the
  new one. A bus is forgotten once closed and fully released: at the commit that
  releases its last event, or when it closes with nothing left to release
  (``_unhold``: a load the agent refused, whose bus no commit would ever visit again).
* A session made anew (``_journal_new``: created, loaded, resumed, forked) starts the
  id's events in the journal from none (``EventsReset``: a closed session's, a refused
  load's), as its bus starts its ids from 1; a load undone resets them too, so what of
  it landed is not kept (with no record of the id: its prompts either).
* A clean stop commits what is queued, then records nothing more and shows readers
  nothing more (``_stop_journaling``): the sessions it closes come back at the next
  start, their readers resume by cursor, as after a crash.
* A closed session the journal keeps (not live here) is deleted by ``delete_ended``:
  its journal removed, answered once committed; a cold load of the id meanwhile waits
  for it (the two share the bridge's gate of cold loads, ``_restoring``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import anyio

from bridge.bus import EventBus
from bridge.errors import STOPPING, JournalUnavailableError
from bridge.journal import EventsReset, SessionEnded, SessionJournal, SessionOpened, storable
from bridge.pending import display_name

if TYPE_CHECKING:
    import anyio.abc

    from bridge.session import Session

MOVED = "session_moved"   # the close reason of a session another instance took over

class Journaling:
    journal: SessionJournal
    journal_clock: Callable[[], float]
    _held: dict[tuple[str, str], EventBus]   # (session id, its bus's epoch)
    _sessions: dict[str, Session]
    _closed: bool
    _restoring: dict[str, anyio.Event]   # cold loads (and deletions of closed ones) by id
    _closed_terminals: dict[str, Any]
    _closed_owners: dict[str, str]
    unjournaled_origins: frozenset[str]   # origins whose sessions are not journaled (Bridge)
    moved_sessions = 0   # sessions another instance took over from this one

    def _forget(self, session: Session) -> None:
        raise NotImplementedError   # Bridge's

    def _cancel_questions(self, session: Session, reason: str) -> None:
        raise NotImplementedError   # Bridge's

    def _drop_session(self, session: Session) -> None:
        raise NotImplementedError   # Bridge's

    async def _close_at_agent(self, session: Session, running: bool) -> None:
        raise NotImplementedError   # Bridge's

    def _tasks(self) -> anyio.abc.TaskGroup:
        raise NotImplementedError   # Bridge's

    async def _stop_journaling(self) -> None:
        """A clean stop: commit what is queued, then record nothing more (the sessions
        closed by the shutdown stay open in the journal, to be restored), and show
        readers nothing more either: each held bus is abandoned (``EventBus.abandon``:
        what is not committed dropped, its streams ended after the last committed
        event). So the drain's own events (each prompt's end, ``session_closed``),
        which the journal does not hold, never reach a reader: the next start numbers
        the sessions' events on from the last committed, and a reader resumes there
        by cursor exactly, as after a crash (no id it saw is given another event)."""
        if not self.journal.durable:
            return
        try:
            await self.journal.aclose()
        finally:
            for bus in list(self._held.values()):
                bus.abandon()
            self._held.clear()
            for session in self._sessions.values():
                session.unjournal()

    def _journal_session(self, session: Session) -> None:
        if self.journal.durable and not self._closed:
            session.journal_to(self.journal)
            self._held[session.session_id, session.bus.epoch] = session.bus

    def _journal_new(self, session: Session) -> None:
        """Journal a session made now (its bus numbers from 1): the journal's events
        of its id before it are deleted first."""
        self._journal_session(session)
        self._reset_events(session)

    def _reset_events(self, session: Session) -> None:
        if session.journal.durable:
            session.journal.append(EventsReset(session_id=session.session_id))

    def _unhold(self, session: Session) -> None:
        """A session's bus just closed: forgotten here now when it has nothing left to
        release (else at the commit that releases its last event)."""
        key = session.session_id, session.bus.epoch
        bus = self._held.get(key)
        if bus is session.bus and bus.closed and bus.released_id >= bus.last_event_id:
            del self._held[key]

    def sessions_moved(self, session_ids: Iterable[str]) -> None:
        """Another instance took these sessions over (the journal refused their writes,
        or their lease was lost): stop running them here at once, writing nothing more.
        Events not committed are dropped; readers' streams end with no further event
        (they reconnect with ``Last-Event-ID``, through the balancer, to the new owner);
        prompts still here fail with ``SessionClosedError`` reason ``session_moved``;
        the agent is told to cancel and close. Sessions not live here are skipped."""
        moved = list(dict.fromkeys(session_ids))
        gone = set(moved)
        for key in [key for key in self._held if key[0] in gone]:
            del self._held[key]
        for sid in moved:
            session = self._sessions.get(sid)
            if session is None:
                continue
            session.abandon()
            self._forget(session)
            running = session.active is not None
            session.fail_all(session.close_error(MOVED))
            self._cancel_questions(session, MOVED)
            session.stop()
            self.moved_sessions += 1
            self._tasks().start_soon(self._close_at_agent, session, running)

    def _events_committed(self, records: Any) -> None:
        """The journal committed these events (at least the newest of each bus):
        readers may see each bus's events through its newest here."""
        last: dict[tuple[str, str], int] = {}
        for record in records:
            last[record.session_id, record.epoch] = record.event_id
        for key, through in last.items():
            bus = self._held.get(key)
            if bus is None:
                continue
            bus.release(through)
            if bus.closed and bus.released_id >= bus.last_event_id:
                del self._held[key]

    async def _commit_record(self, session: Session, seq: int | None, *,
                             loaded: bool) -> None:
        """Wait for a session's record (``None``: it cannot be journaled, a stop has
        ended the journal); a failed commit, or a caller that gives up
        meanwhile (cancelled), undoes the session: whatever of its record landed is
        deleted, or (``loaded``: an id that may be a closed session kept for the
        retention) marked closed, so a kept session is not deleted with the undo."""
        try:
            if seq is None:   # made as a clean stop ends the journal: never journaled
                raise JournalUnavailableError(STOPPING)
            await self.journal.wait(seq)
        except BaseException:
            self._drop_session(session)
            self._held.pop((session.session_id, session.bus.epoch), None)
            # no commit will release what it holds now: dropped, and the streams of
            # readers that came meanwhile (a load's id is known) end after what they had
            session.bus.abandon()
            self._record_end(session, deleted=not loaded)
            self._tasks().start_soon(self._close_at_agent, session, False)
            raise

    async def _record_session(self, session: Session, scope: str, *,
                              loaded: bool = False) -> None:
        """Commit the session's record before its creation is answered (a durable
        journal); ``JournalUnavailableError`` (the session undone) when it fails
        (``loaded``: a load of an existing id, see ``_commit_record``)."""
        if not self.journal.durable or session.origin in self.unjournaled_origins:
            return
        session.scope = scope
        seq: int | None = None   # registered during a clean stop: not journaled
        if session.journal is self.journal:
            seq = self.journal.append(session_record(session))
            session.recorded = True
        await self._commit_record(session, seq, loaded=loaded)

    def _record_end(self, session: Session, *, deleted: bool) -> int:
        """Journal the session's end; its record's sequence number (0: not journaled)."""
        if session.journal.durable:
            return session.journal.append(SessionEnded(
                session_id=session.session_id, at=self.journal_clock(), deleted=deleted))
        return 0

    async def _end_committed(self, session: Session, seq: int) -> None:
        """A deletion is answered once committed (a ``kill -9`` right after its answer
        must not bring the session back); ``JournalUnavailableError`` at once while the
        store is down (the record stays queued and commits once it is back)."""
        if seq:
            await session.journal.wait(seq, fail_fast=True)

    async def delete_ended(self, session_id: str) -> bool:
        """Delete a closed session the journal keeps, not live here (its agent died,
        it idled out, its ``/acp`` client left): its journal is removed, and this
        returns ``True`` once that is committed (a ``kill -9`` right after does not
        bring it back). ``False``: the journal keeps no closed session of that id (none,
        or it is live: the caller closes a live one). ``JournalUnavailableError`` while
        the store cannot answer (nothing is removed when the read failed; a removal
        already queued commits once it is back). The door checks the caller may."""
        if not self.journal.durable or not storable(session_id):
            return False
        while (loading := self._restoring.get(session_id)) is not None:
            await loading.wait()   # a cold load of it first: it may be live after
        if session_id in self._sessions:
            return False
        self._restoring[session_id] = done = anyio.Event()
        try:
            found = await self.journal.read(session_id)
            if found is None or found.closed_at is None or session_id in self._sessions:
                return False
            seq = self.journal.append(SessionEnded(session_id=session_id,
                                                   at=self.journal_clock(), deleted=True))
            self._closed_terminals.pop(session_id, None)
            self._closed_owners.pop(session_id, None)
            await self.journal.wait(seq, fail_fast=True)
            return True
        finally:
            del self._restoring[session_id]
            done.set()


def named(session: Session, prompt: list[Any]) -> None:
    """A session's first prompt with text names it (``display_name``: the listings'),
    journaled with its record in that prompt's commit, once the session has one: a
    prompt admitted while a load waits for its agent names it in the record the load
    then writes (a record written here for it would outlive a refused load, keeping
    the prompt rows its undo deletes)."""
    session.display_name = display_name(prompt)
    if session.display_name is not None and session.journal.durable and session.recorded:
        session.journal.append(session_record(session))


def session_record(session: Session) -> SessionOpened:
    """The journal's record of ``session`` as it is now."""
    return SessionOpened(
        session_id=session.session_id, agent=session.agent_name,
        cwd=session.workspace_cwd, created_at=session.created_at,
        epoch=session.bus.epoch, scope=session.scope, forked_from=session.forked_from,
        origin=session.origin, owner=session.owner, seed=session.seed,
        settings=dict(session.settings) or None, display_name=session.display_name)
