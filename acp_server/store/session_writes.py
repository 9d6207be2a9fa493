"""The session journal's writes (``acp_server.store.sessions.StoreSessionJournal``
inherits them): a commit's records in SQL, on the writer's worker thread, inside the
store's transaction.

    taken, refused = journal._apply(conn, records, fence)   # what ``_commit_in`` runs

Contracts: see ``acp_server.store.sessions``. ``EventsReset`` (a session id made anew:
its bus numbers from 1 again; a load undone) deletes the id's events (not its record or
write-behind marker; when it has no record, every row of it: a load undone leaves
nothing, and a live or closed session's prompts are never touched), unless another
instance holds its lease live; a commit's plan keeps the newest event of each bus
(session id and ``EventRecord.epoch``), so a late commit of an old bus never releases
the new one. Records go in order, in as few statements as it takes (multi-row INSERTs
of events and accepted prompts, one UPDATE of the terminals between two session
records; a settled prompt's row keeps its terminal, its body is emptied in the same
UPDATE); what a commit trims and counts was planned in the event loop as it started
(``CommitPlan``, ``acp_server.store.session_trims``), so a transaction run twice does
the same and counts nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec

from acp_server.store.leases import SessionLeases
from acp_server.store.segments import (MARKER_INSERT, SEGMENT_EVENTS, SEGMENT_INSERT, Row,
                                       decode_segment, segment_values, split_newest)
from acp_server.store.session_reads import delete_session
from acp_server.store.write_behind import MARKER_ID, Marker
from bridge.journal import (
    RECORD_ENCODER,
    EventRecord,
    EventsReset,
    JournalRecord,
    PromptAccepted,
    PromptSettled,
    SessionEnded,
    SessionOpened,
)
from bridge.status import MAX_PROMPT_TERMINALS

COMPACT_EVERY = 256   # events per session between two trims of its oldest events
_JSON_RECORD = msgspec.json.Encoder()


def _encode(record: JournalRecord) -> bytes:
    """A record in msgpack; one msgpack cannot hold (a prompt with an integer past 64
    bits: JSON allows any, and the agent gets it unchanged) in JSON, which starts with
    ``{`` where a msgpack record never does. So a hostile prompt is journaled like any
    other and never fails a commit that carries other sessions' records."""
    try:
        return RECORD_ENCODER.encode(record)
    except OverflowError:
        return _JSON_RECORD.encode(record)


Record = JournalRecord | Marker   # what the journal commits
ROWS_PER_STATEMENT = 500   # x 7 parameters: under SQLite's and PostgreSQL's limits
CACHED_ROWS = 64   # statement texts kept for up to this many rows (and the full one)
# SQLite: the events' INSERT of more than CACHED_ROWS rows is padded to a multiple of
# PAD_ROWS rows (the last row again: ``ON CONFLICT DO NOTHING`` makes it a no-op), so a
# commit of any size runs a statement SQLite has prepared before: preparing one costs
# about as much as running it (~1.5 us a row), and commits of a burst have every size
PAD_ROWS = 32
# A prompt id admitted again (a client's id, its first admission refused: ``bridge.
# status.REFUSED_CODES``) names a new prompt: its row starts over, unsettled. A batch
# run again writes the same rows in the same order (``_put`` ends a statement before a
# prompt id it already holds: one statement never touches a row twice).
PROMPT_INSERT = ("INSERT INTO session_prompts(session_id, prompt_id, seq, record) "
                 "VALUES {} ON CONFLICT (session_id, prompt_id) DO UPDATE SET "
                 "seq = excluded.seq, record = excluded.record, terminal = NULL, "
                 "settled_at = NULL", 4)
# A session's settled prompts older (settle time, then admission order) than its
# ``MAX_PROMPT_TERMINALS``-th newest: one sort for the cut, then one pass (a NOT IN of
# the newest ids probed every row: ~3x the CPU, 280 against 85 us at 320 rows)
TERMINALS_TRIM = ("DELETE FROM session_prompts WHERE session_id = ? AND terminal IS NOT NULL "
                  "AND (COALESCE(settled_at, 0), seq) < (SELECT COALESCE(settled_at, 0), seq "
                  "FROM session_prompts WHERE session_id = ? AND terminal IS NOT NULL "
                  "ORDER BY COALESCE(settled_at, 0) DESC, seq DESC LIMIT 1 OFFSET ?)")
# A settled prompt's row keeps its terminal, not its body (``record``: read only while
# the prompt is not settled, to run it again after a restart or answer its id with its
# admission): an empty blob in both dialects, from a value of the row's own statement
# (not the body), in the same statement as the terminal.
SETTLE_UPDATE = ("WITH v(sid, pid, terminal, at) AS (VALUES {}) "
                 "UPDATE session_prompts SET terminal = v.terminal, "
                 "record = substr(v.terminal, 1, 0), "
                 "settled_at = CAST(v.at AS BIGINT) FROM v "
                 "WHERE session_prompts.session_id = v.sid AND session_prompts.prompt_id = v.pid")


def segment_rows(events: dict[str, list[Row]]) -> list[Any]:
    """One ``SEGMENT_INSERT`` row (its values in a row) per session of ``events``."""
    values: list[Any] = []
    for sid, run in events.items():
        values += segment_values(sid, run)
    return values


@dataclasses.dataclass(slots=True)
class CommitPlan:
    """What one commit trims and how the counts change once it lands (``_planned``)."""

    trims: set[str] = dataclasses.field(default_factory=set)   # old terminals
    untrimmed: dict[str, int | None] = dataclasses.field(default_factory=dict)
    byte_trims: set[str] = dataclasses.field(default_factory=set)   # oldest events
    unsized: dict[str, int | None] = dataclasses.field(default_factory=dict)
    # each bus's newest event (session id, epoch): what its readers may see once landed
    newest: dict[tuple[str, str], EventRecord] = dataclasses.field(default_factory=dict)
    # the ids whose prompt rows a reset deleted (no record: ``_reset_events_in``;
    # filled as the commit runs, on the writer's thread: a set, so a rerun adds nothing)
    orphans: set[str] = dataclasses.field(default_factory=set)

    def count_settled(self, untrimmed: dict[str, int]) -> None:
        """The commit landed: each session's settled prompts past the kept number."""
        for sid, count in self.untrimmed.items():
            if count is None:
                untrimmed.pop(sid, None)
            else:
                untrimmed[sid] = count
        for sid in self.orphans:   # its rows are gone: nothing to trim
            untrimmed.pop(sid, None)


class SessionWrites:
    """The writes of ``StoreSessionJournal`` (its attributes, set there)."""

    postgres: bool
    leases: SessionLeases | None
    owner: str | None
    ring_size: int
    max_session_bytes: int
    _plan: CommitPlan
    _statements: dict[tuple[str, int], str]
    _batch_resend: bool   # the commit in flight follows a failed one (``_drop_covered``)

    def _sql(self, text: str) -> str:
        return text.replace("?", "%s") if self.postgres else text

    def _apply(self, conn: Any, records: list[Record], fence: dict[str, int] | None
               ) -> tuple[dict[str, int], set[str]]:
        """The records in order, in as few statements as it takes (``_put``), then the
        trims due. Returns (the leases it took, the sessions it refused: a stale fence)."""
        refused = self._fenced(conn, records, fence)
        taken: dict[str, int] = {}
        trim: dict[str, int] = {}
        self._put(conn, records, refused, taken, trim)
        self._trims(conn, trim, refused)
        return taken, refused

    def _fenced(self, conn: Any, records: list[Record], fence: dict[str, int] | None
                ) -> set[str]:
        """The sessions of ``records`` whose lease this instance no longer holds."""
        if fence and self.leases is not None:
            mine = {r.session_id: fence[r.session_id] for r in records
                    if r.session_id in fence}
            return self.leases.stale(conn, mine) if mine else set()
        return set()

    def _put(self, conn: Any, records: list[Record], refused: set[str],
             taken: dict[str, int], trim: dict[str, int]) -> None:
        """Each statement gives up the GIL and must win it back from a busy event loop
        (see ``store.writer``), so the events, accepted prompts and terminals between
        two session records (``SessionOpened``, ``SessionEnded``: they order everything
        around them) go in one multi-row statement each, in that order (a terminal
        after its prompt). The records of a ``refused`` session are skipped (a
        ``SessionOpened`` whose lease is elsewhere adds its session); ``taken`` gets the
        leases taken, ``trim`` each session's oldest events due to be deleted."""
        # each session's events since the last flush: one segment row each (``segments``;
        # ``full``: the values of those that reached ``SEGMENT_EVENTS``)
        events: dict[str, list[Row]] = {}
        full: list[Any] = []
        accepted: list[Any] = []   # PROMPT_INSERT's 4 a row
        settled: list[PromptSettled] = []
        prompts: set[tuple[str, str]] = set()   # the prompt rows of those statements
        ring = self.ring_size

        def flush() -> None:
            prompts.clear()
            if events:
                full.extend(segment_rows(events))
                events.clear()
            if full:
                if self._batch_resend:
                    self._drop_covered(conn, full)
                self._insert_rows(conn, SEGMENT_INSERT, full)
                full.clear()
            if accepted:
                self._insert_rows(conn, PROMPT_INSERT, accepted)
                accepted.clear()
            if settled:
                self._settle_rows(conn, settled)
                settled.clear()

        for record in records:
            if type(record) is EventRecord:   # most records (a final class: no subclass)
                sid = record.session_id
                if sid in refused:
                    continue
                event_id = record.event_id
                event = (event_id, record.type, record.prompt_id, record.envelope)
                run = events.get(sid)
                if run is None:
                    events[sid] = [event]
                elif event_id > run[-1][0] and len(run) < SEGMENT_EVENTS:
                    run.append(event)
                else:
                    if event_id > run[-1][0]:   # full: the next segment starts
                        full.extend(segment_values(sid, run))
                    else:   # not past the segment's last id (never from one bus): alone
                        flush()
                    events[sid] = [event]
                if event_id % COMPACT_EVERY == 0 and event_id > ring:
                    trim[sid] = event_id - ring
                continue
            if record.session_id in refused:
                continue
            # ``type() is``: the records' classes are final, and ``isinstance`` of a
            # msgspec struct costs more
            if type(record) is SessionOpened and self.leases is not None:
                token = self.leases.open(conn, record.session_id)
                if token is None:
                    refused.add(record.session_id)
                    continue
                taken[record.session_id] = token
            if type(record) is PromptAccepted:
                key = (record.session_id, record.prompt_id)
                if key in prompts:   # its id admitted again: after the earlier rows
                    flush()
                prompts.add(key)
                accepted += (record.session_id, record.prompt_id, record.seq,
                             _encode(record))
            elif type(record) is PromptSettled:
                prompts.add((record.session_id, record.prompt_id))
                settled.append(record)
            elif type(record) is Marker:
                flush()
                if record.on:
                    conn.execute(self._sql(MARKER_INSERT), (record.session_id, b""))
                else:
                    conn.execute(self._sql("DELETE FROM session_segments WHERE session_id = ? "
                                           "AND last_id = ?"), (record.session_id, MARKER_ID))
            else:
                flush()
                if isinstance(record, EventsReset):
                    trim.pop(record.session_id, None)   # of the events it deletes
                self._apply_one(conn, record)
        flush()

    def _drop_covered(self, conn: Any, values: list[Any]) -> None:
        """A commit that follows a failed one, whose records it carries again: that one
        may have landed with only its answer lost (PostgreSQL, a connection dropped
        after COMMIT), and a session's events then come again in a longer segment with
        the same first ids. Each stored segment a new one of ``values`` covers (its
        ids within the new one's) is deleted first: no id is in two segments, no size
        counts twice."""
        sql = self._sql("DELETE FROM session_segments WHERE session_id = ? "
                        "AND last_id BETWEEN ? AND ? AND first_id >= ?")   # (its key's range)
        for at in range(0, len(values), SEGMENT_INSERT[1]):
            sid, first, last = values[at:at + 3]
            conn.execute(sql, (sid, first, last, first))

    def _trims(self, conn: Any, trim: dict[str, int], refused: set[str]) -> None:
        """The oldest events past the ring (``trim``), the old terminals and the byte
        trims planned (``_planned``): once, after every record of the commit is in."""
        for sid, through in trim.items():   # the segments wholly at or below ``through``
            conn.execute(self._sql("DELETE FROM session_segments WHERE session_id = ? "
                                   "AND last_id > ? AND last_id <= ?"), (sid, MARKER_ID, through))
        for sid in self._plan.trims:   # the newest terminals only (``_planned``)
            if sid not in refused:
                conn.execute(self._sql(TERMINALS_TRIM), (sid, sid, MAX_PROMPT_TERMINALS - 1))
        for sid in self._plan.byte_trims:   # due a byte trim (``_planned``)
            if sid not in refused:
                self._trim_bytes(conn, sid)

    def _trim_bytes(self, conn: Any, sid: str) -> None:
        """Delete the session's oldest events until the rest take at most
        ``max_session_bytes`` (its newest event always stays): whole segments, and the
        one straddling the bound rewritten to its newest events that fit."""
        sql, bound = self._sql, self.max_session_bytes
        sizes = conn.execute(sql(
            "SELECT last_id, first_id, size FROM session_segments WHERE session_id = ? "
            "AND last_id > ? ORDER BY last_id DESC"), (sid, MARKER_ID)).fetchall()
        total = 0
        for n, (last_id, first_id, size) in enumerate(sizes):
            if total + int(size) <= bound:
                total += int(size)
                continue
            cut = int(last_id)   # every segment through this one goes, but what it keeps
            row = conn.execute(sql("SELECT events FROM session_segments WHERE session_id = ? "
                                   "AND last_id = ?"), (sid, cut)).fetchone()
            try:
                kept = split_newest(decode_segment(row[0]), bound - total, n == 0)
            except msgspec.MsgspecError:
                kept = []   # unreadable: dropped whole (the restore skipped it anyway)
            conn.execute(sql("DELETE FROM session_segments WHERE session_id = ? AND "
                             "last_id > ? AND last_id <= ?"), (sid, MARKER_ID, cut))
            if kept:
                conn.execute(sql(SEGMENT_INSERT[0].format("(?,?,?,?,?,?,?)")),
                             segment_values(sid, kept))
            return

    def _insert_rows(self, conn: Any, head: tuple[str, int], values: list[Any]) -> None:
        """``INSERT ... VALUES (..),(..) ON CONFLICT …`` (``head``'s) of ``values`` (the
        rows' values in a row), ``ROWS_PER_STATEMENT`` rows a statement (the events'
        padded on SQLite, ``PAD_ROWS``)."""
        sql, width = head
        step = width * ROWS_PER_STATEMENT
        for start in range(0, len(values), step):
            chunk = values[start:start + step] if len(values) > step else values
            rows = len(chunk) // width
            if rows > CACHED_ROWS and rows % PAD_ROWS and head is SEGMENT_INSERT \
                    and not self.postgres:
                padded = min(ROWS_PER_STATEMENT, -(-rows // PAD_ROWS) * PAD_ROWS)
                # its smallest row again: a segment's blob is bound (copied) each time
                # it pads, and one may hold SEGMENT_EVENTS large envelopes
                at = min(range(0, len(chunk), width), key=lambda i: len(chunk[i + width - 1]))
                chunk = chunk + chunk[at:at + width] * (padded - rows)   # a copy: rows padded
                rows = padded
            conn.execute(self._statement(sql, width, rows), chunk)

    def _statement(self, sql: str, width: int, rows: int) -> str:
        """``sql`` with ``rows`` rows of ``width`` parameters. Kept for the small row
        counts (at most ``CACHED_ROWS``), the padded ones (``PAD_ROWS``) and the full
        statement (``ROWS_PER_STATEMENT``); the others are built each time (caching
        every count held up to 1,500 texts, ~5.8 MB a journal on PostgreSQL)."""
        text = self._statements.get((sql, rows))
        if text is None:
            one = "(" + ",".join("?" * width) + ")"
            text = self._sql(sql.format(",".join([one] * rows)))
            if rows <= CACHED_ROWS or rows == ROWS_PER_STATEMENT or rows % PAD_ROWS == 0:
                self._statements[sql, rows] = text
        return text

    def _settle_rows(self, conn: Any, records: list[PromptSettled]) -> None:
        for start in range(0, len(records), ROWS_PER_STATEMENT):
            chunk = records[start:start + ROWS_PER_STATEMENT]
            params: list[Any] = []
            for record in chunk:
                params += (record.session_id, record.prompt_id, _encode(record), record.at)
            conn.execute(self._statement(SETTLE_UPDATE, 4, len(chunk)), params)

    def _apply_one(self, conn: Any, record: JournalRecord) -> None:
        sql = self._sql
        if isinstance(record, SessionOpened):
            # its seed in a column of its own, which only the restore reads (schema
            # migration 7): the record every other reader reads stays small
            seed = None if record.seed is None else record.seed.encode("utf-8",
                                                                        "surrogatepass")
            conn.execute(sql(
                "INSERT INTO sessions(id, created_at, record, owner, seed) "
                "VALUES (?,?,?,?,?) ON CONFLICT (id) DO UPDATE SET record = excluded.record, "
                "closed_at = NULL, owner = excluded.owner, seed = excluded.seed"),
                (record.session_id, record.created_at,
                 _encode(msgspec.structs.replace(record, seed=None)), self.owner, seed))
        elif isinstance(record, EventsReset):
            self._reset_events_in(conn, record.session_id)
        elif isinstance(record, SessionEnded):
            if record.deleted:
                delete_session(conn, sql, record.session_id)
            else:
                conn.execute(sql("UPDATE sessions SET closed_at = ? WHERE id = ?"),
                             (record.at, record.session_id))
                conn.execute(sql("DELETE FROM session_leases WHERE session_id = ?"),
                             (record.session_id,))

    def _reset_events_in(self, conn: Any, sid: str) -> None:
        """``EventsReset``: the id's events go (not a write-behind marker: its own
        bookkeeping clears it). When the id has no session record (a load undone, or
        one a crash cut short) every row of it goes: its prompts (admitted while the
        agent had not answered) and its marker too (the reset comes before the next
        life's first marker); a live or closed session's record keeps them. Not when
        another instance holds the id's lease live (a shared store: its session, not
        this one's to touch)."""
        if self.leases is not None and self.leases.held_elsewhere(conn, sid):
            return
        sql = self._sql
        if conn.execute(sql("SELECT 1 FROM sessions WHERE id = ?"), (sid,)).fetchone() is None:
            conn.execute(sql("DELETE FROM session_segments WHERE session_id = ?"), (sid,))
            conn.execute(sql("DELETE FROM session_prompts WHERE session_id = ?"), (sid,))
            self._plan.orphans.add(sid)
        else:
            conn.execute(sql("DELETE FROM session_segments WHERE session_id = ? "
                             "AND last_id > ?"), (sid, MARKER_ID))
