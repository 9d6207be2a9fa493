"""The token and audit tables on both engines (``acp_server/store/tokens.py``,
``audit.py``), through a real store."""

from __future__ import annotations

from pathlib import Path

import pytest

from acp_server.principals.tokens import issue
from acp_server.store.audit import AuditQuery, AuditRecord
from acp_server.store.tokens import TokenNameTakenError
from tests.lmsp import stores

pytestmark = pytest.mark.anyio


def _store(tmp_path: Path, store_name: str):
    return stores.STORE_FACTORIES[store_name](tmp_path, "tokens.db", True)


async def test_tokens_are_stored_hashed_listed_and_revoked(tmp_path: Path, store_name: str) -> None:
    issued = issue("ci", scopes=["read"], by="bootstrap", now=100.0, expires_in_s=60)
    async with _store(tmp_path, store_name) as store:
        assert await store.token_count() == 0
        await store.create_token(issued.record)
        found = await store.get_token(issued.record.id)
        assert found == issued.record
        assert issued.token.split("_", 2)[2] not in repr(found)   # only the digest is kept
        assert await store.token_count() == 1
        assert not found.live(161.0) and found.live(159.0)       # expired by then
        with pytest.raises(TokenNameTakenError):
            await store.create_token(issue("ci", by="bootstrap", now=101.0).record)
        await store.touch_tokens({issued.record.id: 120.0})
        revoked = await store.revoke_token("ci", by="admin", at=130.0)
        assert [(r.id, r.revoked_at, r.revoked_by, r.last_used_at) for r in revoked] == \
            [(issued.record.id, 130.0, "admin", 120.0)]
        assert await store.revoke_token("ci", by="admin", at=131.0) == []
        assert await store.list_tokens() == []
        assert await store.token_count() == 1   # a revoked token still counts
        again = issue("ci", by="bootstrap", now=140.0).record   # the name is free again
        await store.create_token(again)
        listed = await store.list_tokens(include_revoked=True)
        assert [(r.id, r.revoked_at is None) for r in listed] == \
            [(issued.record.id, False), (again.id, True)]


async def test_the_audit_table_appends_pages_filters_and_purges(tmp_path: Path,
                                                                store_name: str) -> None:
    async with _store(tmp_path, store_name) as store:
        await store.append_audit([
            AuditRecord(at=10.0 + i, principal="ci" if i % 2 else "ops", action=f"a.{i}",
                        target=f"t{i}", client="127.0.0.1", detail='{"i": %d}' % i)
            for i in range(6)])
        everything = await store.read_audit(AuditQuery())
        assert [r.action for r in everything] == [f"a.{i}" for i in range(6)]
        seqs = [r.seq for r in everything]
        assert seqs == sorted(seqs) and len(set(seqs)) == 6
        page = await store.read_audit(AuditQuery(after=seqs[1], limit=2))
        assert [r.action for r in page] == ["a.2", "a.3"]
        ci = await store.read_audit(AuditQuery(principal="ci", since=11.0, until=15.0))
        assert [r.action for r in ci] == ["a.1", "a.3"]
        assert (await store.read_audit(AuditQuery(action="a.4")))[0].detail == '{"i": 4}'
        assert await store.purge_audit(before=13.0) == 3
        assert [r.action for r in await store.read_audit(AuditQuery())] == ["a.3", "a.4", "a.5"]


async def test_an_expired_token_is_not_live_and_gives_its_name_up(tmp_path: Path,
                                                                  store_name: str) -> None:
    short = issue("ci", by="bootstrap", now=100.0, expires_in_s=1).record
    async with _store(tmp_path, store_name) as store:
        await store.create_token(short)
        assert [r.id for r in await store.list_tokens(now=100.5)] == [short.id]
        assert await store.list_tokens(now=101.0) == []
        with pytest.raises(TokenNameTakenError):   # still live at 100.5
            await store.create_token(issue("ci", by="bootstrap", now=100.5).record)
        again = issue("ci", by="bootstrap", now=110.0).record
        await store.create_token(again)            # expired: the name is free
        listed = await store.list_tokens(include_revoked=True)
        assert [(r.id, r.revoked_at, r.revoked_by) for r in listed] == \
            [(short.id, 101.0, "expiry"), (again.id, None, None)]
        assert [r.id for r in await store.list_tokens(now=110.0)] == [again.id]
        assert [r.id for r in await store.revoke_token("ci", by="admin", at=120.0)] == \
            [again.id]


async def test_a_token_revoked_by_expiry_as_its_name_is_taken_is_audited(
        tmp_path: Path, store_name: str) -> None:
    """``admin.create_token`` over an expired token of the name: the store says which
    it revoked (once), and the audit log gets their ``token.revoked`` by ``expiry``."""
    from acp_server.principals import admin
    from acp_server.principals.audit import AuditLog

    now = [100.0]
    async with _store(tmp_path, store_name) as store:
        audit = AuditLog(store, clock=lambda: now[0])
        first = await admin.create_token(store, audit, by="bootstrap", name="ci",
                                         expires="1s")
        now[0] = 110.0
        second = await admin.create_token(store, audit, by="bootstrap", name="ci")
        expired: list[str] = []
        third = issue("other", by="bootstrap", now=110.0).record
        await store.create_token(third, expired)
        assert expired == []   # nothing of that name expired
        records = list(audit._buffer)
        assert [(r.principal, r.action, r.target) for r in records] == [
            ("bootstrap", "token.created", "ci"), ("expiry", "token.revoked", "ci"),
            ("bootstrap", "token.created", "ci")]
        assert first.record.id in records[1].detail
        assert second.record.id in records[2].detail
