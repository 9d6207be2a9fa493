"""A branch's seed (``SessionOpened.seed``: its parent's transcript at the branch, up to
1 MiB) is kept apart from its session record (``sessions.seed``, schema migration 7),
on SQLite and on PostgreSQL: the restore, an adoption and a cold load read it; the
fleet's listing of open sessions (``read_open``), the replica reads (``read``), the
ended sessions' listing and ``record_of`` read the record alone, a few hundred bytes a
session. A store written before the column (the seed inside the record) is migrated:
the seed moves out and the branch restores with it; a record an older instance writes
afterwards, with its seed inside and none in the column, restores with it as well."""

from __future__ import annotations

from pathlib import Path

import pytest

from acp_server.fleet.replica import QUESTIONS
from acp_server.store.sessions import StoreSessionJournal
from bridge.journal import RECORD_ENCODER, SessionEnded, SessionOpened
from bridge.transcript import seed_of
from tests.store.test_journal_isolation import _store
from tests.store.test_journal_refusals import _run_sql

pytestmark = pytest.mark.anyio

# a parent's conversation at a branch, as ``seed_of`` keeps it: half a MiB
SEED = '[{"role":"user","text":"remember banana"},{"role":"agent","text":"' \
    + "b" * (1 << 19) + '"}]'


def _opened(sid: str, created_at: float, seed: str | None = None) -> SessionOpened:
    return SessionOpened(session_id=sid, agent="a", cwd="/w", created_at=created_at,
                         epoch=f"e-{sid}", forked_from=None if seed is None else "parent",
                         seed=seed)


def _stored(tmp_path: Path, store_name: str, url: str | None, sid: str
            ) -> tuple[bytes, bytes | None]:
    [(record, seed)] = _run_sql(tmp_path, store_name, url,
                                "SELECT record, seed FROM sessions WHERE id = ?", (sid,))
    return bytes(record), None if seed is None else bytes(seed)


async def test_the_seed_is_kept_apart_and_read_by_what_restores_alone(
        tmp_path: Path, store_name: str) -> None:
    store, url = _store(tmp_path, store_name)
    async with store:
        async with StoreSessionJournal(store) as journal:
            journal.append(_opened("parent", 1.0))
            journal.append(_opened("branch", 2.0, SEED))
            journal.append(_opened("ended", 3.0, SEED))
            journal.append(SessionEnded(session_id="ended", at=4.0))
            await journal.wait(journal.appended)
            record, seed = _stored(tmp_path, store_name, url, "branch")
            assert len(record) < 300 and b"banana" not in record
            assert seed == SEED.encode()
            # the listings and the replica reads: no seed read
            listed = {f.record.session_id: f.record for f in await journal.read_open(QUESTIONS)}
            assert set(listed) == {"parent", "branch"}
            assert listed["branch"].seed is None and listed["branch"].forked_from == "parent"
            for only in (None, QUESTIONS):
                alone = await journal.read("branch", only=only)
                assert alone is not None and alone.record.seed is None
            kept = await journal.record_of("branch")
            assert kept is not None and kept.seed is None
            [ended] = await journal.ended(before=None, limit=10)
            assert ended.record.session_id == "ended" and ended.record.seed is None
            # a cold load of a closed branch reads it
            cold = await journal.read("ended", seed=True)
            assert cold is not None and cold.record.seed == SEED
        async with StoreSessionJournal(store) as journal:   # the restore reads it
            restored = {f.record.session_id: f.record for f in await journal.restore()}
    assert restored["branch"].seed == SEED and restored["parent"].seed is None
    assert restored["ended"].seed == SEED


async def test_a_seed_that_cannot_be_decoded_restores_the_branch_without_it(
        tmp_path: Path, store_name: str) -> None:
    """A damaged ``seed`` column (not UTF-8) failed the whole restore: the instance
    could not start. The branch now restores without it (as an unreadable seed counts
    as none, ``bridge.transcript.after_seed``), the others untouched."""
    store, url = _store(tmp_path, store_name)
    async with store:
        async with StoreSessionJournal(store) as journal:
            journal.append(_opened("branch", 1.0, SEED))
            journal.append(_opened("other", 2.0, SEED))
            await journal.wait(journal.appended)
        _run_sql(tmp_path, store_name, url, "UPDATE sessions SET seed = ? WHERE id = ?",
                 (b"\xff\xfe", "branch"))
        async with StoreSessionJournal(store) as journal:
            restored = {f.record.session_id: f.record for f in await journal.restore()}
            cold = await journal.read("branch", seed=True)
    assert restored["branch"].seed is None and restored["branch"].forked_from == "parent"
    assert restored["other"].seed == SEED
    assert cold is not None and cold.record.seed is None


async def test_a_store_with_seeds_inside_records_is_migrated(tmp_path: Path,
                                                             store_name: str) -> None:
    store, url = _store(tmp_path, store_name)
    async with store:   # the store as the version before the column wrote it
        pass
    if store_name == "postgres":
        _run_sql(tmp_path, store_name, url, "DELETE FROM schema_version WHERE version >= 7")
        _run_sql(tmp_path, store_name, url, "DROP TABLE session_segments")   # migration 8's
    else:
        _run_sql(tmp_path, store_name, url, "PRAGMA user_version = 6")
    _run_sql(tmp_path, store_name, url, "ALTER TABLE sessions DROP COLUMN seed")
    old = {"parent": _opened("parent", 1.0), "branch": _opened("branch", 2.0, SEED),
           "small": _opened("small", 3.0, seed_of(None, []))}
    for sid, record in old.items():
        _run_sql(tmp_path, store_name, url, "INSERT INTO sessions(id, created_at, record) "
                 "VALUES (?, ?, ?)", (sid, record.created_at, RECORD_ENCODER.encode(record)))
    _run_sql(tmp_path, store_name, url, "INSERT INTO sessions(id, created_at, record) "
             "VALUES ('garbage', 4.0, ?)", (b"\xc1 not a record",))
    if store_name == "sqlite":   # TEXT that is not UTF-8 (a record overwritten by hand)
        _run_sql(tmp_path, store_name, url, "INSERT INTO sessions(id, created_at, record) "
                 "VALUES ('text', 5.0, CAST(X'c3' AS TEXT))")
    store, url = _store(tmp_path, store_name)
    async with store:
        record, seed = _stored(tmp_path, store_name, url, "branch")
        assert len(record) < 300 and seed == SEED.encode()
        assert _stored(tmp_path, store_name, url, "parent")[1] is None
        assert _stored(tmp_path, store_name, url, "garbage") == (b"\xc1 not a record", None)
        async with StoreSessionJournal(store) as journal:
            restored = {f.record.session_id: f.record for f in await journal.restore()}
            assert set(restored) == {"parent", "branch", "small"}   # garbage: skipped
            assert restored["branch"] == old["branch"]
            assert restored["small"].seed == "[]" and restored["parent"].seed is None
            listed = {f.record.session_id: f.record for f in await journal.read_open(QUESTIONS)}
            assert listed["branch"].seed is None
        # a record an older instance writes with its seed inside: restored with it
        _run_sql(tmp_path, store_name, url, "UPDATE sessions SET record = ?, seed = NULL "
                 "WHERE id = 'branch'", (RECORD_ENCODER.encode(old["branch"]),))
        async with StoreSessionJournal(store) as journal:
            restored = {f.record.session_id: f.record for f in await journal.restore()}
    assert restored["branch"].seed == SEED
