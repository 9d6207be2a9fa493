"""Review of segment rows (``acp_server.store.segments``): what the conversion from one
row an event must keep, on SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest

from acp_server.fleet.replica import QUESTIONS, SessionView
from acp_server.store.sessions import StoreSessionJournal
from tests.store.test_journal_isolation import _store
from tests.store.test_open_reads import _Book

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("pid", ["a\\b", "a\\", "a\\%", "a_b", "a,b"])
async def test_a_prompt_id_with_like_s_characters_is_found_in_the_segments(
        tmp_path: Path, store_name: str, pid: str) -> None:
    """/acp's prompt ids are any 1 to 128 characters: a backslash is LIKE's escape on
    PostgreSQL, so a filter ``prompts LIKE '%,' || prompt_id || ',%'`` missed the events
    of ``a\\b`` (the listing then said its ended turn was still running)."""
    store, _ = _store(tmp_path, store_name)
    async with store:
        async with StoreSessionJournal(store) as journal:
            book = _Book(journal, "s", 1.0)
            book.accept(pid, 1)
            book.started(pid)
            book.completed(pid, settle=False)   # its end only in its events
            await journal.wait(journal.appended)   # its events a segment of their own
            book.accept("next", 2)
            book.started("next")
            await journal.wait(journal.appended)
            [bulk] = await journal.read_open(QUESTIONS)
            alone = await journal.read("s", only=QUESTIONS)
            assert alone is not None
            assert SessionView(alone, 5).status().active_prompt_id == "next"
            assert SessionView(bulk, 5).status() == SessionView(alone, 5).status()
            assert [p.prompt_id for p in bulk.unsettled] == ["next"]
