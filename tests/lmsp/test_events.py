"""Event streams (§6.4/§7.4): replay then live, resumption, 204, 400, 410, framing."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
from httpx_sse import aconnect_sse

from acp_server.lmsp import LmspConfig
from tests.agents.held import HeldAgent
from tests.lmsp.server import FakeClock, LmspServer, problem_of, running_lmsp

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("store_name")]


def _check_numbering(frames: list[tuple[str, str, dict]], start: int = 0) -> None:
    assert [int(f[0]) for f in frames] == list(range(start, start + len(frames)))
    for sse_id, event, data in frames:
        assert data["sequence_number"] == int(sse_id) and data["type"] == event
        assert "error" not in data


async def test_raw_framing(server: LmspServer) -> None:
    task = await server.create("/chunks 1 hi")
    await server.wait(task["id"])
    response = await server.client.get(f"/lmsp/v1/tasks/{task['id']}/events")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["cache-control"] == "no-cache, no-transform"
    text = response.text
    assert text.startswith("retry: 3000\nid: 0\nevent: response.created\ndata: {")
    assert text.endswith("}\n\n") and text.count("event: response.completed") == 1


async def test_late_subscriber_gets_everything_then_live(tmp_path: Path) -> None:
    # The turn waits in the agent until the subscriber read the replayed head: the task
    # is running when it joins (its 'running' commit comes FLUSH_S after the prompt
    # while the turn is in the agent) and its deltas and end arrive live, however loaded
    # the machine (a 300 ms turn could be over before a poll saw 'running', or before
    # that commit: it then went loading -> succeeded at once).
    agent = HeldAgent()
    frames: list[tuple[str, str, dict]] = []
    async with running_lmsp(tmp_path, agent_factory=agent) as server:
        task = await server.create("/chunks 40 " + "word " * 60)
        await server.wait(task["id"], {"running"})

        async def subscribe() -> None:
            with anyio.fail_after(20):
                async with aconnect_sse(server.client, "GET",
                                        f"/lmsp/v1/tasks/{task['id']}/events") as source:
                    async for sse in source.aiter_sse():
                        if sse.data:
                            frames.append((sse.id, sse.event, json.loads(sse.data)))

        async with anyio.create_task_group() as tg:
            tg.start_soon(subscribe)
            with anyio.fail_after(10):
                while not frames:   # the head, replayed
                    await anyio.sleep(0.01)
            # the head only (the turn has not begun): the deltas and the end come live
            assert {f[1] for f in frames} <= {"response.created", "response.in_progress"}
            (await agent.arrived(1)).release()
    _check_numbering(frames)
    types = [f[1] for f in frames]
    assert types[0] == "response.created" and types[-1] == "response.completed"
    assert types.count("response.output_text.delta") == 40
    text = "".join(f[2]["delta"] for f in frames if f[1] == "response.output_text.delta")
    assert text == frames[-1][2]["response"]["output"][0]["content"][0]["text"]


async def test_concurrent_subscribers_see_the_same_stream(server: LmspServer) -> None:
    task = await server.create("/sleep 200ms /chunks 100 " + "x " * 200)
    results: list[list[tuple[str, str, dict]]] = []

    async def subscribe() -> None:
        results.append(await server.events(task["id"]))

    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(subscribe)
    assert len(results) == 5
    for frames in results:
        _check_numbering(frames)
        assert frames == results[0]


async def test_resumption_cursors(server: LmspServer) -> None:
    task = await server.create("/chunks 5 a b c d e")
    await server.wait(task["id"])
    full = await server.events(task["id"])
    last = int(full[-1][0])
    by_header = await server.events(task["id"], headers={"Last-Event-ID": "3"})
    assert by_header == full[4:]
    by_query = await server.events(task["id"], params={"starting_after": "5"})
    assert by_query == full[6:]
    both = await server.events(task["id"], headers={"Last-Event-ID": "7"},
                               params={"starting_after": "1"})
    assert both == full[8:]   # the header wins
    for cursor in (str(last), ):
        response = await server.client.get(f"/lmsp/v1/tasks/{task['id']}/events",
                                           headers={"Last-Event-ID": cursor})
        assert response.status_code == 204 and response.content == b""


async def test_resume_mid_stream_no_gaps_no_duplicates(server: LmspServer) -> None:
    task = await server.create("/sleep 200ms /chunks 30 " + "y " * 60)
    first = await server.events(task["id"], limit=3)
    rest = await server.events(task["id"], headers={"Last-Event-ID": first[-1][0]})
    _check_numbering(first + rest)
    assert rest[-1][1] == "response.completed"


@pytest.mark.parametrize(("headers", "params", "param"), [
    ({"Last-Event-ID": "-1"}, None, "Last-Event-ID"),
    ({"Last-Event-ID": "abc"}, None, "Last-Event-ID"),
    (None, {"starting_after": "1.5"}, "starting_after"),
    (None, {"starting_after": "99"}, "starting_after"),
    ({"Last-Event-ID": "99"}, None, "Last-Event-ID"),
])
async def test_bad_or_future_cursor_is_400(tmp_path: Path, headers: dict | None,
                                           params: dict | None, param: str) -> None:
    async with running_lmsp(tmp_path, max_running_tasks=0) as srv:
        task = await srv.create("x")
        response = await srv.client.get(f"/lmsp/v1/tasks/{task['id']}/events", headers=headers,
                                        params=params)
        assert response.status_code == 400
        body = response.json()
        assert body["code"] == "invalid_request" and body["param"] == param


async def test_live_stream_of_a_queued_task_starts_at_created(tmp_path: Path) -> None:
    async with running_lmsp(tmp_path, max_running_tasks=0) as srv:
        task = await srv.create("x")
        frames = await srv.events(task["id"], limit=1)
        assert frames[0][:2] == ("0", "response.created")
        async with srv.client.stream("GET", f"/lmsp/v1/tasks/{task['id']}/events",
                                     headers={"Last-Event-ID": "0"}) as response:
            assert response.status_code == 200   # open, waiting for more


async def test_live_subscriber_receives_the_cancel(tmp_path: Path) -> None:
    async with running_lmsp(tmp_path, max_running_tasks=0) as srv:
        task = await srv.create("x")
        got: list = []
        with anyio.fail_after(10):
            async with aconnect_sse(srv.client, "GET",
                                    f"/lmsp/v1/tasks/{task['id']}/events") as source:
                async for sse in source.aiter_sse():
                    if not sse.data:
                        continue
                    got.append(sse.event)
                    if sse.event == "response.created":   # subscribed: now cancel
                        await srv.client.post(f"/lmsp/v1/tasks/{task['id']}/cancel")
        assert got == ["response.created", "response.cancelled"]


async def test_retention_410_then_404(tmp_path: Path) -> None:
    clock = FakeClock()   # the purge runs when the test says, on the test's clock
    config = LmspConfig(event_retention_s=0.3, task_retention_s=0.8, purge_interval_s=3600,
                        clock=clock)
    async with running_lmsp(tmp_path, config=config) as srv:
        task = await srv.create("x")
        await srv.wait(task["id"])
        clock.advance(0.5)
        await srv.service.purge_once()
        response = await srv.client.get(f"/lmsp/v1/tasks/{task['id']}/events")
        assert response.status_code == 410
        assert response.headers["x-should-retry"] == "false"
        assert problem_of(response) == {
            "type": "https://lmsp.invalid/problems/event_history_expired",
            "title": "Event history expired", "status": 410,
            "detail": f"The events of task {task['id']} are older than the retention period.",
            "instance": f"/lmsp/v1/tasks/{task['id']}/events", "code": "event_history_expired",
            "task_id": task["id"], "earliest_sequence_number": None, "retention_seconds": 0}
        assert (await srv.get(task["id"]))["status"] == "succeeded"
        assert await srv.service.store.read_events(task["id"], -1, 10) == []
        clock.advance(0.6)
        await srv.service.purge_once()
        response = await srv.client.get(f"/lmsp/v1/tasks/{task['id']}")
        assert response.status_code == 404 and response.json()["code"] == "task_not_found"
        assert await srv.service.store.get_task(task["id"]) is None


async def test_retention_is_judged_by_the_clock_before_the_purge(tmp_path: Path) -> None:
    clock = FakeClock()
    config = LmspConfig(event_retention_s=0.3, task_retention_s=0.8, purge_interval_s=3600,
                        clock=clock)
    async with running_lmsp(tmp_path, config=config) as srv:
        task = await srv.create("x")
        await srv.wait(task["id"])
        clock.advance(0.5)
        response = await srv.client.get(f"/lmsp/v1/tasks/{task['id']}/events")
        assert response.status_code == 410
        assert len(await srv.service.store.read_events(task["id"], -1, 10)) > 0   # not purged
        clock.advance(0.6)
        response = await srv.client.get(f"/lmsp/v1/tasks/{task['id']}")
        assert response.status_code == 404
        assert await srv.service.store.get_task(task["id"]) is not None


async def test_the_purge_runs_every_interval(tmp_path: Path) -> None:
    clock = FakeClock()
    config = LmspConfig(event_retention_s=0.3, task_retention_s=0.8, purge_interval_s=0.01,
                        clock=clock)
    async with running_lmsp(tmp_path, config=config) as srv:
        task = await srv.create("x")
        await srv.wait(task["id"])
        clock.advance(1.0)
        with anyio.fail_after(10):   # the background purge deletes it within an interval
            while await srv.service.store.get_task(task["id"]) is not None:
                await anyio.sleep(0.01)


async def test_the_purge_runs_at_start(tmp_path: Path) -> None:
    """A server restarting more often than the interval still purges: the first purge
    runs as it starts, on the same store."""
    clock = FakeClock()
    config = LmspConfig(event_retention_s=0.3, task_retention_s=0.8, purge_interval_s=3600,
                        clock=clock)
    async with running_lmsp(tmp_path, config=config) as srv:
        task = await srv.create("x")
        await srv.wait(task["id"])
    clock.advance(1.0)
    async with running_lmsp(tmp_path, config=config) as srv:
        with anyio.fail_after(10):   # a bound: the purge at start deletes it
            while await srv.service.store.get_task(task["id"]) is not None:
                await anyio.sleep(0.01)


async def test_keep_alive_comment(tmp_path: Path) -> None:
    async with running_lmsp(tmp_path, max_running_tasks=0,
                            config=LmspConfig(keepalive_s=0.1)) as srv:
        task = await srv.create("x")
        chunks = b""
        with anyio.fail_after(10):  # a bound, not the expectation: it ends at the first comment
            async with srv.client.stream("GET", f"/lmsp/v1/tasks/{task['id']}/events") as r:
                async for chunk in r.aiter_bytes():
                    chunks += chunk
                    if b": keep-alive" in chunks:
                        break
        assert b": keep-alive\n" in chunks
        assert b": keep-alive\n\n" not in chunks   # a comment line, never a data-less frame


async def test_text_deltas_are_batched(server: LmspServer) -> None:
    store = server.service.store
    before = store.commits
    task = await server.create("/chunks 300 " + "z " * 300)
    await server.wait(task["id"])
    commits = store.commits - before
    frames = await server.events(task["id"])
    assert sum(f[1] == "response.output_text.delta" for f in frames) == 300
    assert commits <= 4 + 300 // 64 + 2, commits   # create, claim, running, final + batches
