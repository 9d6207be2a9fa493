"""The ``--session-write-behind N`` half of the crash-consistency test
(``test_crash_consistency.py``): what a reader may see after ``kill -9`` in that mode,
exactly as docs/operations.md "What survives a restart" says::

    await pin_markers(model, store)         # before the kill: each session's marker known
    ...                                     # kill, restart, readers reconnect, full reads
    check_window_readers(model, session, full, window)

Contracts: before the kill (and before the request in flight) every live session is
brought to a state the docs decide: a session with no prompt running is *quiet* (its
marker cleared: waited for in the store, as ``test_write_behind.py`` does), so it keeps
its epoch and its readers resume exactly; a session with a prompt running has its
marker set (waited for) and every event its readers saw committed (the store's newest
event id reached the primary reader's), so it gets a new epoch and its readers get
``state_resync_required`` (``epoch_reset``) and the ring, the events they saw all in
it. The session the request in flight was about may go either way (that request may
set its marker); if it resyncs, what its readers saw before the resync and the new
ring agree up to a point, and what they saw past it (never made durable) is at most
``N`` events. ``Session.marker``: True (resync), False (exact) or None (either).
"""

from __future__ import annotations

import sqlite3
from typing import Any

import anyio
import anyio.to_thread

from acp_server.store.write_behind import MARKER_ID
from tests.store.crash_workload import WAIT_S, Model, Session
from tests.store.test_write_behind import _until_marker


def _newest_committed(store: str, sid: str) -> int:
    query = ("SELECT max(last_id) FROM session_segments WHERE session_id = {p} "
             "AND last_id > {p}")
    if store.startswith("postgresql"):
        import psycopg

        with psycopg.connect(store) as conn:
            row = conn.execute(query.format(p="%s"), (sid, MARKER_ID)).fetchone()
    else:
        with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as conn:
            row = conn.execute(query.format(p="?"), (sid, MARKER_ID)).fetchone()
    return int(row[0] or 0) if row is not None else 0


async def pin_markers(model: Model, store: str) -> None:
    """Each live session quiet (marker cleared) or busy (marker set, all it showed
    committed); ``Session.marker`` says which."""
    for session in model.live():
        busy = session.head() is not None
        await _until_marker(store, session.session_id, present=busy)
        if busy:
            seen = model.primary(session.session_id).last_id()
            with anyio.fail_after(WAIT_S):
                while await anyio.to_thread.run_sync(
                        _newest_committed, store, session.session_id) < seen:
                    await anyio.sleep(0.02)   # polled: the store has no notice for it
        session.marker = busy


def resynced(session: Session, loaded: dict[str, Any]) -> bool:
    """Whether the session came back under a new epoch, checked against its marker."""
    changed = loaded["eventEpoch"] != session.epoch
    if session.marker is not None:
        assert changed == session.marker, (
            f"{session.session_id}: marker {'set' if session.marker else 'cleared'} at the "
            f"kill, epoch {'changed' if changed else 'kept'}")
    return changed


def last_after_resync(seen: list[dict[str, Any]]) -> int:
    """The newest event id a reader got after its resync (0 before one)."""
    marks = [i for i, e in enumerate(seen) if e["type"] == "state_resync_required"]
    ids = [e["id"] for e in seen[marks[-1]:] if e.get("id") is not None] if marks else []
    return ids[-1] if ids else 0


def check_window_readers(model: Model, session: Session, full: list[dict[str, Any]],
                         window: int, new_epoch: str) -> None:
    """A resynced session's readers: the events before the kill, one
    ``state_resync_required`` (``epoch_reset``), then exactly the fresh full read."""
    ring = [e for e in full if e.get("id") is not None]
    for reader in model.readers:
        if reader.session_id != session.session_id:
            continue
        marks = [i for i, e in enumerate(reader.seen) if e["type"] == "state_resync_required"]
        assert len(marks) == 1, f"{reader.name}: resyncs at {marks}"
        assert reader.seen[marks[0]]["data"]["reason"] == "epoch_reset", reader.seen[marks[0]]
        assert reader.epochs[-1] == new_epoch and set(reader.epochs[:-1]) == {session.epoch}, (
            f"{reader.name}: epochs {reader.epochs}")
        before = [e for e in reader.seen[:marks[0]] if e.get("id") is not None]
        after = [e for e in reader.seen[marks[0]:] if e.get("id") is not None]
        assert after == ring, f"{reader.name}: after the resync {after} != the ring {ring}"
        kept = 0
        while kept < min(len(before), len(ring)) and before[kept] == ring[kept]:
            kept += 1
        lost = before[kept:]
        allowed = 0 if session.marker else window
        assert len(lost) <= allowed, (
            f"{reader.name}: {len(lost)} events seen and not in the ring (at most "
            f"{allowed}): {lost}")
