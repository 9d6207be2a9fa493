"""A read whose connection broke is retried once on a fresh one (``pg_engine``'s
contract): after a failover (here ``pg_terminate_backend``) the pooled readers still
look usable, and their first reads must not fail. Then reported as unavailable; SQLite
reads are never retried. Both anyio backends (``tests/conftest.py``)."""

from __future__ import annotations

import secrets
import sqlite3
import urllib.parse
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

from acp_server.store.errors import StoreUnavailableError
from acp_server.store.pg_engine import READERS
from acp_server.store.postgres import PostgresTaskStore
from acp_server.store.sqlite import SqliteTaskStore
from tests.lmsp import stores

pytestmark = pytest.mark.anyio


def _named_url(tmp_path: Path, name: str) -> tuple[str, str]:
    """A test schema's URL whose connections carry their own ``application_name``
    (only this store's backends are terminated: other tests may share the server). The
    name is random: ``tmp_path.name`` is cut to 30 characters, so the asyncio and trio
    runs of one test, on two xdist workers at once, had the same one and each
    terminated the other's backends (a CI run saw it)."""
    url = stores.postgres_url_or_skip(tmp_path, name)
    app = f"acp-{name}-{secrets.token_hex(8)}"
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query) + [("application_name", app)]
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query))), app


def _terminate(app: str) -> set[int]:
    """Ends every backend of ``app`` and waits until each is gone (the server waits:
    ``pg_terminate_backend``'s timeout); returns their pids."""
    dsn = stores.postgres_dsn()
    assert dsn
    with psycopg.connect(dsn, autocommit=True) as admin:
        rows = admin.execute("SELECT pid, pg_terminate_backend(pid, 10000) FROM "
                             "pg_stat_activity WHERE application_name = %s", (app,)).fetchall()
    assert rows and all(ok for _, ok in rows), rows
    return {pid for pid, _ in rows}


async def test_reads_after_the_backends_were_terminated(tmp_path: Path) -> None:
    url, app = _named_url(tmp_path, "readretry")
    async with PostgresTaskStore(url) as store:
        readers = {conn.info.backend_pid for conn in store._readers}
        assert len(readers) == READERS
        killed = await anyio.to_thread.run_sync(_terminate, app)
        assert readers <= killed
        results: list[dict[str, int]] = []

        async def count() -> None:
            results.append(await store.status_counts())

        async with anyio.create_task_group() as tg:   # every reader at once
            for _ in range(READERS):
                tg.start_soon(count)
        for _ in range(READERS):                      # and each again, in turn
            await count()
        assert results == [{}] * (2 * READERS)
        assert store.health.up and store.health.failures == 0
        now = {conn.info.backend_pid for conn in store._readers}
        assert len(now) == READERS and not now & killed   # each one was replaced


async def test_a_read_is_retried_once_then_reported(tmp_path: Path) -> None:
    url, _ = _named_url(tmp_path, "readonce")
    calls: list[int] = []

    def suicide(conn: psycopg.Connection[Any]) -> None:   # breaks its connection each time
        calls.append(conn.info.backend_pid)
        conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")

    async with PostgresTaskStore(url) as store:
        with pytest.raises(StoreUnavailableError, match="terminating connection"):
            await store._read(suicide)
        assert len(calls) == 2 and calls[0] != calls[1]   # once more, on a new connection
        assert not store.health.up
        assert await store.status_counts() == {}
        assert store.health.up


async def test_an_error_on_a_sound_connection_is_not_retried(tmp_path: Path) -> None:
    url, _ = _named_url(tmp_path, "readsound")
    calls: list[int] = []

    def fails(conn: psycopg.Connection[Any]) -> None:
        calls.append(1)
        raise psycopg.OperationalError("not the connection's fault")

    async with PostgresTaskStore(url) as store:
        with pytest.raises(StoreUnavailableError, match="not the connection's fault"):
            await store._read(fails)
        assert calls == [1]


async def test_sqlite_reads_are_not_retried(tmp_path: Path) -> None:
    calls: list[int] = []

    def fails(conn: sqlite3.Connection) -> None:
        calls.append(1)
        raise sqlite3.OperationalError("disk I/O error")

    async with SqliteTaskStore(str(tmp_path / "store.db")) as store:
        with pytest.raises(StoreUnavailableError, match="disk I/O error"):
            await store._read(fails)
        assert calls == [1]
