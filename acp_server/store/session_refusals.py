"""Records the store refuses for good: how the session journal finds them, and what
becomes of them (``StoreSessionJournal`` inherits ``SessionRefusals``).

    taken, fenced, refused = journal._apply_isolated(conn, records, fence)   # worker thread
    journal.refusals.total, journal.refusals.by_kind, journal.refusals.last  # /metrics, /health

A commit of the journal is one operation of the store's writer carrying every record
appended since the last one, of every session. When it fails for a reason that is not
the store's (``own_fault``: not ``StoreUnavailableError`` — an outage, a full disk, a
lock, a lost connection, all retried with a backoff as before — nor a lost race, a
PostgreSQL deadlock or serialization failure), running it again fails again: a
constraint, a value the database cannot take, a trigger, a bug in how one record is
written. So the journal isolates instead of retrying.

Contracts:

* Only after such a failure (a commit that succeeds pays nothing): the next commit
  carries the same records (with what was appended since) and runs them in chunks, each
  in a SAVEPOINT; a chunk that fails is rolled back and split in halves until each
  record that fails has failed alone (bisection: about 2·log2(n) chunks per refused
  record). Every other record commits, in order, in that transaction.
* A refused record is never run again. What it becomes:

  - ``SessionOpened``, ``PromptAccepted`` (somebody waits): the waiter fails with
    ``JournalUnavailableError`` (503 ``store_unavailable``), as after a failed commit;
    a refused ``SessionOpened`` also gives a stored record of that session, if any,
    a new epoch (see events);
  - an event, a write-behind marker, a reset of an id's events (``EventsReset``: the
    new life's events may then not all be written): readers get the event
    unjournaled, and in the same transaction the session's stored record (if any yet)
    gets a new epoch (``_reepoch_in``):
    the next start restores the session under it, so a reader gets
    ``state_resync_required`` (``epoch_reset``): never a silent gap, never an id
    reused under the epoch it saw;
  - a terminal (``PromptSettled``): the accepted prompt's row is deleted in its place,
    so the next start neither runs the prompt again nor fails it as interrupted; its
    turn's events stay its record; its entry in the prompt terminals is gone after a
    restart (that deletion refused too: the restore settles the prompt from its
    ``turn_complete`` / ``turn_error``, ``session_reads.settled_from_events``);
  - a close (``SessionEnded``): the session's journal is deleted in its place, so the
    session never comes back live; a refused deletion is left as it is (the next
    start restores the session; closing it again tries again).

  A fallback the store refuses too is logged; nothing more is tried.
* Each refused record is logged once (a warning: its session, kind and the first line
  of the database's message, cut to ``REASON_CHARS``; never the record's payload) and
  counted in ``refusals`` (``/metrics`` ``acp_server_journal_records_refused_total``
  by kind; ``/health?deep=1`` ``journal``). The trims an isolating commit runs are in a
  savepoint too: one refused is logged and skipped (done when next due).
* An isolating commit that fails for its own fault again (a bug outside the records:
  its preparation, the lease fence) refuses every record it carried, so the journal
  never loops: their events go to readers and their sessions get a new epoch in the
  next commit (``_reepoch``), as do the sessions whose events were let through
  unjournaled because the store did not commit for too long (``_shed``).
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import msgspec

from acp_server.store.errors import StoreUnavailableError, first_line
from acp_server.store.pg_engine import TRANSIENT
from acp_server.store.open_reads import OPENED, stored
from acp_server.store.session_reads import delete_session
from acp_server.store.session_writes import Record, _encode
from acp_server.store.write_behind import Marker
from bridge.journal import (
    EventRecord,
    EventsReset,
    PromptAccepted,
    PromptSettled,
    SessionEnded,
    SessionOpened,
)

log = logging.getLogger("acp_server.store.sessions")

REASON_CHARS = 200
CHUNK = "journal_chunk"   # the isolating commit's savepoint
KINDS: dict[type, str] = {SessionOpened: "session", PromptAccepted: "prompt",
                          PromptSettled: "terminal", EventRecord: "event",
                          SessionEnded: "end", Marker: "marker", EventsReset: "reset"}


def reason_of(exc: BaseException) -> str:
    """The first line of an error's message, cut to ``REASON_CHARS`` (no payload)."""
    text = exc.reason if isinstance(exc, StoreUnavailableError) else first_line(exc)
    return text if len(text) <= REASON_CHARS else text[:REASON_CHARS] + "…"


@dataclasses.dataclass(slots=True)
class Refused:
    """One record an isolating commit refused (worker thread → ``_refused_landed``)."""

    index: int      # in the commit's batch
    reason: str     # ``reason_of`` the database's error
    fallback: str   # what was done in its place ("" when nothing)


@dataclasses.dataclass(slots=True)
class Refusals:
    """The records refused since start: by kind, and the last one."""

    by_kind: dict[str, int] = dataclasses.field(default_factory=dict)
    last: dict[str, Any] | None = None   # sessionId, kind, reason, at (epoch seconds)
    clock: Callable[[], float] = time.time

    @property
    def total(self) -> int:
        return sum(self.by_kind.values())

    def add(self, session_id: str, kind: str, reason: str) -> None:
        self.by_kind[kind] = self.by_kind.get(kind, 0) + 1
        self.last = {"sessionId": session_id, "kind": kind, "reason": reason,
                     "at": self.clock()}


def describe(record: Record) -> str:
    """A record's kind and identity for the log, without its payload."""
    kind = KINDS.get(type(record), type(record).__name__)
    if isinstance(record, EventRecord):
        return f"{kind} {record.event_id} ({record.type[:40]})"
    if isinstance(record, (PromptAccepted, PromptSettled)):
        return f"{kind} of prompt {record.prompt_id[:80]}"
    return kind


class SessionRefusals:
    """The isolation of ``StoreSessionJournal`` (its attributes, set there)."""

    store: Any
    postgres: bool
    refusals: Refusals
    _reepoch: set[str]
    _pending: list[tuple[int, Record]]
    _failed: dict[int, str]
    _isolate: bool
    _closing: bool
    _durable_through: int
    _wake: Any
    _on_events: Callable[[list[EventRecord]], None]

    def _kick(self) -> None:
        raise NotImplementedError

    def _signal(self) -> None:
        raise NotImplementedError

    def _requeue(self, items: list[tuple[int, Record]]) -> None:
        raise NotImplementedError

    def _sql(self, text: str) -> str:
        raise NotImplementedError

    def _fenced(self, conn: Any, records: list[Record], fence: dict[str, int] | None
                ) -> set[str]:
        raise NotImplementedError

    def _put(self, conn: Any, records: list[Record], refused: set[str],
             taken: dict[str, int], trim: dict[str, int]) -> None:
        raise NotImplementedError

    def _trims(self, conn: Any, trim: dict[str, int], refused: set[str]) -> None:
        raise NotImplementedError

    def own_fault(self, exc: BaseException) -> bool:
        """Running the same write again fails the same way: not the store's fault
        (``unavailable_reason``), not a lost race (``TRANSIENT``), not a cancellation."""
        if not isinstance(exc, Exception) or isinstance(exc, StoreUnavailableError):
            return False
        if self.postgres and isinstance(exc, TRANSIENT):
            return False
        return self.store.unavailable_reason(exc) is None

    # -- the event loop: a commit's outcome -------------------------------------------
    def _own_failure(self, batch: list[tuple[int, Record]], exc: BaseException,
                     isolated: bool) -> None:
        """A commit failed for its own fault (``own_fault``): the next commit isolates
        (logged once); when that was an isolating commit already, every record of it is
        refused (a bug outside the records: the journal must not loop)."""
        reason = reason_of(exc)
        if not isolated:
            log.warning("session journal: a commit failed (%s); its %d record(s) are "
                        "written again, each one the store refuses alone", reason, len(batch))
            self._requeue(batch)
            self._isolate = True
        else:
            log.error("session journal: a commit isolating refused records failed too (%s): "
                      "its %d record(s) are refused", reason, len(batch))
            events: list[EventRecord] = []
            for seq, record in batch:
                self.refusals.add(record.session_id, KINDS.get(type(record), "record"), reason)
                if isinstance(record, (SessionOpened, PromptAccepted)):
                    self._failed[seq] = f"the store refused the record: {reason}"
                elif isinstance(record, (EventRecord, Marker)):
                    self._reepoch.add(record.session_id)
                    if isinstance(record, EventRecord):
                        events.append(record)
            if batch:
                self._durable_through = max(self._durable_through, batch[-1][0])
            self._on_events(events)   # readers get them (unjournaled: a new epoch)
            self._signal()
        if self._closing and not self._pending:
            self._wake.set()   # the flusher ends
        else:
            self._kick()

    def _refused_landed(self, batch: list[tuple[int, Record]],
                        refusals: list[Refused]) -> None:
        """An isolating commit landed: its refused records logged, counted, and their
        waiters failed (the others landed as usual: ``_landed``)."""
        for refusal in refusals:
            seq, record = batch[refusal.index]
            sid = record.session_id
            self.refusals.add(sid, KINDS.get(type(record), "record"), refusal.reason)
            if isinstance(record, (SessionOpened, PromptAccepted)):
                self._failed[seq] = f"the store refused the record: {refusal.reason}"
            log.warning("session journal: the store refused the %s of session %s (%s); "
                        "not retried%s", describe(record), sid[:200], refusal.reason,
                        refusal.fallback)

    # -- the worker thread, inside the isolating commit's transaction --------------------
    def _apply_isolated(self, conn: Any, records: list[Record],
                        fence: dict[str, int] | None
                        ) -> tuple[dict[str, int], set[str], list[Refused]]:
        """``_apply``, each refused record failing alone (the module docstring)."""
        fenced = self._fenced(conn, records, fence)
        taken: dict[str, int] = {}
        trim: dict[str, int] = {}
        refused: list[Refused] = []
        reepoched: set[str] = set()
        self._bisect(conn, records, 0, len(records), fenced, taken, trim, refused,
                     reepoched)
        self._guarded(conn, lambda: self._trims(conn, trim, fenced), "a trim")
        return taken, fenced, refused

    def _bisect(self, conn: Any, records: list[Record], start: int, end: int,
                fenced: set[str], taken: dict[str, int], trim: dict[str, int],
                refused: list[Refused], reepoched: set[str]) -> None:
        chunk_taken: dict[str, int] = {}
        chunk_trim: dict[str, int] = {}
        exc = self._in_savepoint(conn, lambda: self._put(conn, records[start:end], fenced,
                                                         chunk_taken, chunk_trim))
        if exc is None:
            taken.update(chunk_taken)
            trim.update(chunk_trim)
        elif end - start == 1:
            refused.append(Refused(start, reason_of(exc),
                                   self._instead(conn, records[start], reepoched)))
        else:
            middle = (start + end) // 2
            for low, high in ((start, middle), (middle, end)):
                self._bisect(conn, records, low, high, fenced, taken, trim, refused,
                             reepoched)

    def _instead(self, conn: Any, record: Record, reepoched: set[str]) -> str:
        """What is written in a refused record's place (the module docstring)."""
        sid, sql = record.session_id, self._sql
        if isinstance(record, (EventRecord, Marker, SessionOpened, EventsReset)):
            if sid in reepoched:
                return "; its session has a new epoch"
            if self._guarded(conn, lambda: self._reepoch_in(conn, sid), "a new epoch"):
                reepoched.add(sid)
                return "; its session has a new epoch"
        elif isinstance(record, PromptSettled):
            if self._guarded(conn, lambda: conn.execute(sql(
                    "DELETE FROM session_prompts WHERE session_id = ? AND prompt_id = ?"),
                    (sid, record.prompt_id)), "the prompt's deletion"):
                return "; the prompt is deleted from the journal instead"
        elif isinstance(record, SessionEnded) and not record.deleted:
            if self._guarded(conn, lambda: delete_session(conn, sql, sid),
                             "the session's deletion"):
                return "; the session's journal is deleted instead"
        return ""

    def _in_savepoint(self, conn: Any, write: Callable[[], Any]) -> Exception | None:
        """``write`` in a savepoint: ``None`` when it ran; the error, rolled back, when
        the store refuses it for its own fault (``own_fault``; the store's own faults
        are raised: the whole commit fails and is retried)."""
        conn.execute(f"SAVEPOINT {CHUNK}")
        try:
            write()
        except Exception as exc:
            if not self.own_fault(exc):
                raise
            conn.execute(f"ROLLBACK TO SAVEPOINT {CHUNK}")
            conn.execute(f"RELEASE SAVEPOINT {CHUNK}")
            return exc
        conn.execute(f"RELEASE SAVEPOINT {CHUNK}")
        return None

    def _guarded(self, conn: Any, write: Callable[[], Any], what: str) -> bool:
        """``write`` in a savepoint; ``False`` (logged, rolled back) when the store
        refuses it for its own fault."""
        exc = self._in_savepoint(conn, write)
        if exc is not None:
            log.warning("session journal: the store refused %s too (%s)", what,
                        reason_of(exc))
        return exc is None

    def _reepoch_in(self, conn: Any, sid: str) -> None:
        """The session's stored record gets a new epoch (none when it has no record,
        or one that cannot be decoded: it is not restored then)."""
        sql = self._sql
        row = conn.execute(sql("SELECT record FROM sessions WHERE id = ?"), (sid,)).fetchone()
        if row is None:
            return
        try:
            record = OPENED.decode(stored(row[0]))
        except msgspec.MsgspecError:
            return
        conn.execute(sql("UPDATE sessions SET record = ? WHERE id = ?"),
                     (_encode(msgspec.structs.replace(record, epoch=str(uuid.uuid4()))), sid))

    def _reepochs_in(self, conn: Any, sids: set[str]) -> None:
        """The sessions whose events readers got unjournaled (``_shed``, an isolating
        commit that failed): a new epoch each, in a savepoint each (rare)."""
        for sid in sorted(sids):
            self._guarded(conn, lambda sid=sid: self._reepoch_in(conn, sid),
                          f"a new epoch for session {sid[:80]}")
