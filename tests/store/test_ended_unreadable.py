"""A closed session whose record cannot be decoded is logged and skipped by
``SessionJournal.ended`` (``acp_server.store.session_reads``), and a page with one still
holds ``limit`` readable ones when there are that many: the listing
(``acp_server.http.ended_cursor.ended_page``) takes a short page for the end of the
list, so a skipped row must never make one (the sessions past it vanished from
``GET /workspace/{id}/ended-sessions``). Both stores, both backends."""

from __future__ import annotations

from pathlib import Path

import pytest

from acp_server.http.ended_cursor import ended_page
from acp_server.store.sessions import StoreSessionJournal
from bridge.journal import SessionEnded, SessionOpened
from tests.store.test_journal_isolation import _store
from tests.store.test_journal_refusals import _run_sql

pytestmark = pytest.mark.anyio


async def test_an_unreadable_ended_session_hides_none_after_it(tmp_path: Path,
                                                               store_name: str) -> None:
    store, url = _store(tmp_path, store_name)
    async with store:
        async with StoreSessionJournal(store) as journal:
            for n in range(1, 6):
                sid = f"s{n}"
                journal.append(SessionOpened(session_id=sid, agent="a", cwd="/",
                                             created_at=float(n), epoch="e"))
                journal.append(SessionEnded(session_id=sid, at=100.0 + n))
            await journal.wait(journal.appended)
            blob = "'\\xc1'::bytea" if store_name == "postgres" else "X'C1'"
            _run_sql(tmp_path, store_name, url,
                     f"UPDATE sessions SET record = {blob} WHERE id = 's4'")
            first = await journal.ended(before=None, limit=2)
            assert [e.record.session_id for e in first] == ["s5", "s3"]
            rest = await journal.ended(before=first[-1].key(), limit=2)
            assert [e.record.session_id for e in rest] == ["s2", "s1"]
            page, more = await ended_page(journal, lambda e: True, 10, None)
            assert [e.record.session_id for e in page] == ["s5", "s3", "s2", "s1"]
            assert more is None
