"""What a SQLite commit waits for (``acp_server.store.sqlite``): a batch of only the
session journal's operations commits with ``synchronous=NORMAL`` (written to the WAL,
survives ``kill -9``: the restart tests prove that), a batch with a task, token or audit
write with ``synchronous=FULL`` (fsynced), and ``fsync=True`` makes the journal's own
commits FULL too. Read inside the transaction, from the writer's connection. And the
settled prompts a session keeps on disk stay bounded (trimmed every
``TRIM_TERMINALS_EVERY`` settles)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from acp_server.store.sessions import TRIM_TERMINALS_EVERY, StoreSessionJournal
from acp_server.store.sqlite import SqliteTaskStore
from acp_server.store.writer import Op
from bridge.journal import PromptAccepted, PromptSettled, SessionOpened
from bridge.status import MAX_PROMPT_TERMINALS
from tests.harness import local_server
from tests.store.faults import faulty

pytestmark = pytest.mark.anyio
NORMAL, FULL = 1, 2   # what ``PRAGMA synchronous`` reads


def _synchronous(conn: Any, *_: Any) -> int:
    return int(conn.execute("PRAGMA synchronous").fetchone()[0])


class _Seen(StoreSessionJournal):
    """The journal, noting the setting each of its commits ran under."""

    seen: list[int]

    def _commit_in(self, conn: Any, out: Any, *state: Any) -> Any:
        self.seen.append(_synchronous(conn))
        return super()._commit_in(conn, out, *state)


async def _journal_commit(store: SqliteTaskStore, fsync: bool) -> list[int]:
    async with _Seen(store, fsync=fsync) as journal:
        journal.seen = []
        seq = journal.append(SessionOpened(session_id="s1", agent="reference", cwd="/ws",
                                           created_at=1.0, epoch="e1"))
        await journal.wait(seq)
        return journal.seen


async def test_the_journal_commits_without_fsync_unless_asked(tmp_path: Path) -> None:
    async with SqliteTaskStore(str(tmp_path / "store.db")) as store:
        assert await store._write(_synchronous) == FULL   # a task store write
        assert await _journal_commit(store, fsync=False) == [NORMAL]
        assert await store._write(_synchronous) == FULL   # switched back
        assert await _journal_commit(store, fsync=True) == [FULL]


async def test_one_durable_operation_makes_its_batch_durable(tmp_path: Path) -> None:
    async with SqliteTaskStore(str(tmp_path / "store.db")) as store:
        relaxed = Op(_synchronous, durable=False)
        durable = Op(_synchronous)
        assert store.submit(relaxed) and store.submit(durable)   # queued together
        await relaxed.done.wait()
        await durable.done.wait()
        assert (relaxed.result, durable.result) == (FULL, FULL)
        alone = Op(_synchronous, durable=False)
        assert store.submit(alone)
        await alone.done.wait()
        assert alone.result == NORMAL
        assert await store._write(_synchronous) == FULL


async def test_the_flag_reaches_the_journal(tmp_path: Path) -> None:
    """``--session-journal-fsync`` (``Settings.session_journal_fsync``): a session
    created through the server is committed with ``synchronous=FULL``."""
    for fsync, expected in ((False, NORMAL), (True, FULL)):
        folder = tmp_path / str(fsync)
        folder.mkdir()
        async with local_server(folder, session_journal_fsync=fsync) as srv:
            journal = srv.bridge.journal
            assert isinstance(journal, StoreSessionJournal) and journal.fsync is fsync
            seen: list[int] = []
            commit_in = journal._commit_in

            def noted(conn: Any, out: Any, *state: Any) -> Any:
                seen.append(_synchronous(conn))
                return commit_in(conn, out, *state)

            journal._commit_in = noted   # type: ignore[method-assign]
            created = await srv.client.post("/session", json={"sessionScope": "thread"})
            assert created.status_code == 200
            assert seen and set(seen) == {expected}


async def test_settled_prompts_kept_are_bounded(tmp_path: Path) -> None:
    """A session keeps its newest ``MAX_PROMPT_TERMINALS`` settled prompts: the older
    are deleted every ``TRIM_TERMINALS_EVERY`` settles (no more than that many extra on
    disk), and a restore reads the newest ones, in order."""
    total = MAX_PROMPT_TERMINALS + 3 * TRIM_TERMINALS_EVERY + 5
    async with SqliteTaskStore(str(tmp_path / "store.db")) as store:
        async with StoreSessionJournal(store) as journal:
            journal.append(SessionOpened(session_id="s1", agent="reference", cwd="/ws",
                                         created_at=1.0, epoch="e1"))
            seq = 0
            for n in range(total):
                pid = f"p{n:04d}"
                journal.append(PromptAccepted(session_id="s1", prompt_id=pid, prompt=[],
                                              queued_at_ms=n, seq=n))
                seq = journal.append(PromptSettled(session_id="s1", prompt_id=pid,
                                                   terminal="completed", at=n))
            await journal.wait(seq)
            kept = await store._read(lambda conn: conn.execute(
                "SELECT COUNT(*) FROM session_prompts WHERE terminal IS NOT NULL").fetchone()[0])
            assert MAX_PROMPT_TERMINALS <= kept < MAX_PROMPT_TERMINALS + TRIM_TERMINALS_EVERY
            [restored] = await journal.restore()
    assert [t.prompt_id for t in restored.terminals] == \
        [f"p{n:04d}" for n in range(total - MAX_PROMPT_TERMINALS, total)]


def _accept(pid: str, seq: int) -> PromptAccepted:
    return PromptAccepted(session_id="s1", prompt_id=pid, prompt=[], queued_at_ms=seq, seq=seq)


def _settle(pid: str, at: int) -> PromptSettled:
    return PromptSettled(session_id="s1", prompt_id=pid, terminal="completed", at=at)


def _opened() -> SessionOpened:
    return SessionOpened(session_id="s1", agent="reference", cwd="/ws", created_at=1.0,
                         epoch="e1")


async def _settled_rows(store: Any) -> int:
    return await store._read(lambda conn: conn.execute(
        "SELECT COUNT(*) FROM session_prompts WHERE terminal IS NOT NULL").fetchone()[0])


async def test_a_session_settling_few_prompts_per_run_is_trimmed(tmp_path: Path) -> None:
    """The count towards the next trim is seeded at restore from the settled prompts on
    disk: a session that settles fewer than ``TRIM_TERMINALS_EVERY`` prompts a run is
    trimmed all the same (not ``TRIM_TERMINALS_EVERY - 1`` more rows a restart)."""
    path = str(tmp_path / "store.db")
    first = MAX_PROMPT_TERMINALS + TRIM_TERMINALS_EVERY - 1
    async with SqliteTaskStore(path) as store, StoreSessionJournal(store) as journal:
        journal.append(_opened())
        for batch in (range(MAX_PROMPT_TERMINALS), range(MAX_PROMPT_TERMINALS, first)):
            seq = 0
            for n in batch:   # a trim at the 256th, then 63 more: none
                journal.append(_accept(f"p{n:04d}", n))
                seq = journal.append(_settle(f"p{n:04d}", n))
            await journal.wait(seq)
        assert await _settled_rows(store) == first
    async with SqliteTaskStore(path) as store, StoreSessionJournal(store) as journal:
        await journal.restore()
        journal.append(_accept("p9999", 9999))
        await journal.wait(journal.append(_settle("p9999", 9999)))
        assert await _settled_rows(store) == MAX_PROMPT_TERMINALS


async def test_a_commit_run_twice_counts_its_settles_once(tmp_path: Path) -> None:
    """A batch whose other operation fails is rolled back and run again with savepoints:
    the journal's commit runs twice, its settles count once (counted when it lands)."""
    def boom(conn: Any, out: Any, *state: Any) -> None:
        raise ValueError("this operation's own error")

    async with SqliteTaskStore(str(tmp_path / "store.db")) as store, \
            StoreSessionJournal(store) as journal:
        journal.append(_opened())
        seq = 0
        for n in range(40):
            journal.append(_accept(f"p{n:04d}", n))
            seq = journal.append(_settle(f"p{n:04d}", n))
        failing = Op(boom)
        assert store.submit(failing)   # the same batch as the journal's commit
        await journal.wait(seq)
        await failing.done.wait()
        assert isinstance(failing.error, ValueError)
        assert journal.commits == 1 and journal._untrimmed == {"s1": 40}


async def test_the_trim_keeps_the_newest_by_settle_time(tmp_path: Path,
                                                        store_name: str) -> None:
    """Prompts settled in another order than admitted (seq): the trim keeps the newest
    ``MAX_PROMPT_TERMINALS`` by settle time, the ones restore reads and the in-memory
    deque keeps (both stores: the cut is a row comparison with a subquery)."""
    total = MAX_PROMPT_TERMINALS + TRIM_TERMINALS_EVERY
    store: Any = faulty(tmp_path)
    async with store, StoreSessionJournal(store) as journal:
        journal.append(_opened())
        for n in range(total):
            journal.append(_accept(f"p{n:04d}", n))
        seq = 0
        for n in reversed(range(total)):   # the last admitted settles first
            seq = journal.append(_settle(f"p{n:04d}", total - n))
        await journal.wait(seq)
        assert await _settled_rows(store) == MAX_PROMPT_TERMINALS
        [restored] = await journal.restore()
    assert [t.prompt_id for t in restored.terminals] == \
        [f"p{n:04d}" for n in reversed(range(MAX_PROMPT_TERMINALS))]
