"""The session journal's reads (``acp_server.store.sessions.StoreSessionJournal``
inherits them): the restore at start, an adopted session, the reads of sessions
another instance runs, the closed sessions kept, and the purge of closed sessions.

    found = await journal.restore()            # every session this instance restores
    opened, closed, rows = await journal.read_after(session_id, after=41)
    page = await journal.ended(before=(1764900000.0, "3c0f…"), limit=50)

Contracts: see ``acp_server.store.sessions``. A row that cannot be decoded is logged
and skipped (a lost event gives its session a new epoch, ``RestoredSession.gap``).
Settled prompts are read in settle time order, as the writer trims them. A prompt whose
row has no terminal but whose end is in the journal's events (its ``turn_complete`` or
``turn_error``: the store refused its terminal, and the deletion in its place too) is
settled from that event (``settled_from_events``): it never runs again, nor fails as
interrupted; ``restore`` and ``adopt`` write that terminal again (``_resettle``).
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import Callable, Container, Iterator, Sequence
from typing import Any, TypeVar

import msgspec

from acp_server.store.errors import StoreUnavailableError
from acp_server.store.leases import SessionLeases
from acp_server.store.open_reads import (OPENED, TURN_ENDS, decode_accepted, decode_event,
                                         decode_opened, decode_settled, read_open_in,
                                         stored, terminal_from_event)
from acp_server.store.segments import (UNREADABLE, Row, around, contains, events_of,
                                       readable)
from acp_server.store.write_behind import MARKER_ID
from bridge.errors import JournalUnavailableError
from bridge.journal import (EndedSession, PromptAccepted, PromptSettled, RestoredSession,
                            SessionOpened)
from bridge.status import MAX_PROMPT_TERMINALS, PromptTerminal
from bridge.wire import Event

log = logging.getLogger("acp_server.store.sessions")
T = TypeVar("T")

SESSION_TABLES = (("session_segments", "session_id"), ("session_prompts", "session_id"),
                  ("session_leases", "session_id"), ("sessions", "id"))


# the closed sessions kept, most recently closed first, with their events' bytes
CLOSED_SIZES = ("SELECT s.id, (SELECT SUM(e.size) FROM session_segments e "
                "WHERE e.session_id = s.id) FROM sessions s WHERE s.closed_at IS NOT NULL "
                "AND s.closed_at >= ? ORDER BY s.closed_at DESC, s.id DESC")

def delete_session(conn: Any, sql: Any, session_id: str) -> None:
    """Every row of ``session_id`` in every journal table (``sql``: the dialect's
    statement text, the journal's ``_sql``)."""
    for table, column in SESSION_TABLES:
        conn.execute(sql(f"DELETE FROM {table} WHERE {column} = ?"), (session_id,))


def settled_from_events(conn: Any, sql: Any, sid: str, ids: set[str]
                        ) -> dict[str, PromptTerminal]:
    """The prompts of ``ids`` (unsettled in their rows) whose end the session's events
    hold: their terminal as ``Session._settle`` gave it (``sql``: the dialect's text)."""
    found: dict[str, PromptTerminal] = {}
    for _, kind, pid, envelope in events_of(sid, conn.execute(sql(
            "SELECT first_id, events FROM session_segments WHERE session_id = ? "
            f"AND last_id > ? AND ({contains('types')} OR {contains('types')}) "
            "ORDER BY last_id"), (sid, MARKER_ID, *around(*TURN_ENDS))), logged=False):
        if kind not in TURN_ENDS or pid is None or pid not in ids or pid in found:
            continue
        terminal = terminal_from_event(envelope, pid)
        if terminal is not None:
            found[pid] = terminal
    return found


@contextlib.contextmanager
def _tolerant_text(conn: Any) -> Iterator[None]:
    """SQLite hands TEXT to Python as UTF-8 and raises, mid-fetch, on a value that is
    not (a record overwritten by hand): within the block such bytes read as U+FFFD, so
    that record fails its own decoding and is skipped, never the whole start."""
    if not isinstance(conn, sqlite3.Connection):
        yield
        return
    before = conn.text_factory
    conn.text_factory = _decode_replacing
    try:
        yield
    finally:
        conn.text_factory = before


def _decode_replacing(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def with_seed(record: SessionOpened, seed: Any) -> SessionOpened:
    """``record`` with the seed read from its row's ``seed`` column (schema migration 7;
    as stored, UTF-8). A NULL column leaves the record as it is: no seed, or one kept
    inside a record written before the column (an instance of an older version)."""
    if seed is None:
        return record
    try:
        text = stored(seed).decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:   # a column written by hand, or damaged: as no seed
        log.warning("session %s: its seed cannot be decoded; it is restored without it",
                    record.session_id)
        return record
    return msgspec.structs.replace(record, seed=text)


def snapshot(conn: Any, postgres: bool, read: Callable[[Any], T]) -> T:
    """``read(conn)`` in one read-only snapshot of the store (a reader's connection runs
    each statement in its own otherwise): SQLite's deferred transaction (WAL: its first
    read fixes what it sees), PostgreSQL's ``REPEATABLE READ``. Ended by a rollback
    whatever happens (nothing was written), so the connection goes back to its pool
    outside a transaction; a rollback that fails (the connection lost) is the read's
    own error's to report, not its."""
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY" if postgres else "BEGIN")
    try:
        return read(conn)
    finally:
        with contextlib.suppress(Exception):
            conn.execute("ROLLBACK")


def read_segments_after(conn: Any, sql: Any, sid: str, after: int, limit: int
                        ) -> list[tuple[int, bytes]]:
    """Up to ``limit`` of the session's events past id ``after``, oldest first, as ``(id,
    envelope)``; a segment that cannot be decoded comes as one row, its first id and
    ``UNREADABLE`` (no envelope decodes: its reader resumes).

    ``read_after`` runs it in one snapshot (``snapshot``). Outside one, its statements
    are each their own: a trim committed between two of them may have deleted segments
    past the ones read. So a statement after the first whose first segment does not go
    on from the ids read (its ``first_id`` past the cursor + 1) ends the page there: the
    next read starts past that hole, which its reader sees (a first id not the one it
    asked after), never a hole inside a page."""
    found: list[tuple[int, bytes]] = []
    cursor = max(after, MARKER_ID)
    step = 4   # segments a statement, doubled each time: at most a few decoded past need
    while len(found) < limit:
        step = min(step, limit)
        segments = conn.execute(sql(
            "SELECT last_id, first_id, events FROM session_segments WHERE session_id = ? "
            "AND last_id > ? ORDER BY last_id LIMIT ?"), (sid, cursor, step)).fetchall()
        if found and segments and int(segments[0][1]) > cursor + 1:
            break   # a hole after what this page holds (maybe a trim meanwhile)
        for last_id, first_id, blob in segments:
            unreadable: list[int] = []
            for event in events_of(sid, [(first_id, blob)], cursor, unreadable):
                found.append((event[0], event[3]))
            if unreadable:
                found.append((max(int(first_id), cursor + 1), UNREADABLE))
            cursor = max(cursor, int(last_id))
            if len(found) >= limit:
                break
        if len(segments) < step:
            break
        step *= 2
    return found[:limit]


def _unbroken_tail(events: list[Event], last: int) -> list[Event]:
    """The newest of ``events`` (id order) whose ids run without a hole up to ``last``:
    a bus indexes its ring by id (``bridge.bus``), so a restored ring past a lost event
    (unreadable, or never committed) starts after it; empty when the last one is lost.
    Its readers resync anyway: a lost event gives the session a new epoch."""
    start = len(events)
    while start and events[start - 1].id == last - (len(events) - start):
        start -= 1
    return events[start:]


class SessionReads:
    """The reads of ``StoreSessionJournal`` (its attributes, set there)."""

    store: Any
    leases: SessionLeases | None
    owner: str | None
    fence: dict[str, int]
    ring_size: int
    _untrimmed: dict[str, int]

    def _sql(self, text: str) -> str:
        raise NotImplementedError

    # -- restore and purge ---------------------------------------------------------------
    def append(self, record: PromptSettled) -> int:
        raise NotImplementedError   # StoreSessionJournal's

    def _resettle(self, resettle: dict[str, list[PromptTerminal]]) -> None:
        """Write again the terminals of prompts settled from their events (a store that
        refuses them still is logged and counted again, as any refusal)."""
        for sid, terminals in resettle.items():
            for t in terminals:
                self.append(PromptSettled(session_id=sid, prompt_id=t.prompt_id,
                                          terminal=t.terminal, at=t.at,
                                          stop_reason=t.stop_reason, error_code=t.error_code))

    async def restore(self) -> list[RestoredSession]:
        settled: dict[str, int] = {}
        resettle: dict[str, list[PromptTerminal]] = {}
        if self.leases is None:
            found = await self.store._read(lambda conn: self._restore_in(
                conn, "owner IS NULL OR owner = ?", (self.owner,), settled=settled,
                resettle=resettle))
            self._seed_untrimmed(settled)
            self._resettle(resettle)
            if getattr(self.store, "unsynced_loss", False):   # SQLite, after a power loss
                log.warning("session journal: the last run's newest commits may be lost "
                            "(no clean stop, another boot): every session gets a new epoch")
                for session in found:
                    session.gap = True
            settled = getattr(self.store, "settled_earlier_runs", None)
            if settled is not None:
                settled()
            return found
        leases = self.leases
        def start(conn: Any, out: Any, *state: Any) -> dict[str, int]:
            leases.load_secret(conn)
            return leases.take_own(conn)

        tokens = await self.store._write(start)
        self.fence.update(tokens)
        found = await self.store._read(lambda conn: self._restore_in(
            conn, "(closed_at IS NOT NULL AND (owner IS NULL OR owner = %s)) OR id = ANY(%s)",
            (self.owner, sorted(tokens)), settled=settled, resettle=resettle))
        self._seed_untrimmed(settled)
        self._resettle({sid: ts for sid, ts in resettle.items() if sid in tokens})
        return found

    def _seed_untrimmed(self, settled: dict[str, int]) -> None:
        """The live sessions' settled prompts on disk as restored: those past the kept
        number count towards their next trim (``_planned``), so a session that
        settles fewer than ``TRIM_TERMINALS_EVERY`` prompts per run is trimmed too."""
        for sid, count in settled.items():
            if count > MAX_PROMPT_TERMINALS:
                self._untrimmed[sid] = count - MAX_PROMPT_TERMINALS

    def _restore_in(self, conn: Any, where: str, params: tuple[Any, ...],
                    ring: int | None = None, settled: dict[str, int] | None = None,
                    resettle: dict[str, list[PromptTerminal]] | None = None,
                    seed: bool = True) -> list[RestoredSession]:
        """The sessions ``where`` selects; ``settled`` (when given) gets each live
        one's count of settled prompts on disk, ``resettle`` the prompts settled from
        their events (``settled_from_events``), by session. ``seed``: a branch's seed
        is read (``with_seed``), else its record comes without it."""
        with _tolerant_text(conn):
            return self._restore_rows(conn, where, params, ring, settled, resettle, seed)

    def _restore_rows(self, conn: Any, where: str, params: tuple[Any, ...],
                      ring: int | None, settled: dict[str, int] | None,
                      resettle: dict[str, list[PromptTerminal]] | None, seed: bool
                      ) -> list[RestoredSession]:
        sql = self._sql
        found: list[RestoredSession] = []
        for sid, blob, closed_at, seeded in conn.execute(sql(
                f"SELECT id, record, closed_at, {'seed' if seed else 'NULL'} FROM sessions "
                f"WHERE {where} ORDER BY created_at"), params).fetchall():
            record = decode_opened(sid, blob)
            if record is None:
                continue
            record = with_seed(record, seeded)
            terminals: list[PromptTerminal] = []
            unsettled: list[PromptAccepted] = []
            for pid, prompt_blob, terminal_blob in conn.execute(sql(
                    "SELECT prompt_id, record, terminal FROM session_prompts "
                    "WHERE session_id = ? ORDER BY seq"), (sid,)).fetchall():
                try:
                    if terminal_blob is not None:
                        terminals.append(decode_settled(terminal_blob))
                    else:
                        unsettled.append(decode_accepted(prompt_blob))
                except msgspec.MsgspecError as exc:
                    log.error("session journal: prompt %s of session %s is unreadable (%s): "
                              "skipped", pid, sid, exc)
            if unsettled:   # rare: a restart found them running or queued
                ended = settled_from_events(conn, sql, sid, {p.prompt_id for p in unsettled})
                if ended:
                    log.warning("session journal: %d prompt(s) of session %s ended without "
                                "their terminal in the journal: settled from their events",
                                len(ended), sid)
                    unsettled = [p for p in unsettled if p.prompt_id not in ended]
                    terminals.extend(ended.values())
                    if resettle is not None:
                        resettle[sid] = list(ended.values())
            terminals.sort(key=lambda t: t.at)   # as trimmed: by settle time, then seq
            if settled is not None and closed_at is None:
                settled[sid] = len(terminals)
            events, last, gap = self._ring_in(conn, sid, ring or self.ring_size)
            started: set[str] = set()
            if unsettled:
                ids = {p.prompt_id for p in unsettled}
                for _, kind, pid, _ in events_of(sid, conn.execute(sql(
                        "SELECT first_id, events FROM session_segments WHERE session_id = ? "
                        "AND last_id > ? ORDER BY last_id"), (sid, MARKER_ID)),
                        logged=False):
                    if pid in ids and kind != "pending_prompt_added":
                        started.add(pid)
            if gap:
                log.warning("session journal: session %s lost events: a new epoch", sid)
            found.append(RestoredSession(
                record=record, events=events, last_event_id=last,
                terminals=terminals[-MAX_PROMPT_TERMINALS:], unsettled=unsettled,
                started=started, closed_at=closed_at, gap=gap))
        return found

    def _ring_in(self, conn: Any, sid: str, ring: int) -> tuple[list[Event], int, bool]:
        """The session's newest ``ring`` events (the newest segments', oldest first),
        its last event id (its newest segment's, readable or not) and whether it lost
        events: a write-behind marker set, an event or a segment unreadable, a hole
        in the ids (then the ring is the run of ids up to the last, ``_unbroken_tail``)."""
        sql = self._sql
        # readers may have seen events ahead of the journal (write-behind): resync
        gap = conn.execute(sql("SELECT 1 FROM session_segments WHERE session_id = ? AND "
                               "last_id = ?"), (sid, MARKER_ID)).fetchone() is not None
        decoded: list[list[Row]] = []
        count, last = 0, 0
        # newest first, each segment at least one event: ``ring`` segments are enough
        for first_id, last_id, blob in conn.execute(sql(
                "SELECT first_id, last_id, events FROM session_segments WHERE session_id = ? "
                "AND last_id > ? ORDER BY last_id DESC LIMIT ?"),
                (sid, MARKER_ID, ring)):   # (SQLite: read as far as needed)
            last = last or int(last_id)
            segment = readable(sid, first_id, blob)
            if segment is None:
                gap = True
                continue
            decoded.append(segment)
            count += len(segment)
            if count >= ring:
                break
        rows: list[Row] = []
        for segment in reversed(decoded):   # oldest first, each id once
            rows += segment if not rows else [e for e in segment if e[0] > rows[-1][0]]
        rows = rows[-ring:]
        events: list[Event] = []
        for event_id, _, _, envelope in rows:
            try:
                event = decode_event(envelope, event_id)
            except msgspec.MsgspecError as exc:
                log.error("session journal: event %s of session %s is unreadable (%s): "
                          "skipped", event_id, sid, exc)
                gap = True
                continue
            if events and event.id != events[-1].id + 1:
                gap = True
            events.append(event)
        if events and events[-1].id != last:
            gap = True   # the newest segment was unreadable
        if gap:   # the ring holds the run of ids up to the last, without a hole
            events = _unbroken_tail(events, last)
        return events, last, gap

    # -- reads for other instances (``acp_server.fleet.replica``) ------------------------
    async def read(self, session_id: str, *, only: Sequence[str] | None = None,
                   seed: bool = False) -> RestoredSession | None:
        """One session as the journal has it (live or closed), taking no lease: what
        an instance that does not run it serves its reads from, and what a cold load
        of a closed session its agent no longer knows is seeded from (``seed``: with
        its branch's seed, else its record has none). ``only`` (event types, for a
        status): of its events only the newest and those of these types are read, not
        its ring. ``JournalUnavailableError`` when the store cannot answer."""
        def read(conn: Any) -> RestoredSession | None:
            found = self._restore_in(conn, self._sql("id = ?"), (session_id,),
                                     None if only is None else 1, seed=seed)
            if found and only is not None:
                self._with_events(conn, found[0], only)
            return found[0] if found else None

        try:
            return await self.store._read(read)
        except StoreUnavailableError as exc:
            raise JournalUnavailableError(exc.reason) from exc

    async def read_open(self, only: Sequence[str], exclude: Container[str] = ()
                        ) -> list[RestoredSession]:
        """Every session the journal holds open (not closed) but those in ``exclude``,
        as ``read`` with ``only`` reads one, in a fixed number of statements
        (``open_reads``): what the listings of an instance show of the sessions the
        others run."""
        try:
            return await self.store._read(lambda conn: self._open_in(conn, only, exclude))
        except StoreUnavailableError as exc:
            raise JournalUnavailableError(exc.reason) from exc

    def _open_in(self, conn: Any, only: Sequence[str], exclude: Container[str]
                 ) -> list[RestoredSession]:
        with _tolerant_text(conn):   # a record that is TEXT and not UTF-8: skipped
            return read_open_in(conn, self._sql, only, exclude)

    def _with_events(self, conn: Any, session: RestoredSession, only: Sequence[str]) -> None:
        """Add the session's events of the types ``only`` to the newest it has."""
        asked = {event.id: event for event in session.events}
        sid = session.record.session_id
        kinds = " OR ".join(contains("types") for _ in only) or "FALSE"
        for _, kind, _, envelope in events_of(sid, conn.execute(self._sql(
                "SELECT first_id, events FROM session_segments WHERE session_id = ? "
                f"AND last_id > ? AND ({kinds}) ORDER BY last_id"),
                (sid, MARKER_ID, *around(*only))), logged=False):
            if kind in only:
                with contextlib.suppress(msgspec.MsgspecError):
                    event = decode_event(envelope)
                    asked[event.id] = event
        session.events = [asked[i] for i in sorted(asked)]  # type: ignore[type-var]

    async def read_after(self, session_id: str, after: int, limit: int = 512
                         ) -> tuple[SessionOpened | None, bool, list[tuple[int, bytes]]]:
        """A reader's next rows: (the session's record, ``None`` when it is gone;
        whether it is closed; up to ``limit`` of its event envelopes after id
        ``after``, oldest first, as ``(id, envelope)``). One snapshot: the record and
        the events are of one moment, so a reset committed meanwhile (a new life of the
        id: a new epoch, its ids from 1) never gives the old record with the new life's
        events, nor a trim a hole inside the page (``snapshot``)."""
        sql = self._sql

        def read(conn: Any) -> tuple[SessionOpened | None, bool, list[tuple[int, bytes]]]:
            row = conn.execute(sql("SELECT record, closed_at FROM sessions WHERE id = ?"),
                               (session_id,)).fetchone()
            if row is None:
                return None, True, []
            return (decode_opened(session_id, row[0]), row[1] is not None,
                    read_segments_after(conn, sql, session_id, after, limit))

        postgres = self.postgres
        return await self.store._read(lambda conn: snapshot(conn, postgres, read))

    async def record_of(self, session_id: str) -> SessionOpened | None:
        """The session's record, live or closed (its maker: a cold restore of a closed
        session the bridge no longer remembers keeps it as owner; its agent: what a
        load that names none restores it on); ``None`` when there is none, or it
        cannot be decoded (logged)."""
        sql = self._sql

        def read(conn: Any) -> bytes | None:
            row = conn.execute(sql("SELECT record FROM sessions WHERE id = ?"),
                               (session_id,)).fetchone()
            return None if row is None else stored(row[0])

        try:
            blob = await self.store._read(read)
        except StoreUnavailableError as exc:
            raise JournalUnavailableError(exc.reason) from exc
        return None if blob is None else decode_opened(session_id, blob)

    async def ended(self, *, before: tuple[float, str] | None, limit: int
                    ) -> list[EndedSession]:
        """The closed sessions kept, newest end first (``(closed_at, id)`` descending),
        strictly after ``before``: ``limit`` of them unless fewer follow (a caller
        takes a short answer for the end). A record that cannot be decoded is logged
        and skipped, and read past: it never shortens the answer.
        ``JournalUnavailableError`` when the store cannot answer."""
        sql = self._sql

        def read(conn: Any) -> list[EndedSession]:
            found: list[EndedSession] = []
            position = before
            while True:
                where, params = "closed_at IS NOT NULL", ()
                if position is not None:
                    where += " AND (closed_at < ? OR (closed_at = ? AND id < ?))"
                    params = (position[0], position[0], position[1])
                asked = limit - len(found)
                rows = conn.execute(sql(
                    f"SELECT id, record, closed_at FROM sessions WHERE {where} "
                    f"ORDER BY closed_at DESC, id DESC LIMIT ?"), (*params, asked)).fetchall()
                for sid, blob, closed_at in rows:
                    position = (float(closed_at), str(sid))
                    try:
                        record = OPENED.decode(stored(blob))
                    except msgspec.MsgspecError as exc:
                        log.error("session journal: session %s has an unreadable record "
                                  "(%s)", sid, exc)
                        continue
                    found.append(EndedSession(record=record, ended_at=float(closed_at)))
                if len(rows) < asked or len(found) >= limit:
                    return found

        try:
            return await self.store._read(read)
        except StoreUnavailableError as exc:
            raise JournalUnavailableError(exc.reason) from exc

    async def purge(self, closed_before: float, max_bytes: int = 0) -> int:
        """Remove the sessions closed before ``closed_before`` (epoch seconds); with
        ``max_bytes``, also the longest closed of the others once the closed sessions'
        events (their envelopes' lengths, read from the rows' headers) take more than
        that in all, newest closed first: without it, sessions left to close (the idle
        timeout, an agent's death), each holding up to its 80 MiB, filled the disk
        within the retention."""
        def op(conn: Any, out: Any, *state: Any) -> int:
            sql = self._sql
            ids = [row[0] for row in conn.execute(sql(
                "SELECT id FROM sessions WHERE closed_at IS NOT NULL AND closed_at < ?"),
                (closed_before,)).fetchall()]
            if max_bytes > 0:
                total = 0
                for sid, size in conn.execute(sql(CLOSED_SIZES), (closed_before,)).fetchall():
                    total += int(size or 0)
                    if total > max_bytes:
                        ids.append(sid)
            for sid in ids:
                delete_session(conn, sql, sid)
            return len(ids)

        try:
            return await self.store._write(op)
        except StoreUnavailableError as exc:
            raise JournalUnavailableError(exc.reason) from exc

