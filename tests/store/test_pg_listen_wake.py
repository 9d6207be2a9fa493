"""The ``LISTEN`` connection, lost, comes back as soon as the store is seen back (any
other connection made), not when its backoff is due: an owner hears a hand-off asked
of it right after an outage, where it used to wait up to ``RECONNECT_CAP_S`` (the
``/acp`` load answered ``session_busy_elsewhere`` meanwhile). Real PostgreSQL: the
listener's backend is terminated, its backoff set to ten minutes; a notice sent by
another store reaches this one once a connection of its own is made."""

from __future__ import annotations

from pathlib import Path

import anyio
import psycopg
import pytest

from acp_server.store.errors import Backoff
from acp_server.store.postgres import PostgresTaskStore
from tests.lmsp import stores
from tests.store.test_pg_read_retry import _named_url

pytestmark = pytest.mark.anyio


def _listener_pids(app: str) -> set[int]:
    dsn = stores.postgres_dsn()
    assert dsn
    with psycopg.connect(dsn, autocommit=True) as admin:
        rows = admin.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s "
                             "AND query LIKE 'LISTEN %%'", (app,)).fetchall()
    return {pid for pid, in rows}


def _terminate(pids: set[int]) -> None:
    dsn = stores.postgres_dsn()
    assert dsn
    with psycopg.connect(dsn, autocommit=True) as admin:
        for pid in pids:
            admin.execute("SELECT pg_terminate_backend(%s, 10000)", (pid,))


async def test_a_lost_listen_comes_back_with_the_store(tmp_path: Path) -> None:
    url, app = _named_url(tmp_path, "listenwake")
    async with PostgresTaskStore(url) as store:
        store._listen_backoff = Backoff(600, 600)   # its own retry: not within this test
        with anyio.fail_after(30):
            while not (first := await anyio.to_thread.run_sync(_listener_pids, app)):
                await anyio.sleep(0.02)
        await anyio.to_thread.run_sync(_terminate, first)
        back: set[int] = set()
        with anyio.fail_after(30):
            while not back:
                # a connection made (a reader or writer healing after an outage)
                (await anyio.to_thread.run_sync(store._reconnect)).close()
                await anyio.sleep(0.02)
                back = await anyio.to_thread.run_sync(_listener_pids, app) - first
        assert len(back) == 1
        heard: list[tuple[str, str]] = []
        store.on_notify = lambda kind, task_id: heard.append((kind, task_id))
        await anyio.to_thread.run_sync(_notify, store.channel, "e:another:t-1")
        with anyio.fail_after(30):   # another instance's notice reaches it again
            while not heard:
                await anyio.sleep(0.02)
        assert heard == [("e", "t-1")]


def _notify(channel: str, payload: str) -> None:
    dsn = stores.postgres_dsn()
    assert dsn
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("SELECT pg_notify(%s, %s)", (channel, payload))
