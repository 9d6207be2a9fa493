"""``acp_server.http.ended_cursor`` apart from HTTP: how a page is read from the journal
and its cursor (the REST route over real HTTP, on both stores:
``tests/store/test_ended_sessions``; ``/acp``'s: ``tests/acp_http/test_listing``)."""

from __future__ import annotations

import pytest

from acp_server.http import ended_cursor as ended
from bridge.journal import EndedSession, SessionOpened

pytestmark = pytest.mark.anyio


class _Rows:
    """A journal of ``count`` closed sessions, one in ``mine_every`` the caller's."""

    def __init__(self, count: int, mine_every: int) -> None:
        self.rows = [EndedSession(record=SessionOpened(
            session_id=f"s{n:05d}", agent="a", cwd="/w", created_at=0.0, epoch="e",
            owner="me" if n % mine_every == 0 else "other"), ended_at=float(n // 2))
            for n in range(count)]
        self.rows.sort(key=EndedSession.key, reverse=True)

    async def ended(self, *, before: tuple[float, str] | None, limit: int
                    ) -> list[EndedSession]:
        after = [r for r in self.rows if before is None or r.key() < before]
        return after[:limit]


async def test_a_walk_of_a_long_journal_sees_each_of_its_sessions_once() -> None:
    """Past ``MAX_SCAN`` rows a page ends early with a cursor; the walk still lists
    every session the caller sees, once, in order (ties of ``endedAt`` by id)."""
    journal = _Rows(3 * ended.MAX_SCAN, mine_every=500)
    mine = [r.record.session_id for r in journal.rows if r.record.owner == "me"]
    seen: list[str] = []
    after, short_with_more = None, 0
    while True:
        page, after = await ended.ended_page(journal, lambda r: r.record.owner == "me",  # type: ignore[arg-type]
                                             10, after)
        seen += [r.record.session_id for r in page]
        if after is None:
            break
        short_with_more += len(page) < 10
        assert ended.decode(ended.encode(after)) == after
        assert after[1] in mine or after[1] == "", after   # never another's session
    assert seen == mine and len(mine) == 12
    # the first two scans stopped at MAX_SCAN rows (and the rest of that instant's),
    # with a cursor naming an instant; the third read on to the journal's very end
    assert short_with_more == 2


async def test_a_full_page_has_a_cursor_only_when_one_more_follows() -> None:
    journal = _Rows(20, mine_every=1)
    page, after = await ended.ended_page(journal, lambda r: True, 20, None)
    assert len(page) == 20 and after is None
    page, after = await ended.ended_page(journal, lambda r: True, 19, None)
    assert len(page) == 19 and after == page[-1].key()
    rest, after = await ended.ended_page(journal, lambda r: True, 19, after)
    assert [r.key() for r in rest] == [journal.rows[-1].key()] and after is None


@pytest.mark.parametrize("sid", ["s", "3c0f8a4e-0000-4000-8000-000000000000", "é" * 512,
                                 "\x01\n\"\\", "x" * 1024])
def test_a_cursor_names_its_position_and_fits_a_request_line(sid: str) -> None:
    cursor = ended.encode((1764900000.123456, sid))
    assert ended.decode(cursor) == (1764900000.123456, sid)
    assert len(cursor) <= ended.MAX_CURSOR_CHARS < 2048
