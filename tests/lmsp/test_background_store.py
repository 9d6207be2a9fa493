"""The store side of background responses, on every selected store: lookup by response
id, deleting a finished task (row, events, idempotency key) and never an unfinished
one, the schema migrations that add the response-id index to an existing store; and
the kept ACP sessions never crowding out the bridge's other sessions.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import anyio
import psycopg
import pytest

from acp_server.lmsp import open_lmsp
from acp_server.store.schema import MIGRATIONS
from acp_server.store.postgres import PostgresTaskStore
from acp_server.lmsp.requests import parse_response_request
from acp_server.store.sqlite import SqliteTaskStore
from acp_server.store.tasks import TERMINAL, IdempotencyClaim
from acp_server.principals import LOCAL_CALLER
from bridge import Bridge
from bridge.agents.reference import ReferenceAgentFactory
from bridge.options import BridgeOptions
from tests.lmsp import stores
from tests.lmsp.test_store import StoreFactory, create, store_factory, terminal

pytestmark = pytest.mark.anyio
__all__ = ["store_factory"]   # the fixture, used by name


async def test_lookup_by_response_id_and_delete(store_factory: StoreFactory) -> None:
    async with store_factory() as store:
        claim = IdempotencyClaim(scope="s", key="k", fingerprint="f",
                                 expires_at=time.time() + 60)
        task_id = await create(store, idem=claim)
        record = await store.get_task(task_id)
        assert record is not None
        assert await store.get_by_response(record.response_id) == record
        assert await store.get_by_response("resp_unknown") is None
        assert await store.delete_task(task_id) is False   # queued: not deleted
        await store.transition(task_id, ("queued",), "succeeded", terminal(), now=time.time())
        assert await store.delete_task(task_id) is True
        assert await store.get_task(task_id) is None
        assert await store.get_by_response(record.response_id) is None
        assert await store.read_events(task_id, -1, 10) == []
        assert await store.delete_task(task_id) is False   # gone
        # the key went with the task: the same key makes a new task
        again = await create(store, idem=claim)
        assert again != task_id


async def test_sqlite_store_of_an_older_schema_gets_the_index(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    async with SqliteTaskStore(str(path)) as store:
        await create(store)
    with sqlite3.connect(path) as conn:   # as the store was before the response routes
        conn.execute("DROP INDEX tasks_response")   # and before the schema versions
        conn.execute("PRAGMA user_version = 0")
    async with SqliteTaskStore(str(path)) as store:
        task_id = await create(store)
        record = await store.get_task(task_id)
        assert record is not None and await store.get_by_response(record.response_id)
    with sqlite3.connect(path) as conn:
        plan = conn.execute("EXPLAIN QUERY PLAN SELECT id FROM tasks WHERE response_id = ?",
                            ("resp_x",)).fetchall()
    assert "tasks_response" in str(plan)


async def test_postgres_schema_1_is_migrated(tmp_path: Path) -> None:
    if not stores.postgres_dsn():
        pytest.skip(stores.SKIP_POSTGRES)
    url = stores.postgres_url_for(tmp_path, "v1")
    with psycopg.connect(url) as conn:   # a store created before migration 2
        conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        conn.execute(MIGRATIONS[0].postgres)
        conn.execute("INSERT INTO schema_version(version) VALUES (1)")
    async with PostgresTaskStore(url) as store:
        task_id = await create(store)
        record = await store.get_task(task_id)
        assert record is not None and await store.get_by_response(record.response_id)
    with psycopg.connect(url) as conn:
        versions = [r[0] for r in conn.execute(
            "SELECT version FROM schema_version ORDER BY version").fetchall()]
        index = conn.execute("SELECT 1 FROM pg_indexes WHERE indexname = 'tasks_response' "
                             "AND schemaname = current_schema()").fetchone()
    assert versions == list(range(1, len(MIGRATIONS) + 1)) and index is not None


async def test_kept_sessions_make_room_at_the_session_limit(tmp_path: Path,
                                                            anyio_backend: str) -> None:
    options = BridgeOptions(max_sessions=2)
    async with Bridge(ReferenceAgentFactory(), workspace_cwd=str(tmp_path),
                      options=options) as bridge, \
            open_lmsp(bridge, state_dir=str(tmp_path)) as service:

        async def respond(text: str) -> str:
            record, _ = await service.create_task(
                parse_response_request({"model": "reference", "input": text}),
                on_restart="fail", key=None, route="test", caller=LOCAL_CALLER)
            with anyio.fail_after(10):
                record = await service.wait_terminal(record.id)
            assert record.status in TERMINAL
            return record.status

        for text in ("one", "two", "three"):
            assert await respond(text) == "succeeded"
        # at most half of max_sessions is kept
        assert len(service.runner.sessions) == 1 and len(bridge.sessions()) == 1
        other = await bridge.create_session()          # another client takes the rest
        assert len(bridge.sessions()) == 2
        assert await respond("four") == "succeeded"     # the kept one made room
        assert [s.session_id for s in bridge.sessions()] == [other.session_id]
        assert len(service.runner.sessions) == 0
