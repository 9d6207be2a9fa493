"""The session journal on the store: the bridge's ``SessionJournal`` on SQLite or
PostgreSQL, through the same group-commit writer as the LMSP tasks.

    store = store_for(url, state_dir=state_dir)
    async with store, StoreSessionJournal(store, ring_size=8000) as journal:
        async with Bridge(factory, workspace_cwd="/ws", journal=journal) as bridge:
            ...   # sessions restored at start, every accepted prompt committed before its 202

Contracts (besides ``bridge.journal``'s):

* At most one operation of the store's writer is queued or running at a time; it
  takes everything appended so far when the writer starts it (so what is appended
  while it waits in the queue joins it) and commits it with whatever else the writer
  batches (the tasks' operations, the audit log: one transaction, one fsync). While a
  commit is in flight, what is appended waits for the next one: group commit without
  a timer. Its outcome is handled in the writer's own task (``Op.on_done``): readers
  and the callers of ``wait`` are released with no extra task hop.
* A failed commit fails the records somebody waits for (``SessionOpened``,
  ``PromptAccepted``: their callers answer 503, ``JournalUnavailableError``) and keeps
  the others (events, terminals, closes) in order for the next attempt, retried with
  a capped backoff. At most ``MAX_PENDING`` records wait: past it the oldest events are
  let through to readers without being journaled, and the next start gives that
  session a new epoch (``RestoredSession.gap``): never a silent gap.
* ``write_behind`` > 0 (``--session-write-behind``): events may reach readers before
  their commit, within that window, behind a per-session marker row
  (``acp_server.store.write_behind``); a session restored with its marker set gets a
  new epoch (``RestoredSession.gap``). 0: publish after commit.
* Tables (schema migration 3): ``sessions`` (the record, ``closed_at``),
  ``session_prompts`` (each accepted prompt, its terminal once settled),
  ``session_events`` (each event's envelope by id). Per session at most
  ``ring_size`` events are kept (older ones are deleted as newer ones commit: a reader
  behind them gets ``ring_evicted``, as from the in-memory ring) and the newest
  ``MAX_PROMPT_TERMINALS`` settled prompts.
* Bounded in bytes too: once a session has had a quarter of ``max_session_bytes``
  of envelopes journaled since its last byte trim, its oldest events are deleted until
  the rest take at most ``max_session_bytes`` (never its newest event: the event ids
  go on from it). So a session's events take at most 1.25 × ``max_session_bytes``
  plus one batch.
* ``restore`` logs and skips a row it cannot decode. On a PostgreSQL store shared by
  several instances each restores only the sessions it made (``owner``: the store's
  stable instance id); moving sessions between instances is issue #24's.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Self

import anyio
import anyio.abc
import msgspec

from acp_server.store.errors import Backoff, StoreUnavailableError
from acp_server.store.pg_engine import PostgresEngine
from acp_server.store.write_behind import MARKER_ID, MARKER_TYPE, Marker, WriteBehind
from acp_server.store.writer import Op
from bridge.errors import JournalUnavailableError
from bridge.journal import (
    RECORD_ENCODER,
    EventRecord,
    JournalRecord,
    PromptAccepted,
    PromptSettled,
    RestoredSession,
    SessionEnded,
    SessionOpened,
)
from bridge.status import MAX_PROMPT_TERMINALS, PromptTerminal
from bridge.wire import event_from_envelope

log = logging.getLogger("acp_server.store.sessions")

MAX_PENDING = 200_000
COMPACT_EVERY = 256   # events per session between two trims of its oldest events
MAX_SESSION_BYTES = 64 * 1024 * 1024   # event envelopes kept per session (see trim_bytes)
_OPENED = msgspec.msgpack.Decoder(SessionOpened)
_ACCEPTED = msgspec.msgpack.Decoder(PromptAccepted)
_SETTLED = msgspec.msgpack.Decoder(PromptSettled)
_JSON_RECORD = msgspec.json.Encoder()
_ACCEPTED_JSON = msgspec.json.Decoder(PromptAccepted)


def _encode(record: JournalRecord) -> bytes:
    """A record in msgpack; one msgpack cannot hold (a prompt with an integer past 64
    bits: JSON allows any, and the agent gets it unchanged) in JSON, which starts with
    ``{`` where a msgpack record never does. So a hostile prompt is journaled like any
    other and never fails a commit that carries other sessions' records."""
    try:
        return RECORD_ENCODER.encode(record)
    except OverflowError:
        return _JSON_RECORD.encode(record)


def _decode_accepted(blob: bytes) -> PromptAccepted:
    return (_ACCEPTED_JSON if blob[:1] == b"{" else _ACCEPTED).decode(blob)


CRITICAL = (SessionOpened, PromptAccepted)
_Record = JournalRecord | Marker   # what the journal commits
ROWS_PER_STATEMENT = 500   # x 5 parameters: under SQLite's and PostgreSQL's limits
EVENT_INSERT = ("INSERT INTO session_events(session_id, id, type, prompt_id, envelope) "
                "VALUES {} ON CONFLICT DO NOTHING", 5)
PROMPT_INSERT = ("INSERT INTO session_prompts(session_id, prompt_id, seq, record) "
                 "VALUES {} ON CONFLICT DO NOTHING", 4)
SETTLE_UPDATE = ("WITH v(sid, pid, terminal, at) AS (VALUES {}) "
                 "UPDATE session_prompts SET terminal = v.terminal, "
                 "settled_at = CAST(v.at AS BIGINT) FROM v "
                 "WHERE session_prompts.session_id = v.sid AND session_prompts.prompt_id = v.pid")


class StoreSessionJournal:
    """See the module docstring. ``store`` is an open ``GroupCommitStore``."""

    durable = True

    def __init__(self, store: Any, *, ring_size: int = 8000,
                 max_session_bytes: int = MAX_SESSION_BYTES, write_behind: int = 0) -> None:
        """``write_behind``: the events per session readers may see before their
        commit (``acp_server.store.write_behind``); 0 publishes after commit."""
        self.store = store
        self.ring_size = ring_size
        self.max_session_bytes = max_session_bytes
        self._unsized: dict[str, int] = {}   # envelope bytes per session since its trim
        self._write_behind = WriteBehind(write_behind) if write_behind > 0 else None
        self.postgres = isinstance(store, PostgresEngine)
        # A shared (PostgreSQL) store: this instance restores only the sessions it made.
        self.owner: str | None = store.instance if self.postgres else None
        self.commits = 0
        self._on_events: Callable[[Sequence[EventRecord]], None] = lambda records: None
        self._pending: list[tuple[int, _Record]] = []
        self._batch: list[tuple[int, _Record]] = []   # the commit in flight
        self._inflight: Op | None = None
        self._unsent: Op | None = None
        self._failing = False
        self._backoff = Backoff(first=0.05, cap=5.0)
        self._next = 1
        self._durable_through = 0
        self._failed: dict[int, str] = {}
        self._wake = anyio.Event()
        self._flushed = anyio.Event()
        self._closing = False
        self._stopped = anyio.Event()
        self._tg: anyio.abc.TaskGroup | None = None

    # -- lifecycle -------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def open(self) -> AsyncIterator[Self]:
        async with anyio.create_task_group() as tg:
            self._tg = tg
            tg.start_soon(self._flusher)
            try:
                yield self
            finally:
                with anyio.CancelScope(shield=True):
                    await self.aclose()

    async def __aenter__(self) -> Self:
        self._exit = contextlib.AsyncExitStack()
        await self._exit.enter_async_context(self.open())
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._exit.__aexit__(*exc)

    async def aclose(self) -> None:
        """Commit what is queued (one last attempt), then write nothing more."""
        if not self._closing:
            self._closing = True
            self._kick()
            self._wake.set()
        await self._stopped.wait()

    # -- the SessionJournal protocol -----------------------------------------------------
    def bind(self, on_events: Callable[[Sequence[EventRecord]], None]) -> None:
        self._on_events = on_events

    def append(self, record: JournalRecord) -> int:
        if self._closing:
            return 0
        wb = self._write_behind
        if wb is not None:
            if isinstance(record, EventRecord):
                marker = wb.before_event(record.session_id, record.event_id)
                if marker is not None:
                    self._push(marker)
                seq = self._push(record)
                if wb.early(record.session_id, record.event_id):
                    self._on_events([record])   # readers see it now (the window)
                return seq
            if isinstance(record, (PromptAccepted, PromptSettled)):
                wb.prompt(record.session_id, 1 if isinstance(record, PromptAccepted) else -1)
            elif isinstance(record, SessionEnded):
                wb.ended(record.session_id)
        return self._push(record)

    def _push(self, record: _Record) -> int:
        seq = self._next
        self._next += 1
        self._pending.append((seq, record))
        if self._inflight is None:
            self._kick()
        if self._failing and isinstance(record, CRITICAL):
            self._wake.set()   # somebody waits for it: the backoff ends now
        if len(self._pending) > MAX_PENDING:
            self._shed()
        return seq

    async def wait(self, seq: int) -> None:
        while True:
            failed = self._failed.get(seq)
            if failed is not None:
                raise JournalUnavailableError(failed)
            if seq <= self._durable_through or seq == 0:
                return
            if self._stopped.is_set():
                raise JournalUnavailableError("the server is stopping")
            await self._flushed.wait()

    # -- committing: one operation of the store's writer at a time ----------------------
    def _kick(self) -> None:
        """Queue the next commit when none is queued or running: its records are taken
        when the writer starts it (``_take``), so whatever is appended meanwhile joins;
        its outcome comes back in ``_landed`` (no task hop either way)."""
        if self._inflight is not None or self._failing or not self._pending \
                or self._stopped.is_set():
            return
        op = Op(self._commit_in, prepare=self._take, on_done=self._landed)
        self._inflight = op
        try:
            queued = self.store.submit(op)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._inflight = None
            return
        if not queued:   # the writer's queue is full: the flusher waits for room
            self._unsent = op
            self._wake.set()

    def _take(self) -> None:
        self._batch, self._pending = self._pending, []

    def _commit_in(self, conn: Any, out: Any, *state: Any) -> None:
        self._apply(conn, [record for _, record in self._batch])

    def _landed(self, op: Op) -> None:
        batch, self._batch = self._batch, []
        self._inflight = None
        if op.error is not None:
            self._failed_batch(batch, op.error)   # type: ignore[arg-type]
            self._failing = True   # the flusher backs off, then commits again
            self._wake.set()
            return
        self._backoff.reset()
        if batch:
            self.commits += 1
            self._durable_through = batch[-1][0]
            self._on_events([r for _, r in batch if isinstance(r, EventRecord)])
            self._signal()
            if self._write_behind is not None:
                self._behind_landed(self._write_behind, batch)
        if self._closing and not self._pending:
            self._wake.set()   # the last commit landed: the flusher ends
        else:
            self._kick()

    def _behind_landed(self, wb: WriteBehind, batch: list[tuple[int, _Record]]) -> None:
        touched: set[str] = set()
        for _, record in batch:
            if isinstance(record, EventRecord):
                wb.committed(record.session_id, record.event_id)
            elif isinstance(record, Marker):
                wb.marker_landed(record)
            elif not isinstance(record, PromptSettled):
                continue
            touched.add(record.session_id)
        for marker in wb.quiet(touched):
            self._push(marker)

    async def _flusher(self) -> None:
        """What ``_kick``/``_landed`` cannot do without waiting: a full writer queue,
        the backoff after a failed commit, and the end (``aclose``)."""
        try:
            while True:
                await self._wake.wait()
                self._wake = anyio.Event()
                if self._unsent is not None:
                    op, self._unsent = self._unsent, None
                    try:
                        await self.store.send(op)
                    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                        return
                if self._failing:
                    if self._closing:
                        return
                    with anyio.move_on_after(self._backoff.next()):
                        while not any(isinstance(r, CRITICAL) for _, r in self._pending):
                            await self._wake.wait()
                            self._wake = anyio.Event()
                    self._failing = False
                    self._kick()
                if self._closing and self._inflight is None and not self._pending:
                    return
        finally:
            self._closing = True
            self._stopped.set()
            self._signal()

    def _signal(self) -> None:
        self._flushed.set()
        self._flushed = anyio.Event()

    def _failed_batch(self, batch: list[tuple[int, _Record]], exc: Exception) -> None:
        reason = exc.reason if isinstance(exc, StoreUnavailableError) else str(exc)
        log.warning("session journal: a commit failed (%s); retrying", reason)
        keep = []
        for seq, record in batch:
            if isinstance(record, CRITICAL):
                self._failed[seq] = reason
            else:
                keep.append((seq, record))
        if len(self._failed) > 65536:   # nobody waits for the oldest any more
            for seq in sorted(self._failed)[:32768]:
                del self._failed[seq]
        self._pending[:0] = keep
        self._signal()

    def _shed(self) -> None:
        """Too much waits for a store that does not commit: the oldest events go to
        readers unjournaled (the next start gives their session a new epoch)."""
        shed = [r for _, r in self._pending[: MAX_PENDING // 2] if isinstance(r, EventRecord)]
        self._pending = ([x for x in self._pending[: MAX_PENDING // 2]
                          if not isinstance(x[1], EventRecord)]
                         + self._pending[MAX_PENDING // 2:])
        log.error("session journal: %d events let through unjournaled (the store does not "
                  "commit)", len(shed))
        self._on_events(shed)

    # -- SQL (a worker thread, inside the writer's transaction) --------------------------
    def _sql(self, text: str) -> str:
        return text.replace("?", "%s") if self.postgres else text

    def _apply(self, conn: Any, records: list[_Record]) -> None:
        """The records in order, in as few statements as it takes: each statement gives
        up the GIL and must win it back from a busy event loop (see ``store.writer``),
        so the events, accepted prompts and terminals between two session records
        (``SessionOpened``, ``SessionEnded``: they order everything around them) go in
        one multi-row statement each, in that order (a terminal after its prompt)."""
        events: list[tuple[str, int, str, str | None, bytes]] = []
        accepted: list[tuple[str, str, int, bytes]] = []
        settled: list[PromptSettled] = []
        trim: dict[str, int] = {}
        heavy: set[str] = set()

        def flush() -> None:
            if events:
                self._insert_rows(conn, EVENT_INSERT, events)
                events.clear()
            if accepted:
                self._insert_rows(conn, PROMPT_INSERT, accepted)
                accepted.clear()
            if settled:
                self._settle_rows(conn, settled)
                settled.clear()

        for record in records:
            if isinstance(record, EventRecord):
                events.append((record.session_id, record.event_id, record.type,
                               record.prompt_id, record.envelope))
                if record.event_id % COMPACT_EVERY == 0 and record.event_id > self.ring_size:
                    trim[record.session_id] = record.event_id - self.ring_size
                if self._count_bytes(record):
                    heavy.add(record.session_id)
            elif isinstance(record, PromptAccepted):
                accepted.append((record.session_id, record.prompt_id, record.seq,
                                 _encode(record)))
            elif isinstance(record, PromptSettled):
                settled.append(record)
            elif isinstance(record, Marker):
                flush()
                if record.on:
                    conn.execute(self._sql(EVENT_INSERT[0].format("(?,?,?,NULL,?)")),
                                 (record.session_id, MARKER_ID, MARKER_TYPE, b""))
                else:
                    conn.execute(self._sql("DELETE FROM session_events WHERE session_id = ? "
                                           "AND id = ?"), (record.session_id, MARKER_ID))
            else:
                flush()
                self._apply_one(conn, record)
        flush()
        for sid, through in trim.items():
            conn.execute(self._sql("DELETE FROM session_events WHERE session_id = ? AND id > ? "
                                   "AND id <= ?"), (sid, MARKER_ID, through))
        for sid in heavy:
            self._trim_bytes(conn, sid)

    def _count_bytes(self, record: EventRecord) -> bool:
        """Count an event's envelope; ``True`` when its session is due a byte trim."""
        sid = record.session_id
        total = self._unsized.get(sid, 0) + len(record.envelope)
        if total >= self.max_session_bytes // 4:
            self._unsized.pop(sid, None)
            return True
        self._unsized[sid] = total
        return False

    def _trim_bytes(self, conn: Any, sid: str) -> None:
        """Delete the session's oldest events until the rest take at most
        ``max_session_bytes`` (its newest event always stays)."""
        sizes = conn.execute(self._sql(
            "SELECT id, LENGTH(envelope) FROM session_events WHERE session_id = ? AND id > ? "
            "ORDER BY id DESC"), (sid, MARKER_ID)).fetchall()
        total = 0
        for n, (event_id, size) in enumerate(sizes):
            total += int(size)
            if total > self.max_session_bytes and n > 0:
                conn.execute(self._sql(
                    "DELETE FROM session_events WHERE session_id = ? AND id > ? AND id <= ?"),
                    (sid, MARKER_ID, event_id))
                return

    def _insert_rows(self, conn: Any, head: tuple[str, int], rows: list[tuple[Any, ...]]
                     ) -> None:
        """``INSERT ... VALUES (..),(..) ON CONFLICT DO NOTHING``, ``ROWS_PER_STATEMENT``
        rows a statement."""
        sql, width = head
        one = "(" + ",".join("?" * width) + ")"
        for start in range(0, len(rows), ROWS_PER_STATEMENT):
            chunk = rows[start:start + ROWS_PER_STATEMENT]
            conn.execute(self._sql(sql.format(",".join([one] * len(chunk)))),
                         [value for row in chunk for value in row])

    def _settle_rows(self, conn: Any, records: list[PromptSettled]) -> None:
        sql = self._sql
        for start in range(0, len(records), ROWS_PER_STATEMENT):
            chunk = records[start:start + ROWS_PER_STATEMENT]
            params: list[Any] = []
            for record in chunk:
                params += (record.session_id, record.prompt_id, _encode(record), record.at)
            conn.execute(sql(SETTLE_UPDATE.format(",".join(["(?,?,?,?)"] * len(chunk)))),
                         params)
        for record in records:
            if hash(record.prompt_id) % 32 == 0:   # now and then: the newest terminals only
                conn.execute(sql(
                    "DELETE FROM session_prompts WHERE session_id = ? AND terminal IS NOT NULL "
                    "AND seq < (SELECT seq FROM session_prompts WHERE session_id = ? AND "
                    "terminal IS NOT NULL ORDER BY seq DESC LIMIT 1 OFFSET ?)"),
                    (record.session_id, record.session_id, MAX_PROMPT_TERMINALS - 1))

    def _apply_one(self, conn: Any, record: JournalRecord) -> None:
        sql = self._sql
        if isinstance(record, SessionOpened):
            conn.execute(sql(
                "INSERT INTO sessions(id, created_at, record, owner) VALUES (?,?,?,?) "
                "ON CONFLICT (id) DO UPDATE SET record = excluded.record, closed_at = NULL, "
                "owner = excluded.owner"),
                (record.session_id, record.created_at, _encode(record),
                 self.owner))
        elif isinstance(record, SessionEnded):
            self._unsized.pop(record.session_id, None)
            if record.deleted:
                for table, column in (("session_events", "session_id"),
                                      ("session_prompts", "session_id"), ("sessions", "id")):
                    conn.execute(sql(f"DELETE FROM {table} WHERE {column} = ?"),
                                 (record.session_id,))
            else:
                conn.execute(sql("UPDATE sessions SET closed_at = ? WHERE id = ?"),
                             (record.at, record.session_id))

    # -- restore and purge ---------------------------------------------------------------
    async def restore(self) -> list[RestoredSession]:
        return await self.store._read(self._restore_in)

    def _restore_in(self, conn: Any) -> list[RestoredSession]:
        sql = self._sql
        found: list[RestoredSession] = []
        for sid, blob, closed_at in conn.execute(sql(
                "SELECT id, record, closed_at FROM sessions WHERE owner IS NULL OR owner = ? "
                "ORDER BY created_at"), (self.owner,)).fetchall():
            try:
                record = _OPENED.decode(bytes(blob))
            except msgspec.MsgspecError as exc:
                log.error("session journal: session %s has an unreadable record (%s): skipped",
                          sid, exc)
                continue
            terminals: list[PromptTerminal] = []
            unsettled: list[PromptAccepted] = []
            for pid, prompt_blob, terminal_blob in conn.execute(sql(
                    "SELECT prompt_id, record, terminal FROM session_prompts "
                    "WHERE session_id = ? ORDER BY seq"), (sid,)).fetchall():
                try:
                    if terminal_blob is not None:
                        t = _SETTLED.decode(bytes(terminal_blob))
                        terminals.append(PromptTerminal(prompt_id=t.prompt_id,
                                                        terminal=t.terminal, at=t.at,
                                                        stop_reason=t.stop_reason,
                                                        error_code=t.error_code))
                    else:
                        unsettled.append(_decode_accepted(bytes(prompt_blob)))
                except msgspec.MsgspecError as exc:
                    log.error("session journal: prompt %s of session %s is unreadable (%s): "
                              "skipped", pid, sid, exc)
            terminals.sort(key=lambda t: t.at)
            rows = conn.execute(sql(
                "SELECT id, envelope FROM session_events WHERE session_id = ? AND id > ? "
                "ORDER BY id DESC LIMIT ?"), (sid, MARKER_ID, self.ring_size)).fetchall()
            rows.reverse()
            events = []
            # readers may have seen events ahead of the journal (write-behind): resync
            gap = conn.execute(sql("SELECT 1 FROM session_events WHERE session_id = ? AND "
                                   "id = ?"), (sid, MARKER_ID)).fetchone() is not None
            for event_id, envelope in rows:
                try:
                    event = event_from_envelope(bytes(envelope))
                except (msgspec.MsgspecError, KeyError, TypeError) as exc:
                    log.error("session journal: event %s of session %s is unreadable (%s): "
                              "skipped", event_id, sid, exc)
                    gap = True
                    continue
                if events and event.id != events[-1].id + 1:
                    gap = True
                events.append(event)
            last = rows[-1][0] if rows else 0
            started: set[str] = set()
            if unsettled:
                ids = {p.prompt_id for p in unsettled}
                for (pid,) in conn.execute(sql(
                        "SELECT DISTINCT prompt_id FROM session_events WHERE session_id = ? "
                        "AND prompt_id IS NOT NULL AND type <> 'pending_prompt_added'"),
                        (sid,)).fetchall():
                    if pid in ids:
                        started.add(pid)
            if gap:
                log.warning("session journal: session %s lost events: a new epoch", sid)
            found.append(RestoredSession(
                record=record, events=events, last_event_id=last,
                terminals=terminals[-MAX_PROMPT_TERMINALS:], unsettled=unsettled,
                started=started, closed_at=closed_at, gap=gap))
        return found

    async def purge(self, closed_before: float) -> int:
        """Remove the sessions closed before ``closed_before`` (epoch seconds)."""
        def op(conn: Any, out: Any, *state: Any) -> int:
            sql = self._sql
            ids = [row[0] for row in conn.execute(sql(
                "SELECT id FROM sessions WHERE closed_at IS NOT NULL AND closed_at < ?"),
                (closed_before,)).fetchall()]
            for sid in ids:
                for table, column in (("session_events", "session_id"),
                                      ("session_prompts", "session_id"), ("sessions", "id")):
                    conn.execute(sql(f"DELETE FROM {table} WHERE {column} = ?"), (sid,))
            return len(ids)

        try:
            return await self.store._write(op)
        except StoreUnavailableError as exc:
            raise JournalUnavailableError(exc.reason) from exc

