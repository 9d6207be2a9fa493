"""PostgreSQL-only store behaviour: two stores (instances) on one schema.

Schema versioning, claims that never hand one task to two instances, idempotency
keys across instances, leases (an instance that lost its lease writes nothing; an
expired lease is recovered by another instance), cross-instance notices, and the
polling fallback alone (notices dropped) carrying events, queued work and cancels.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import psycopg
import pytest

from acp_server.lmsp import LmspService, open_lmsp
from acp_server.store.postgres import PostgresTaskStore
from acp_server.store.schema import MIGRATIONS
from acp_server.lmsp.requests import parse_task_envelope
from acp_server.lmsp.responses import created_event, recovery_finish
from acp_server.store.tasks import IdempotencyClaim, queued_record
from acp_server.principals import LOCAL_CALLER
from bridge import Bridge
from bridge.agents.reference import ReferenceAgentFactory
from tests.lmsp import stores
from tests.lmsp.server import envelope
from tests.lmsp.test_store import create, new_task, terminal

pytestmark = pytest.mark.anyio


@pytest.fixture
def url(tmp_path: Path) -> str:
    return stores.postgres_url_or_skip(tmp_path, "pg")


@contextlib.asynccontextmanager
async def two_stores(url: str, *, lease_s: float = 30) -> AsyncIterator[
        tuple[PostgresTaskStore, PostgresTaskStore]]:
    async with PostgresTaskStore(url, lease_s=lease_s) as a, \
            PostgresTaskStore(url, lease_s=lease_s) as b:
        yield a, b


async def test_schema_is_versioned_and_migration_is_idempotent(url: str) -> None:
    async with two_stores(url):
        pass
    async with PostgresTaskStore(url):
        pass
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT version FROM schema_version ORDER BY version").fetchall()
    assert [r[0] for r in rows] == list(range(1, len(MIGRATIONS) + 1))


async def test_concurrent_claims_never_share_a_task(url: str) -> None:
    async with two_stores(url) as (a, b):
        ids = {await create(a) for _ in range(40)}
        claimed: list[tuple[str, str]] = []

        async def drain(store: PostgresTaskStore) -> None:
            while (record := await store.claim_next(time.time())) is not None:
                claimed.append((store.instance, record.id))

        async with anyio.create_task_group() as tg:
            for store in (a, b, a, b):
                tg.start_soon(drain, store)
        assert sorted(task_id for _, task_id in claimed) == sorted(ids)
        assert {instance for instance, _ in claimed} <= {a.instance, b.instance}


async def test_idempotency_key_across_instances(url: str) -> None:
    async with two_stores(url) as (a, b):
        claim = IdempotencyClaim(scope="s", key="k", fingerprint="f",
                                 expires_at=time.time() + 60)
        outcomes = []

        async def post(store: PostgresTaskStore) -> None:
            task = new_task()
            outcomes.append(await store.create_task(task, created_event(queued_record(task)),
                                                    claim))

        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(post, (a, b)[i % 2])
        assert len({o.task.id for o in outcomes}) == 1
        assert sorted(o.replayed for o in outcomes) == [False] + [True] * 19


async def test_lost_lease_writes_nothing_and_expiry_is_recovered(url: str) -> None:
    # the lease is long and its expiry played on B's clock: a 0.5 s lease on the real
    # clock expired by itself when a loaded machine took that long to B's first look
    async with two_stores(url, lease_s=30) as (a, b):
        task_id = await create(a, "fail")
        assert (await a.claim_next(time.time())) is not None
        assert await a.transition(task_id, ("loading",), "running", now=1) is not None
        assert (await b.recover(recovery_finish, max_attempts=3, now=2)).failed == 0
        b.clock_offset_s = 31   # 31 s on, A has not renewed: its lease expired
        assert (await b.recover(recovery_finish, max_attempts=3, now=3)).failed == 1
        # A's late writes lose: the task is B's verdict
        assert await a.transition(task_id, ("running",), "succeeded", terminal(), now=4) is None
        assert await a.append_events(task_id, [], ("running",)) is None
        record = await b.get_task(task_id)
        assert record is not None and record.status == "failed"
        types = [e.type for e in await b.read_events(task_id, -1, 10)]
        assert types == ["response.created", "response.failed"]


async def test_renewal_keeps_the_lease(url: str) -> None:
    # time passes on the stores' clocks only: with a 0.5 s lease on the real clock, a
    # loaded machine taking that long from the last renewal to B's look expired it
    async with two_stores(url, lease_s=30) as (a, b):
        task_id = await create(a, "fail")
        await a.claim_next(time.time())
        for _ in range(4):   # 60 s on the database clock, past the 30 s lease
            a.clock_offset_s += 15
            b.clock_offset_s += 15
            owned, cancelling = await a.renew_leases()
            assert owned == {task_id} and not cancelling
        assert (await b.recover(recovery_finish, max_attempts=3, now=2)).failed == 0
        await b.request_cancel(task_id, terminal("response.cancelled"), now=3)
        assert (await a.renew_leases()) == ({task_id}, {task_id})


async def test_notices_reach_the_other_instance(url: str) -> None:
    async with two_stores(url) as (a, b):
        heard_b: list[tuple[str, str]] = []
        heard_a: list[tuple[str, str]] = []
        b.on_notify = lambda kind, task_id: heard_b.append((kind, task_id))
        a.on_notify = lambda kind, task_id: heard_a.append((kind, task_id))
        task_id = await create(a)
        await a.claim_next(time.time())
        await a.transition(task_id, ("loading",), "running", terminal("response.in_progress"),
                           now=1)
        await b.request_cancel(task_id, terminal("response.cancelled"), now=2)
        with anyio.fail_after(30):
            while ("e", task_id) not in heard_b or ("c", task_id) not in heard_a:
                await anyio.sleep(0.02)
        assert ("q", "") in heard_b
        assert all(kind != "c" for kind, _ in heard_b)   # its own notices are not echoed


@contextlib.asynccontextmanager
async def service_on(url: str, workspace: Path, max_running: int,
                     notices: bool, poll_s: float = 0.2) -> AsyncIterator[LmspService]:
    """An in-process instance; ``notices=False`` drops every NOTIFY (polling only)."""
    workspace.mkdir(exist_ok=True)
    store = PostgresTaskStore(url, lease_s=stores.TEST_LEASE_S, renew_s=stores.TEST_RENEW_S,
                              poll_s=poll_s)
    if not notices:
        store._deliver = lambda payload: None  # type: ignore[method-assign]
    async with Bridge(ReferenceAgentFactory(), workspace_cwd=str(workspace)) as bridge, \
            open_lmsp(bridge, state_dir=str(workspace), store=store,
                      max_running_tasks=max_running) as service:
        yield service


async def _create(service: LmspService, text: str) -> str:
    body = envelope(text)
    record, _ = await service.create_task(parse_task_envelope(body).request,
                                          on_restart="fail", key=None, route="t", caller=LOCAL_CALLER)
    return record.id


async def test_polling_alone_carries_events_work_and_cancels(url: str, tmp_path: Path) -> None:
    async with service_on(url, tmp_path / "a", 1, notices=False), \
            service_on(url, tmp_path / "b", 0, notices=False) as b:
        task_id = await _create(b, "/sleep 100ms /chunks 20 " + "w " * 40)   # runs on A
        stream = await b.open_events(task_id, None)
        assert stream is not None
        seqs: list[int] = []
        with anyio.fail_after(10):
            async for batch in stream:
                seqs.extend(e.seq for e in batch)
        assert seqs == list(range(len(seqs))) and len(seqs) > 20
        assert (await b.get_task(task_id)).status == "succeeded"
        long_id = await _create(b, "/sleep 120s long")   # ended by the cancel below
        with anyio.fail_after(30):
            while (await b.get_task(long_id)).status != "running":
                await anyio.sleep(0.05)
        assert (await b.cancel(long_id)).status == "cancelling"
        with anyio.fail_after(30):   # a hang bound: A's polling picks the cancel up
            while (await b.get_task(long_id)).status != "cancelled":
                await anyio.sleep(0.05)


@pytest.mark.parametrize("notices", [True, False], ids=["notices", "polling"])
async def test_wait_terminal_wakes_for_another_instances_commit(
        url: str, tmp_path: Path, notices: bool) -> None:
    """B waits for a task A runs: woken by A's notice alone (B polls once an hour), or
    by B's polling alone (notices dropped); ``wait_terminal`` itself never polls."""
    poll_s = 3600 if notices else 0.2
    async with service_on(url, tmp_path / "a", 1, notices=notices, poll_s=poll_s), \
            service_on(url, tmp_path / "b", 0, notices=notices, poll_s=poll_s) as b:
        task_id = await _create(b, "/sleep 100ms done")   # runs on A
        with anyio.fail_after(10):
            done = await b.wait_terminal(task_id)
        assert done.status == "succeeded"
        assert b.hub.watchers(task_id) == 0


async def test_open_lmsp_picks_postgres_from_the_url(url: str, tmp_path: Path) -> None:
    async with Bridge(ReferenceAgentFactory(), workspace_cwd=str(tmp_path)) as bridge, \
            open_lmsp(bridge, state_dir=str(tmp_path), store_url=url,
                      max_running_tasks=0) as service:
        assert isinstance(service.store, PostgresTaskStore)
        assert service.store.lease_s == 30 and service.store.renew_s == 10
        task_id = await _create(service, "x")
        assert (await service.get_task(task_id)).status == "queued"


async def test_a_dropped_writer_connection_is_replaced_and_its_batch_resent(url: str) -> None:
    """The server rolled back the batch of a killed backend: it is re-sent once on a new
    connection, so every create of that batch (bulk creates included) succeeds."""
    async with PostgresTaskStore(url) as store:
        pid = store._writers[0].info.backend_pid
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        outcomes: list[str] = []

        async def post() -> None:
            outcomes.append(await create(store))

        async with anyio.create_task_group() as tg:   # a batch, bulk creates included
            for _ in range(5):
                tg.start_soon(post)
        assert len(outcomes) == 5
        for task_id in outcomes:
            assert await store.get_task(task_id) is not None
        assert store._writers[0].info.backend_pid != pid
        assert store.health.up
