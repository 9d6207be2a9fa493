"""The store contract (``acp_server.store.tasks``), parametrized over implementations.

Each test runs on every store of ``LMSP_TEST_STORES`` (SQLite, and PostgreSQL when
``ACP_SERVER_TEST_POSTGRES`` is set).
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from acp_server.lmsp.responses import created_event, error_finish, recovery_finish
from acp_server.lmsp.service import new_id
from acp_server.store.postgres import PostgresTaskStore
from acp_server.store.sqlite import SqliteTaskStore
from acp_server.store.tasks import (
    CommittedEvent,
    Finish,
    IdempotencyClaim,
    KeyReusedError,
    NewTask,
    QueueFullError,
    TaskStore,
    queued_record,
)
from acp_server.lmsp.wire import ResponseEvent
from tests.lmsp.stores import SKIP_POSTGRES, STORE_FACTORIES, postgres_dsn, selected_stores

pytestmark = pytest.mark.anyio
StoreFactory = Callable[..., contextlib.AbstractAsyncContextManager[TaskStore]]


@pytest.fixture(params=selected_stores())
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    if request.param == "postgres" and not postgres_dsn():
        pytest.skip(SKIP_POSTGRES)
    @contextlib.asynccontextmanager
    async def open_store(*, on_commit: Any = None, group_commit: bool = True
                         ) -> AsyncIterator[TaskStore]:
        store = STORE_FACTORIES[request.param](tmp_path, "store.db", group_commit)
        store.on_commit = on_commit
        async with store:
            yield store

    return open_store


def new_task(policy: str = "fail", model: str = "reference") -> NewTask:
    return NewTask(id=new_id("task"), response_id=new_id("resp"), on_restart=policy,
                   model=model, principal="anonymous", request=b'{"model":"reference"}',
                   created_at=time.time())


async def create(store: TaskStore, policy: str = "fail", idem: IdempotencyClaim | None = None
                 ) -> str:
    task = new_task(policy)
    outcome = await store.create_task(task, created_event(queued_record(task)), idem)
    return outcome.task.id


def terminal(kind: str = "response.completed") -> Callable[[Any], Finish]:
    return lambda rec: Finish(events=[ResponseEvent(
        type=kind, response=created_event(rec).response)], response=b"{}")


async def test_create_writes_row_and_event_zero(store_factory: StoreFactory) -> None:
    published: list[list[CommittedEvent]] = []
    async with store_factory(on_commit=published.append) as store:
        task_id = await create(store)
        record = await store.get_task(task_id)
        assert record is not None and record.status == "queued" and record.next_seq == 1
        events = await store.read_events(task_id, -1, 10)
        assert [(e.seq, e.type) for e in events] == [(0, "response.created")]
        assert published == [events]


async def test_transitions_are_conditional_and_terminal_is_final(
        store_factory: StoreFactory) -> None:
    async with store_factory() as store:
        task_id = await create(store)
        assert await store.transition(task_id, ("running",), "succeeded", now=1) is None
        claimed = await store.claim_next(time.time())
        assert claimed is not None and claimed.id == task_id and claimed.status == "loading"
        assert claimed.attempt == 1
        won = await store.transition(task_id, ("loading",), "running", now=2)
        assert won is not None and won.task.status == "running"
        done = await store.transition(task_id, ("running",), "succeeded", terminal(), now=3)
        assert done is not None and [e.seq for e in done.events] == [1]
        assert done.task.finished_at == 3
        for target in ("queued", "loading", "running", "failed", "cancelled", "cancelling"):
            for source in (("succeeded",), ("running", "cancelling")):
                if "succeeded" in source:
                    continue
                assert await store.transition(task_id, source, target, terminal(), now=4) is None
        record, changed = await store.request_cancel(task_id, terminal("response.cancelled"),
                                                     now=5)
        assert record is not None and record.status == "succeeded" and not changed
        assert [e.type for e in await store.read_events(task_id, -1, 10)] == [
            "response.created", "response.completed"]


async def test_racing_terminal_transitions_have_one_winner(store_factory: StoreFactory) -> None:
    async with store_factory() as store:
        ids = [await create(store) for _ in range(20)]
        for _ in ids:
            await store.claim_next(time.time())
        for task_id in ids:
            await store.transition(task_id, ("loading",), "running", now=1)
        wins: list[tuple[str, str]] = []

        async def finish(task_id: str, status: str, kind: str) -> None:
            if await store.transition(task_id, ("running",), status, terminal(kind), now=2):
                wins.append((task_id, status))

        async def cancel(task_id: str) -> None:
            record, changed = await store.request_cancel(task_id, terminal("response.cancelled"),
                                                         now=2)
            if changed and record is not None:
                wins.append((task_id, record.status))

        async with anyio.create_task_group() as tg:
            for task_id in ids:
                tg.start_soon(finish, task_id, "succeeded", "response.completed")
                tg.start_soon(finish, task_id, "failed", "response.failed")
                tg.start_soon(cancel, task_id)
        for task_id in ids:
            mine = [w for w in wins if w[0] == task_id]
            assert len(mine) == 1, mine
            record = await store.get_task(task_id)
            assert record is not None and record.status == mine[0][1]
            types = [e.type for e in await store.read_events(task_id, -1, 10)]
            assert len(types) == (1 if record.status == "cancelling" else 2)


async def test_group_commit_shares_transactions(store_factory: StoreFactory) -> None:
    for group in (True, False):
        async with store_factory(group_commit=group) as store:
            before = store.commits
            async with anyio.create_task_group() as tg:
                for _ in range(100):
                    tg.start_soon(create, store)
            commits = store.commits - before
            if group:
                assert commits < 50
            else:
                assert commits == 100


async def test_failed_operation_rolls_back_alone(store_factory: StoreFactory) -> None:
    async with store_factory() as store:
        idem = IdempotencyClaim(scope="s", key="k", fingerprint="a", expires_at=time.time() + 60)
        first = await create(store, idem=idem)
        results: list[Any] = []

        async def reuse() -> None:
            try:
                await create(store, idem=IdempotencyClaim(scope="s", key="k", fingerprint="b",
                                                          expires_at=time.time() + 60))
            except KeyReusedError:
                results.append("422")

        async def plain() -> None:
            results.append(await create(store))

        async with anyio.create_task_group() as tg:
            tg.start_soon(reuse)
            tg.start_soon(plain)
        assert "422" in results and len(results) == 2
        assert await store.get_task(first) is not None


async def test_recovery_applies_each_policy(store_factory: StoreFactory) -> None:
    async with store_factory() as store:
        ids = {}
        for name, policy in (("fail", "fail"), ("retry", "retry"), ("cancelling", "retry"),
                             ("retry_exhausted", "retry"), ("loading_fail", "fail")):
            ids[name] = await create(store, policy)
        # move them to the states a crash leaves behind
        for name in ("fail", "retry", "cancelling", "retry_exhausted", "loading_fail"):
            await store.claim_next(time.time())
        for name in ("fail", "retry", "cancelling", "retry_exhausted"):
            await store.transition(ids[name], ("loading",), "running", now=1)
        queued = await create(store, "fail")
        await store.request_cancel(ids["cancelling"], terminal("response.cancelled"), now=1)
        for _ in range(2):   # two more attempts: attempt becomes 3
            await store.transition(ids["retry_exhausted"], ("running",), "queued", now=1)
            claimed = await store.claim_next(time.time())
            assert claimed is not None and claimed.id == ids["retry_exhausted"]
            await store.transition(ids["retry_exhausted"], ("loading",), "running", now=1)
        if isinstance(store, PostgresTaskStore):
            await store.release_leases()   # the crash: the owner's leases lapse
        report = await store.recover(recovery_finish, max_attempts=3, now=10)
        assert (report.failed, report.requeued, report.cancelled) == (3, 1, 1)
        records = {name: await store.get_task(i) for name, i in ids.items()}
        status = {name: r.status for name, r in records.items() if r is not None}
        assert status == {"fail": "failed", "retry": "queued", "cancelling": "cancelled",
                          "retry_exhausted": "failed", "loading_fail": "failed"}
        assert (await store.get_task(queued)).status == "queued"  # type: ignore[union-attr]
        failed = await store.get_task(ids["fail"])
        assert failed is not None and b'"code":"server_restarted"' in (failed.error or b"")
        assert b'"status"' not in (failed.error or b"")
        types = [e.type for e in await store.read_events(ids["fail"], -1, 10)]
        assert types == ["response.created", "response.failed"]
        types = [e.type for e in await store.read_events(ids["cancelling"], -1, 10)]
        assert types == ["response.created", "response.cancelled"]


async def test_purge(store_factory: StoreFactory) -> None:
    async with store_factory() as store:
        task_id = await create(store)
        await store.request_cancel(task_id, lambda rec: error_finish(rec, "", "",
                                                                     status="cancelled"), now=100)
        assert await store.purge(now=150, event_retention=60, task_retention=120, key_ttl=1) == 0
        assert await store.purge(now=200, event_retention=60, task_retention=120, key_ttl=1) == 2
        record = await store.get_task(task_id)
        assert record is not None and record.events_purged
        assert await store.read_events(task_id, -1, 10) == []
        await store.purge(now=300, event_retention=60, task_retention=120, key_ttl=1)
        assert await store.get_task(task_id) is None


async def test_sqlite_file_is_wal_and_full(tmp_path: Path) -> None:
    async with SqliteTaskStore(str(tmp_path / "x.db")) as store:
        await create(store)
        conn = sqlite3.connect(tmp_path / "x.db")
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        writer = store._writer
        assert writer is not None
        assert writer.execute("PRAGMA synchronous").fetchone()[0] == 2   # FULL
        conn.close()


async def test_events_are_published_only_after_commit(tmp_path: Path) -> None:
    path = tmp_path / "pub.db"
    seen: list[int] = []
    outside: list[sqlite3.Connection] = []

    def on_commit(events: list[CommittedEvent]) -> None:
        # another connection must already see them: they were committed
        rows = outside[0].execute(
            "SELECT seq FROM task_events WHERE task_id = ? ORDER BY seq",
            (events[0].task_id,)).fetchall()
        assert {e.seq for e in events} <= {r[0] for r in rows}
        seen.extend(e.seq for e in events)

    async with SqliteTaskStore(str(path), on_commit=on_commit) as store:
        outside.append(sqlite3.connect(path, check_same_thread=False))
        task_id = await create(store)
        await store.claim_next(time.time())
        await store.transition(task_id, ("loading",), "running", now=1)
        drafts = [ResponseEvent(type="response.in_progress",
                                response=created_event(queued_record(new_task())).response)] * 3
        await store.append_events(task_id, drafts, ("running",))
        await store.transition(task_id, ("running",), "succeeded", terminal(), now=2)
        assert seen == [0, 1, 2, 3, 4]
        outside[0].close()


async def test_queue_limit_holds_for_concurrent_creates(store_factory: StoreFactory) -> None:
    async with store_factory() as store:
        outcomes: list[str] = []

        async def post() -> None:
            task = new_task()
            try:
                await store.create_task(task, created_event(queued_record(task)), None,
                                        max_queued=10)
                outcomes.append("created")
            except QueueFullError:
                outcomes.append("full")

        for _ in range(2):   # the second round: the queue is already full
            async with anyio.create_task_group() as tg:
                for _ in range(30):
                    tg.start_soon(post)
        assert outcomes.count("created") == 10 and outcomes.count("full") == 50
        assert (await store.claim_next(time.time())) is not None
        await create(store)   # a freed slot (no limit given here)
