"""What a commit of the session journal trims, and the counts that decide it
(``acp_server.store.sessions.StoreSessionJournal`` inherits them).

    plan = journal._planned(batch)    # as a commit starts (``_take``), in the event loop
    found = await journal.restore()   # the restore, its byte counts seeded

Contracts: see ``acp_server.store.sessions``. A session's byte count (``_unsized``:
its envelopes journaled since its last byte trim) lives in memory; at restore it is
seeded from the store, so the bound holds across restarts (a clean stop or ``kill -9``
alike): a live session's events on disk past ``max_session_bytes`` count towards its
next byte trim. Between two trims a session's events take at most
``max_session_bytes`` plus its count, so that seed is the least that keeps the bound
(a session under the bound starts from none, and is not trimmed at once). One
statement per store (``seed_bytes_in``): on SQLite the live sessions' sums, on
PostgreSQL those of the sessions restored (``= ANY``: never the whole fleet's); the
lengths are the segment rows' ``size`` column (their envelopes' bytes, written with
them: ``acp_server.store.segments``; no envelope is read), and only the sessions past
the bound come back. An adopted session (``adopt``) is seeded the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from acp_server.store.session_writes import CommitPlan, Record
from acp_server.store.write_behind import MARKER_ID
from bridge.journal import (
    EventRecord,
    EventsReset,
    PromptSettled,
    RestoredSession,
    SessionEnded,
    SessionOpened,
)

log = logging.getLogger("acp_server.store.sessions")

TRIM_TERMINALS_EVERY = 64   # settled prompts per session between two trims of terminals
MAX_SESSION_BYTES = 64 * 1024 * 1024   # event envelopes kept per session (see trim_bytes)

_OVER = (f"AND e.last_id > {MARKER_ID} GROUP BY e.session_id "
         "HAVING SUM(e.size) > ?")
# SQLite: one instance per store, every live session is restored (a join, not a list
# of ids: no limit on their number)
SQLITE_SIZES = ("SELECT e.session_id, SUM(e.size) FROM session_segments e "
                "JOIN sessions s ON s.id = e.session_id WHERE s.closed_at IS NULL " + _OVER)
POSTGRES_SIZES = ("SELECT e.session_id, SUM(e.size) FROM session_segments e "
                  "WHERE e.session_id = ANY(?) " + _OVER)


def seed_bytes_in(conn: Any, postgres: bool, session_ids: Sequence[str], bound: int
                  ) -> dict[str, int]:
    """Each of ``session_ids`` whose events take more than ``bound`` bytes: how many
    more (one statement)."""
    if postgres:
        rows = conn.execute(POSTGRES_SIZES.replace("?", "%s"),
                            (list(session_ids), bound)).fetchall()
    else:
        rows = conn.execute(SQLITE_SIZES, (bound,)).fetchall()
    wanted = set(session_ids)
    return {sid: int(total) - bound for sid, total in rows if sid in wanted}


class SessionTrims:
    """The plans and counts of ``StoreSessionJournal`` (its attributes, set there)."""

    store: Any
    postgres: bool
    max_session_bytes: int
    _unsized: dict[str, int]
    _untrimmed: dict[str, int]

    async def restore(self) -> list[RestoredSession]:
        found: list[RestoredSession] = await super().restore()  # type: ignore[misc]
        await self._seed_unsized([s.record.session_id for s in found if s.closed_at is None])
        return found

    async def _seed_unsized(self, session_ids: list[str]) -> None:
        """Seed the byte counts of ``session_ids`` (live, restored or adopted here)
        from what the store holds of their events (the module docstring). A store that
        cannot answer is logged: they count from none, as before the seed."""
        if not session_ids:
            return
        bound, postgres = self.max_session_bytes, self.postgres
        try:
            over = await self.store._read(
                lambda conn: seed_bytes_in(conn, postgres, session_ids, bound))
        except Exception as exc:   # noqa: BLE001 - the restore itself was read
            log.warning("session journal: the sessions' sizes could not be read (%s); "
                        "they count from none", exc)
            return
        unsized = self._unsized
        for sid, size in over.items():
            unsized[sid] = unsized.get(sid, 0) + size

    def _planned(self, batch: list[tuple[int, Record]]) -> CommitPlan:
        """What the commit of ``batch`` trims and how it changes the counts, in one pass
        (event loop, as the commit starts; applied only when it lands, ``_landed``: a
        transaction run twice — a batch rolled back, then run with savepoints — or
        retried counts nothing twice and never loses a trim):

        * the sessions whose old terminals it deletes (they reach
          ``TRIM_TERMINALS_EVERY`` settled prompts past the kept number) and each
          touched session's settle count once landed (``None``: ended);
        * the sessions it byte-trims (their envelopes since their last byte trim reach
          a quarter of ``max_session_bytes``) and each one's byte count once landed
          (``None``: ended, or trimmed now);
        * each bus's newest event in it (what readers may see once it lands)."""
        plan = CommitPlan()
        due, counts, grown, newest = plan.trims, plan.untrimmed, plan.unsized, plan.newest
        untrimmed = self._untrimmed
        reopened: set[str] = set()
        reset: set[str] = set()   # its events deleted: the next one counts from none
        for _, record in batch:
            kind = type(record)
            if kind is EventRecord:
                sid = record.session_id
                newest[sid, record.epoch] = record   # type: ignore[assignment,union-attr]
                size = grown.get(sid, 0)
                if size is None and sid in reset:
                    size = 0
                    reset.discard(sid)
                    reopened.add(sid)
                if size is not None:
                    grown[sid] = size + len(record.envelope)   # type: ignore[union-attr]
            elif kind is PromptSettled:
                sid = record.session_id
                count = (counts.get(sid, untrimmed.get(sid, 0)) or 0) + 1
                if count >= TRIM_TERMINALS_EVERY:
                    due.add(sid)
                    count = 0
                counts[sid] = count
            elif kind is SessionEnded:
                counts[record.session_id] = grown[record.session_id] = None
            elif kind is EventsReset:   # its events so far are gone (none: forgotten)
                grown[record.session_id] = None
                reset.add(record.session_id)
            elif kind is SessionOpened and grown.get(record.session_id, 0) is None:
                # ended earlier in this batch, open again: its later events count
                # from nothing, as they would in a commit of their own
                grown[record.session_id] = 0
                reopened.add(record.session_id)
        quarter = self.max_session_bytes // 4
        for sid, size in grown.items():
            if size is not None:
                total = (0 if sid in reopened else self._unsized.get(sid, 0)) + size
                if total >= quarter:
                    plan.byte_trims.add(sid)
                    grown[sid] = None
                else:
                    grown[sid] = total
        return plan
