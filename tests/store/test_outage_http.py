"""A store outage over real HTTP, on both stores (the fault-injecting wrapper, so the
fault comes and goes exactly when the test says): 503s in the door's shape, health
says down, nothing acknowledged is lost, work resumes by itself."""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from datetime import datetime
from pathlib import Path

import anyio
import psycopg
import pytest
from httpx_sse import aconnect_sse

from acp_server.acp_http.errors import to_rpc_error
from acp_server.rest.errors import describe
from acp_server.store.errors import StoreUnavailableError
from tests.agents.held import HeldAgent
from tests.lmsp.server import envelope, running_lmsp
from tests.store.faults import faulty

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("store_name")]


async def _until(condition: object, timeout: float = 10) -> None:
    with anyio.fail_after(timeout):
        while not condition():  # type: ignore[operator]
            await anyio.sleep(0.01)


def _assert_503(response: object) -> None:
    assert response.status_code == 503, response.text  # type: ignore[attr-defined]
    assert response.headers["retry-after"] == "5"  # type: ignore[attr-defined]
    assert response.headers["content-type"] == "application/problem+json"  # type: ignore
    body = response.json()  # type: ignore[attr-defined]
    assert body["code"] == "store_unavailable" and body["status"] == 503
    assert body["type"].endswith("/store_unavailable")


async def test_an_outage_answers_503_and_the_running_task_finishes_after(
        tmp_path: Path) -> None:
    store = faulty(tmp_path)
    async with running_lmsp(tmp_path, store=store) as server:
        client = server.client
        store.faults.on_at("succeeded")   # the agent's turn ends while the store is down
        task = await server.create("/sleep 300ms still here")
        await _until(lambda: store.faults.active)
        bridge = server.service.runner.models["reference"][0]
        # the agent's turn ends while the store is down: the runner keeps trying
        await _until(lambda: bridge.stats().active_prompts == 0)
        refused = store.faults.refused_writes
        await _until(lambda: store.faults.refused_writes > refused + 1)
        _assert_503(await client.post("/lmsp/v1/tasks", json=envelope("lost?")))
        _assert_503(await client.post("/lmsp/v1/responses",
                                      json={"model": "reference", "input": "x"}))
        _assert_503(await client.get(f"/lmsp/v1/tasks/{task['id']}"))
        _assert_503(await client.get("/lmsp/v1/tasks"))
        health = await client.get("/health", params={"deep": "1"})
        assert health.status_code == 503
        assert health.json()["status"] == "unavailable"
        assert health.json()["store"]["status"] == "down"
        assert health.json()["store"]["reason"]
        # a time as the REST door writes every other (it was epoch seconds, a float)
        since = health.json()["store"]["downSince"]
        assert isinstance(since, str) and since.endswith("Z"), since
        assert abs(datetime.fromisoformat(since).timestamp() - time.time()) < 60
        assert (await client.get("/health")).status_code == 200   # liveness stays
        store.faults.off()
        done = await server.wait(task["id"])
        assert done["status"] == "succeeded"
        assert "still here" in done["response"]["output"][0]["content"][0]["text"]
        listed = (await client.get("/lmsp/v1/tasks")).json()["data"]
        assert [t["id"] for t in listed] == [task["id"]]   # the refused create left nothing
        health = await client.get("/health", params={"deep": "1"})
        assert health.status_code == 200 and health.json()["store"] == {"status": "ok"}
        again = await server.create("after")
        assert (await server.wait(again["id"]))["status"] == "succeeded"


async def test_queued_work_starts_by_itself_when_the_store_is_back(tmp_path: Path) -> None:
    store = faulty(tmp_path)
    async with running_lmsp(tmp_path, store=store, max_running_tasks=1) as server:
        first = await server.create("/sleep 200ms first")
        second = await server.create("second")     # queued behind the first
        store.faults.on_at("succeeded")   # the first's end (or the second's) is refused
        await _until(lambda: store.faults.active)
        refused = store.faults.refused_writes
        await _until(lambda: store.faults.refused_writes > refused + 2)
        store.faults.off()
        for task in (first, second):
            assert (await server.wait(task["id"]))["status"] == "succeeded"


async def test_an_event_stream_waits_out_the_outage(tmp_path: Path) -> None:
    # the turn waits in the agent until the stream is open (its first frame read): a
    # 300 ms turn could reach the outage first on a loaded machine (the stream's open
    # then answered 503)
    store, agent = faulty(tmp_path), HeldAgent()
    async with running_lmsp(tmp_path, store=store, agent_factory=agent) as server:
        store.faults.on_at("succeeded")   # the turn ends while the store is down
        task = await server.create("streamed")
        async with anyio.create_task_group() as tg:
            frames: list[tuple[str, str, object]] = []
            opened = anyio.Event()

            async def read() -> None:
                path = f"/lmsp/v1/tasks/{task['id']}/events"
                with anyio.fail_after(30):
                    async with aconnect_sse(server.client, "GET", path) as source:
                        assert source.response.status_code == 200
                        async for sse in source.aiter_sse():
                            if sse.data:
                                frames.append((sse.id, sse.event, json.loads(sse.data)))
                                opened.set()

            tg.start_soon(read)
            with anyio.fail_after(30):
                await opened.wait()
            (await agent.arrived(1)).release()
            await _until(lambda: store.faults.active)
            refused = store.faults.refused_reads + store.faults.refused_writes
            await _until(lambda: store.faults.refused_writes + store.faults.refused_reads
                         > refused + 2)
            store.faults.off()
        kinds = [event for _, event, _ in frames]
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
        numbers = [int(i) for i, _, _ in frames]
        assert numbers == list(range(len(numbers)))   # no gap, no duplicate


def test_every_door_maps_the_outage_to_its_own_503() -> None:
    exc = StoreUnavailableError("PostgreSQL: the database system is shutting down")
    status, body, headers = describe(exc)
    assert (status, body["code"], headers) == (503, "store_unavailable", {"Retry-After": "5"})
    assert "shutting down" not in body["error"]   # the reason stays with the operator
    code, _, data = to_rpc_error(exc)
    assert code == -32603 and data is not None
    assert data["errorKind"] == "store_unavailable" and data["retryable"] is True




@pytest.mark.parametrize("engine_error", [
    sqlite3.IntegrityError("CHECK constraint failed"),
    psycopg.errors.ProgramLimitExceeded("index row size 9000 exceeds btree maximum"),
    psycopg.errors.RaiseException("refused by a trigger"),
], ids=["sqlite", "pg-class-54", "pg-trigger"])
def test_every_door_answers_a_refused_write_as_the_outage(
        engine_error: Exception, caplog: pytest.LogCaptureFixture) -> None:
    """A write the store refuses for good (``ENGINE_ERRORS``) that reaches a door: REST's
    503 and ``/acp``'s ``store_unavailable`` alike (``/acp`` answered ``internal``, its
    500, where REST and LMSP answer 503), logged as a refusal, its text not sent."""
    caplog.set_level(logging.WARNING)
    status, body, headers = describe(engine_error)
    assert (status, body["code"], headers) == (503, "store_unavailable", {"Retry-After": "5"})
    code, message, data = to_rpc_error(engine_error)
    assert code == -32603 and data is not None
    assert data == {"errorKind": "store_unavailable", "retryable": True,
                    "retryAfterSeconds": 5}
    assert str(engine_error) not in message
    refusals = [r.getMessage() for r in caplog.records if "refused the write" in r.getMessage()]
    assert len(refusals) == 2 and all(str(engine_error) in r for r in refusals)
