"""Several server instances on one PostgreSQL database: two real processes, A and B.

Create on A and stream on B; cancel on B what runs on A; SIGKILL A mid-task and B
recovers it by ``on_restart`` once the leases expire (and not before: A's renewals
keep its leases); identical idempotent creates split across A and B make one task.
Lease timings are the test ones (``tests.lmsp.stores``: 3 s lease, 0.5 s renewal).
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.lmsp import stores
from tests.harness import ServeProcess
from tests.lmsp.server import envelope

pytestmark = pytest.mark.anyio
FINAL = {"succeeded", "failed", "cancelled"}


class Instance:
    """``acp-server serve`` on the shared schema, reference agent, loopback."""

    def __init__(self, url: str, workspace: Path, max_running: int) -> None:
        workspace.mkdir(exist_ok=True)
        child = ServeProcess(workspace, "--store", url, "--max-running-tasks", str(max_running),
                             *stores.lease_flags()).start()
        self.proc, self.url = child.process, child.base_url
        self.client = httpx.AsyncClient(base_url=self.url, timeout=10)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


@pytest.fixture
def shared_url(tmp_path: Path) -> str:
    return stores.postgres_url_or_skip(tmp_path, "multi")


@pytest.fixture
def instances() -> Iterator[list[Instance]]:
    started: list[Instance] = []
    yield started
    for instance in started:
        instance.kill()


def start(instances: list[Instance], url: str, workspace: Path, max_running: int) -> Instance:
    instance = Instance(url, workspace, max_running)
    instances.append(instance)
    return instance


async def wait_status(client: httpx.AsyncClient, task_id: str, statuses: set[str],
                      timeout: float = 15) -> dict[str, Any]:
    with anyio.fail_after(timeout):
        while True:
            task = (await client.get(f"/lmsp/v1/tasks/{task_id}")).json()
            if task["status"] in statuses:
                return task  # type: ignore[no-any-return]
            await anyio.sleep(0.02)


async def lease(url: str, task_id: str) -> dict[str, Any]:
    """The task's ownership columns, read straight from the shared database."""
    import psycopg
    from psycopg.rows import dict_row

    def read() -> dict[str, Any]:
        with psycopg.connect(url, row_factory=dict_row) as conn:
            row = conn.execute("SELECT status, owner, attempt, lease_expires_at FROM tasks "
                               "WHERE id = %s", (task_id,)).fetchone()
        assert row is not None, task_id
        return row

    return await anyio.to_thread.run_sync(read)


async def wait_lease(url: str, task_id: str, ready: Callable[[dict[str, Any]], bool],
                     timeout: float = 15) -> dict[str, Any]:
    with anyio.fail_after(timeout):
        while not ready(row := await lease(url, task_id)):
            await anyio.sleep(0.05)
    return row


async def stream(client: httpx.AsyncClient, task_id: str) -> list[dict[str, Any]]:
    """Every event until the server closes the stream (after the terminal one)."""
    events: list[dict[str, Any]] = []
    async with client.stream("GET", f"/lmsp/v1/tasks/{task_id}/events",
                             timeout=20) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    return events


def check_log(events: list[dict[str, Any]], last: str) -> None:
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "response.created" and events[-1]["type"] == last


@pytest.mark.parametrize("anyio_backend", ["asyncio"])   # the servers are child processes
async def test_create_on_a_stream_on_b(tmp_path: Path, shared_url: str,
                                       instances: list[Instance]) -> None:
    a = start(instances, shared_url, tmp_path / "a", max_running=2)
    b = start(instances, shared_url, tmp_path / "b", max_running=0)   # B runs nothing
    task = (await a.client.post("/lmsp/v1/tasks", json=envelope(
        "/sleep 300ms /chunks 40 " + "word " * 80))).json()
    on_b = await stream(b.client, task["id"])        # connected while queued/running on A
    check_log(on_b, "response.completed")
    assert sum(e["type"] == "response.output_text.delta" for e in on_b) == 40
    assert on_b == await stream(a.client, task["id"])
    # B learns of A's tasks through the store; a cursor resumes there too
    tail = await b.client.get(f"/lmsp/v1/tasks/{task['id']}/events",
                              headers={"Last-Event-ID": "10"})
    assert [json.loads(x[6:])["sequence_number"] for x in tail.text.splitlines()
            if x.startswith("data: ")] == list(range(11, len(on_b)))


@pytest.mark.parametrize("anyio_backend", ["trio"])   # the servers are child processes
async def test_cancel_on_b_stops_the_task_on_a(tmp_path: Path, shared_url: str,
                                               instances: list[Instance]) -> None:
    a = start(instances, shared_url, tmp_path / "a", max_running=2)
    b = start(instances, shared_url, tmp_path / "b", max_running=0)
    task = (await a.client.post("/lmsp/v1/tasks", json=envelope("/sleep 120s long"))).json()
    await wait_status(b.client, task["id"], {"running"})
    response = await b.client.post(f"/lmsp/v1/tasks/{task['id']}/cancel")
    assert response.status_code == 200 and response.json()["status"] == "cancelling"
    done = await wait_status(b.client, task["id"], FINAL, timeout=60)   # not the 120 s prompt
    assert done["status"] == "cancelled"
    check_log(await stream(b.client, task["id"]), "response.cancelled")


@pytest.mark.parametrize("anyio_backend", ["asyncio"])   # the servers are child processes
async def test_sigkill_a_then_b_recovers_by_policy(tmp_path: Path, shared_url: str,
                                                   instances: list[Instance]) -> None:
    a = start(instances, shared_url, tmp_path / "a", max_running=2)
    ids = {}
    for policy in ("fail", "retry"):
        created = await a.client.post("/lmsp/v1/tasks", json=envelope(
            "/sleep 30s /chunks 2 long", on_restart=policy))
        ids[policy] = created.json()["id"]
    for task_id in ids.values():
        await wait_status(a.client, task_id, {"running"})
    b = start(instances, shared_url, tmp_path / "b", max_running=2)
    # A is alive: its renewals move every lease forward, so B takes nothing over
    first = {task_id: await lease(shared_url, task_id) for task_id in ids.values()}
    owner_a = first[ids["fail"]]["owner"]
    for task_id, row in first.items():
        await wait_lease(shared_url, task_id,
                         lambda now, was=row: now["lease_expires_at"] > was["lease_expires_at"])
        task = (await b.client.get(f"/lmsp/v1/tasks/{task_id}")).json()
        assert task["status"] == "running", task
        assert (await lease(shared_url, task_id))["owner"] == owner_a
    a.kill()   # mid-task: B recovers once the leases expire
    failed = await wait_status(b.client, ids["fail"], FINAL,
                               timeout=stores.TEST_LEASE_S + 2 * stores.TEST_RENEW_S + 10)
    assert failed["status"] == "failed" and failed["error"]["code"] == "server_restarted"
    check_log(await stream(b.client, ids["fail"]), "response.failed")
    # the retry task runs again: attempt 2, owned by B
    retried = await wait_lease(shared_url, ids["retry"],
                               lambda now: now["attempt"] == 2 and now["status"] == "running")
    assert retried["owner"] not in (None, owner_a)
    response = await b.client.post(f"/lmsp/v1/tasks/{ids['retry']}/cancel")
    assert response.status_code == 200
    done = await wait_status(b.client, ids["retry"], FINAL)
    assert done["status"] == "cancelled"
    events = await stream(b.client, ids["retry"])
    check_log(events, "response.cancelled")
    assert [e["type"] for e in events].count("response.in_progress") == 2


@pytest.mark.parametrize("anyio_backend", ["trio"])   # the servers are child processes
async def test_idempotent_creates_split_across_instances(tmp_path: Path, shared_url: str,
                                                         instances: list[Instance]) -> None:
    a = start(instances, shared_url, tmp_path / "a", max_running=0)
    b = start(instances, shared_url, tmp_path / "b", max_running=0)
    answers: list[tuple[int, str, str | None]] = []

    async def post(client: httpx.AsyncClient) -> None:
        response = await client.post("/lmsp/v1/tasks", json=envelope("same"),
                                     headers={"Idempotency-Key": "split"})
        answers.append((response.status_code, response.json()["id"],
                        response.headers.get("idempotent-replayed")))

    async with anyio.create_task_group() as tg:
        for i in range(20):
            tg.start_soon(post, (a.client, b.client)[i % 2])
    assert {s for s, _, _ in answers} == {202}, answers
    assert len({task_id for _, task_id, _ in answers}) == 1
    assert sorted(r or "" for _, _, r in answers) == [""] + ["true"] * 19
    import psycopg

    with psycopg.connect(shared_url) as conn:
        row = conn.execute("SELECT COUNT(*) FROM tasks").fetchone()
    assert row is not None and row[0] == 1
