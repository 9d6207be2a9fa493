"""Writes of the principals the store refuses every time (real triggers, SQLite and
PostgreSQL) do not hold the others back and are not retried:

* an audit record: the rest of its batch is written, the refused one is logged once
  and counted, ``read`` (``GET /audit``) and ``flush`` answer, and the records that
  follow are written;
* a token's last use: the other tokens' are written, the refused one is dropped and
  logged once per token;
* a token's creation over HTTP: a 503 ``store_unavailable`` in REST's shape (it was a
  500), and the next creation works."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from acp_server.principals.audit import AuditLog
from acp_server.principals.auth import Authenticator
from acp_server.principals.tokens import issue
from acp_server.store.audit import AuditQuery
from tests.harness import local_server
from tests.lmsp import stores
from tests.principals.helpers import bearer
from tests.store.triggers import refuse_rows

pytestmark = pytest.mark.anyio

MARK = "POISON"


def _refuse_marked(tmp_path: Path, store_name: str, store: Any) -> None:
    """A real trigger: an audit row whose detail holds ``MARK`` is refused."""
    postgres = store_name == "postgres"
    refuse_rows(url=store.url if postgres else None, sqlite_path=tmp_path / "audit.db",
                name="refuse_marked", table="audit",
                when=f"position('{MARK}' IN NEW.detail) > 0" if postgres
                else f"instr(NEW.detail, '{MARK}') > 0")


async def test_a_refused_audit_record_fails_alone(tmp_path: Path, store_name: str,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="acp_server.principals")
    async with stores.STORE_FACTORIES[store_name](tmp_path, "audit.db", True) as store:
        _refuse_marked(tmp_path, store_name, store)
        audit = AuditLog(store, clock=lambda: 100.0, flush_interval_s=0)
        for n in range(9):
            audit.record("ci", "prompt.accepted", f"s{n}", text=MARK if n in (3, 7) else "ok")
        await audit.flush()   # answers: the refused ones are not kept
        assert audit.refused == 2 and audit.written == 7 and audit.buffered == 0
        audit.record("ci", "session.closed", "s9")
        found = await audit.read(AuditQuery(limit=100))   # flushes, then reads
        assert [r.target for r in found] == [f"s{n}" for n in (0, 1, 2, 4, 5, 6, 8, 9)]
        refused = [r.getMessage() for r in caplog.records
                   if "the store refused a record" in r.getMessage()]
        assert len(refused) == 2   # once each, not retried
        assert all("prompt.accepted by ci" in m and MARK not in m for m in refused)


async def test_a_refused_audit_records_principal_is_escaped_in_its_line(
        tmp_path: Path, store_name: str, caplog: pytest.LogCaptureFixture) -> None:
    """The principal (a token's name, which its admin chose) as the log's one rule says
    it (``bridge.loggable``): it was cut only, so a bidi override or ESC reached the line."""
    caplog.set_level(logging.INFO, logger="acp_server.principals")
    async with stores.STORE_FACTORIES[store_name](tmp_path, "audit.db", True) as store:
        _refuse_marked(tmp_path, store_name, store)
        audit = AuditLog(store, clock=lambda: 100.0, flush_interval_s=0)
        audit.record("café\u202e\x1b[2J", "prompt.accepted", "s0", text=MARK)
        await audit.flush()
        refused, = [r.getMessage() for r in caplog.records
                    if "the store refused a record" in r.getMessage()]
    assert "prompt.accepted by café\\u202e\\x1b[2J" in refused, refused


def _refuse_token_updates(tmp_path: Path, store_name: str, store: Any, name: str) -> None:
    """A real trigger: an UPDATE of the token named ``name`` is refused."""
    refuse_rows(url=store.url if store_name == "postgres" else None,
                sqlite_path=tmp_path / "audit.db", name="refuse_token", table="tokens",
                event="UPDATE", when=f"NEW.name = '{name}'")


async def test_a_refused_last_use_loses_no_other_tokens(tmp_path: Path, store_name: str,
                                                        caplog: pytest.LogCaptureFixture
                                                        ) -> None:
    caplog.set_level(logging.INFO, logger="acp_server.principals")
    async with stores.STORE_FACTORIES[store_name](tmp_path, "audit.db", True) as store:
        good, bad = (issue(name, by="bootstrap", now=100.0).record for name in ("ci", "bad"))
        for record in (good, bad):
            await store.create_token(record)
        _refuse_token_updates(tmp_path, store_name, store, "bad")
        auth = Authenticator(store)
        for at in (200.0, 300.0):   # twice: the refused one is logged once
            auth.used = {bad.id: at, good.id: at}
            await auth.flush_used(force=True)   # answers
            assert (await store.get_token(good.id)).last_used_at == at
            assert (await store.get_token(bad.id)).last_used_at is None
            assert auth.used == {}   # nothing kept to retry
        refused = [r.getMessage() for r in caplog.records
                   if "the store refused the last use" in r.getMessage()]
        assert len(refused) == 1 and bad.id in refused[0]


async def test_a_refused_token_creation_is_a_503(tmp_path: Path, store_name: str,
                                                caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="acp_server.rest")
    settings: dict[str, Any] = {}
    if store_name == "postgres":
        settings["store"] = stores.postgres_url_for(tmp_path, "tokens")
    async with local_server(tmp_path, token="boot-s3cret", headers=bearer("boot-s3cret"),
                            **settings) as srv:
        refuse_rows(url=settings.get("store"), sqlite_path=tmp_path / "state" / "lmsp.sqlite3",
                    name="refuse_token", table="tokens", when="NEW.name = 'poison'")
        refused = await srv.client.post("/tokens", json={"name": "poison"})
        assert refused.status_code == 503, refused.text
        assert refused.json()["code"] == "store_unavailable"
        assert refused.headers["retry-after"] == "5"
        assert any("the store refused the write" in r.getMessage() for r in caplog.records)
        made = await srv.client.post("/tokens", json={"name": "ci"})
        assert made.status_code == 201, made.text
        listed = (await srv.client.get("/tokens")).json()["tokens"]
        assert [t["name"] for t in listed] == ["ci"]
