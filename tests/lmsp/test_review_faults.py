"""LMSP faults found by review (helper-48, helper-50), over the in-process server:

* a 1 MiB body of bad input items is answered with at most 50 pointers, not 37 MB;
* requests with large metadata are not remembered by the echo cache (GBs of keys);
* an unknown model's name is echoed cut, as ids are;
* a create whose commit outlived the idempotency wait (409) still runs: the idle
  runner claims again by itself, and the key's replay wakes it;
* an event stream whose remaining events are purged (retention) ends instead of
  sending keep-alives for ever, and one whose task ended between two of its reads
  does not take that for a purge.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import anyio
import pytest

from acp_server.lmsp import LmspConfig
from acp_server.lmsp import responses as lmsp_responses
from acp_server.lmsp.problems import MAX_ERROR_POINTERS
from tests.lmsp.server import FakeClock, envelope, running_lmsp

pytestmark = pytest.mark.anyio


async def test_a_body_of_bad_items_gets_a_bounded_answer(tmp_path: Path) -> None:
    async with running_lmsp(tmp_path) as srv:
        body = json.dumps({"model": "reference", "input": [1] * 300_000}).encode()
        answer = await srv.client.post("/lmsp/v1/responses", content=body,
                                       headers={"Content-Type": "application/json"})
        assert answer.status_code == 400
        assert len(answer.content) < 20_000
        errors = answer.json()["errors"]
        assert len(errors) == MAX_ERROR_POINTERS
        assert errors[0]["pointer"] == "/input/0"
        assert errors[-1]["detail"] == f"... and {300_000 - 49} more problems like these."


async def test_large_requests_are_not_kept_by_the_echo_cache(tmp_path: Path) -> None:
    lmsp_responses._echo_of.cache_clear()
    async with running_lmsp(tmp_path) as srv:
        big = {"note": "x" * 100_000}
        answer = await srv.client.post("/lmsp/v1/responses", json={
            "model": "reference", "input": "hi", "metadata": big, "background": True})
        assert answer.status_code == 200, answer.text
        assert answer.json()["metadata"] == big   # still echoed
        small = await srv.client.post("/lmsp/v1/responses", json={
            "model": "reference", "input": "hi", "metadata": {"a": "b"}, "background": True})
        assert small.json()["metadata"] == {"a": "b"}
    assert lmsp_responses._echo_of.cache_info().currsize == 1   # the small one only


async def test_an_unknown_models_name_is_echoed_cut(tmp_path: Path) -> None:
    async with running_lmsp(tmp_path) as srv:
        answer = await srv.client.post("/lmsp/v1/responses", json={
            "model": "m" * 100_000, "input": "hi"})
        assert answer.status_code == 404
        assert answer.json()["code"] == "model_not_found"
        assert len(answer.content) < 2_000


async def test_a_create_that_timed_out_still_runs(tmp_path: Path) -> None:
    async with running_lmsp(tmp_path, config=LmspConfig(idempotency_wait_s=0.2)) as srv:
        store = srv.service.store
        held = anyio.Event()

        def busy(conn: object, out: object) -> None:   # a slow fsync, a lock held
            while not held.is_set():
                time.sleep(0.01)

        async with anyio.create_task_group() as tg:
            tg.start_soon(store._write, busy)
            first = await srv.client.post("/lmsp/v1/tasks", json=envelope("late"),
                                          headers={"Idempotency-Key": "late-1"})
            assert first.status_code == 409   # the commit outlived the wait
            held.set()
        # nobody retries and nothing else happens: it lands, and runs anyway
        found: list[dict[str, object]] = []
        with anyio.fail_after(20):
            while not found:
                tasks = (await srv.client.get("/lmsp/v1/tasks")).json()["data"]
                found = [t for t in tasks if t["input_text"] == "late"]
                await anyio.sleep(0.02)
        done = await srv.wait(str(found[0]["id"]), timeout=30)
        assert done["status"] == "succeeded"


async def test_a_stream_whose_events_are_purged_ends(tmp_path: Path) -> None:
    clock = FakeClock()
    config = LmspConfig(clock=clock, purge_interval_s=3600)
    async with running_lmsp(tmp_path, config=config) as srv:
        task = await srv.create("/chunks 600 " + "word " * 1000)
        await srv.wait(task["id"])
        stream = await srv.service.open_events(task["id"], None)
        assert stream is not None
        first = await stream.__anext__()
        assert first and first[-1].type != "response.completed"
        clock.advance(config.event_retention_s + 1)
        assert await srv.service.purge_once() > 0
        with anyio.fail_after(20):
            rest = [batch async for batch in stream]
        assert all(batch == [] for batch in rest[:-1]) or not rest   # no events, and an end
        again = await srv.client.get(f"/lmsp/v1/tasks/{task['id']}/events",
                                     headers={"Last-Event-ID": str(first[-1].seq)})
        assert again.status_code == 410


async def test_the_listing_leaves_tasks_past_retention_out_of_its_pages(
        tmp_path: Path) -> None:
    clock = FakeClock()
    config = LmspConfig(clock=clock, purge_interval_s=3600)
    async with running_lmsp(tmp_path, config=config) as srv:
        old = await srv.create("old")
        await srv.wait(old["id"])
        clock.advance(config.task_retention_s - 10)
        new = await srv.create("new")
        await srv.wait(new["id"])
        clock.advance(20)   # the old one is past retention, not yet purged
        page = (await srv.client.get("/lmsp/v1/tasks", params={"limit": 1})).json()
        assert [t["id"] for t in page["data"]] == [new["id"]]
        assert page["has_more"] is False   # the old one is no page's
        older = (await srv.client.get("/lmsp/v1/tasks",
                                      params={"after": new["id"]})).json()
        assert older["data"] == [] and older["first_id"] is None


async def test_a_retry_gets_its_task_even_when_its_checks_would_now_refuse_it(
        tmp_path: Path) -> None:
    """§9.2: same key, same body, the same task; here after the previous response it
    continued was deleted (the check alone would answer 404)."""
    async with running_lmsp(tmp_path) as srv:
        first = await srv.client.post("/lmsp/v1/responses", json={
            "model": "reference", "input": "one"})
        assert first.status_code == 200, first.text
        body = {"model": "reference", "input": "two",
                "previous_response_id": first.json()["id"]}
        key = {"Idempotency-Key": "continue-1"}
        second = await srv.client.post("/lmsp/v1/responses", json=body, headers=key)
        assert second.status_code == 200, second.text
        deleted = await srv.client.delete(f"/lmsp/v1/responses/{first.json()['id']}")
        assert deleted.status_code == 200
        again = await srv.client.post("/lmsp/v1/responses", json=body, headers=key)
        assert again.status_code == 200, again.text
        assert again.headers["idempotent-replayed"] == "true"
        assert again.json()["id"] == second.json()["id"]
        fresh = await srv.client.post("/lmsp/v1/responses", json=body)   # no key: checked
        assert fresh.status_code == 404
        assert fresh.json()["code"] == "response_not_found"


async def test_a_key_never_outlives_its_task(tmp_path: Path) -> None:
    """A task past retention (not purged yet) is gone, and so is its key: the same key
    and body make a new task; another body is not 422 for a key that is gone."""
    clock = FakeClock()
    config = LmspConfig(clock=clock, purge_interval_s=3600, task_retention_s=60,
                        idempotency_ttl_s=3600)
    async with running_lmsp(tmp_path, config=config) as srv:
        key = {"Idempotency-Key": "k-1"}
        first = await srv.create("same", headers=key)
        await srv.wait(first["id"])
        clock.advance(120)   # past the task's retention, within the key's TTL
        assert (await srv.client.get(f"/lmsp/v1/tasks/{first['id']}")).status_code == 404
        again = await srv.client.post("/lmsp/v1/tasks", json=envelope("same"), headers=key)
        assert again.status_code == 202, again.text
        assert again.json()["id"] != first["id"] and "idempotent-replayed" not in again.headers
        other = await srv.client.post("/lmsp/v1/tasks", json=envelope("other"),
                                      headers={"Idempotency-Key": "k-1"})
        assert other.status_code == 422   # the new task's key is live: reused


async def test_a_stream_whose_task_ends_between_two_reads_gets_its_last_events(
        tmp_path: Path) -> None:
    """A read that finds nothing new, then the task found finished: its last events were
    committed in between (it runs on another instance, or a notice came late). The
    stream reads them; it used to end there, as if they had been purged (a CI flake of
    tests/lmsp/test_multi_instance.py: B's stream ended after response.in_progress)."""
    async with running_lmsp(tmp_path) as srv:
        task = await srv.create("/chunks 600 " + "word " * 1000)
        await srv.wait(task["id"])
        store = srv.service.store
        real_read = store.read_events
        calls: list[int] = []

        async def read_events(task_id: str, after: int, limit: int) -> list[object]:
            calls.append(after)
            if len(calls) == 2:   # the second page, read before its commit
                return []
            return await real_read(task_id, after, limit)

        store.read_events = read_events   # type: ignore[method-assign]
        stream = await srv.service.open_events(task["id"], None)
        assert stream is not None
        with anyio.fail_after(20):
            events = [event async for batch in stream for event in batch]
        assert len(calls) > 2
        assert [e.seq for e in events] == list(range(len(events)))
        assert events[-1].type == "response.completed"
