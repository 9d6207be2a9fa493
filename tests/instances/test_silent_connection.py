"""A session lease renewed while the writer's connection to PostgreSQL has gone silent
(its backend paused with SIGSTOP: the connection stays open and a statement on it never
returns, as behind a firewall that dropped it), the server itself still serving new
connections: the renewal is abandoned on that connection after its bound
(``--store-busy-timeout-ms`` plus 0.5 s, at least 2 s) and re-sent on a new one, so the
lease is renewed long before it could expire and another instance adopt the session.
Before, the renewal (and every write behind it) waited on the silent connection for as
long as it stayed silent."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

from tests.harness import local_server
from tests.instances.test_leases import _lease, _session
from tests.lmsp import stores

pytestmark = pytest.mark.anyio
GUARD_S = 30   # against a hang, never a timing


@pytest.fixture
def pg_url(tmp_path: Path) -> str:
    return stores.postgres_url_or_skip(tmp_path, "silent")


def _expiry(db: psycopg.Connection[Any], sid: str) -> float:
    row = db.execute("SELECT expires_at FROM session_leases WHERE session_id = %s",
                     (sid,)).fetchone()
    assert row is not None
    return float(row[0])


@contextlib.asynccontextmanager
async def _paused_idle(db: psycopg.Connection[Any], conn: Any) -> AsyncIterator[None]:
    """``conn``'s backend paused while idle (no transaction of it open: no lock held)."""
    pid = conn.info.backend_pid
    deadline = time.monotonic() + GUARD_S
    while True:
        os.kill(pid, signal.SIGSTOP)
        state = db.execute("SELECT state FROM pg_stat_activity WHERE pid = %s",
                           (pid,)).fetchone()
        if state == ("idle",):
            break
        os.kill(pid, signal.SIGCONT)
        assert time.monotonic() < deadline, f"backend {pid} never idle: {state}"
        await anyio.sleep(0.01)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


async def test_a_renewal_on_a_silent_connection_lands_on_a_new_one(tmp_path: Path,
                                                                  pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as db:
        async with local_server(tmp_path, store=pg_url, store_busy_timeout_ms=500,
                                session_lease_ttl_ms=120_000,
                                session_lease_renew_ms=60_000) as srv:
            journal: Any = srv.bridge.journal
            sid = await _session(srv.client)
            writer = journal.store._writers[0]
            before = _expiry(db, sid)
            lost: list[set[str]] = []
            renewed = anyio.Event()

            async def renew() -> None:   # a write's wait is shielded: the guard waits here
                lost.append(await journal.renew())
                renewed.set()

            async with anyio.create_task_group() as tg, _paused_idle(db, writer):
                tg.start_soon(renew)
                with anyio.fail_after(GUARD_S):
                    await renewed.wait()
                assert lost == [set()]
                assert _expiry(db, sid) > before   # renewed, on a new connection
                assert _lease(db, sid)[:2] == (srv.server.leases.instance, 1)  # type: ignore
                assert journal.store._writers[0] is not writer
                made = await srv.client.post("/session", json={"sessionScope": "thread"})
                assert made.status_code == 200, made.text   # the writer serves on
