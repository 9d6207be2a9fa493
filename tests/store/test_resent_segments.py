"""A commit that landed but whose answer was lost (a PostgreSQL connection dropped after
COMMIT: the outcome unknown) is sent again with the records that follow it: its
events then come in a longer segment holding the same first ids. The stored one it
covers is replaced, not kept beside it: no two segments of a session hold one id, and
the session's size (what the byte bound counts) counts each event once. On SQLite the
outcome is always known, but a retry that replaces nothing does no harm: the same
test runs on both stores (``store_name``), the fault staged by ``faults``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from acp_server.store.sessions import StoreSessionJournal
from tests.store.faults import faulty
from tests.store.test_journal_bytes import _event
from tests.store.test_journal_trims import _opened

pytestmark = pytest.mark.anyio


async def _segments(store: Any, store_name: str, sid: str) -> list[tuple[int, int, int]]:
    """Its stored segments' (first id, last id, size), in order, read through the store."""
    mark = "%s" if store_name == "postgres" else "?"
    rows = await store._read(lambda conn: conn.execute(
        f"SELECT first_id, last_id, size FROM session_segments WHERE session_id = {mark} "
        "AND last_id > 0 ORDER BY last_id", (sid,)).fetchall())
    return [(int(first), int(last), int(size)) for first, last, size in rows]


async def test_a_commit_sent_again_replaces_the_segment_it_covers(tmp_path: Path,
                                                                  store_name: str) -> None:
    store = faulty(tmp_path)
    async with store, StoreSessionJournal(store) as journal:
        journal.append(_opened("s"))
        events = [_event("s", n, 30) for n in range(1, 13)]
        for record in events[:5]:
            journal.append(record)
        await journal.wait(journal.appended)
        store.faults.land_then_fail()
        for record in events[5:10]:   # committed, its answer lost: sent again
            journal.append(record)
        with anyio.fail_after(30):
            while store.faults.refused_writes < 2:   # and its first retry failed too
                await anyio.sleep(0.01)
        for record in events[10:]:    # the retry after the outage carries these too
            journal.append(record)
        store.faults.off()
        with anyio.fail_after(30):
            await journal.wait(journal.appended)
        segments = await _segments(store, store_name, "s")
        read = await journal.read_after("s", 0, 100)
    assert [e[0] for e in read[2]] == list(range(1, 13))   # each event once, in order
    held = [n for first, last, _ in segments for n in range(first, last + 1)]
    assert sorted(held) == list(range(1, 13)), segments   # no id in two segments
    assert sum(size for _, _, size in segments) == sum(len(e.envelope) for e in events)
