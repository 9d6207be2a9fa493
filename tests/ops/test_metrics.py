"""``GET /metrics``: the scripted scenario read back through ``prometheus_client.parser``,
the auth rule of ``/health``, and the task gauge on PostgreSQL (cached).

Real HTTP over loopback (uvicorn under asyncio, hypercorn under trio), the reference
agent, the LMSP store on SQLite (PostgreSQL when ``ACP_SERVER_TEST_POSTGRES`` is set).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from acp_server.server import Server
from bridge import Bridge, BridgeOptions
from tests.agents.held import HeldAgent
from tests.harness import local_server
from tests.lmsp import stores
from tests.rest.server import text_prompt

pytestmark = pytest.mark.anyio
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


@contextlib.asynccontextmanager
async def daemon(workspace: Path, *, store_url: str | None = None, **settings: Any
                 ) -> AsyncIterator[tuple[httpx.AsyncClient, Bridge, Server]]:
    async with local_server(workspace, metrics_task_ttl_s=0, store=store_url,
                            options=BridgeOptions(max_pending_prompts_per_session=5),
                            **settings) as srv:
        yield srv.client, srv.bridge, srv.server


async def scrape(client: httpx.AsyncClient, **headers: str) -> Samples:
    response = await client.get("/metrics", headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return parse(response.text)


async def run_task(client: httpx.AsyncClient, held: HeldAgent | None = None) -> str:
    """A task, to its end. With ``held`` (the server's agent), its turn is let go only
    once the task is ``running``: a turn that ends within the runner's first flush
    (50 ms) commits ``loading`` → ``succeeded`` at once, one that does not (a loaded
    machine) commits ``running`` between, so what is counted is the test's choice."""
    created = await client.post("/lmsp/v1/tasks", json={
        "type": "response", "input": {"model": "reference", "input": "hello"}})
    assert created.status_code == 202, created.text
    task_id = created.json()["id"]
    if held is not None:
        turn = await held.arrived(len(held.turns) + 1)
        with anyio.fail_after(30):   # a hang bound: the opening commit is FLUSH_S away
            while (await client.get(f"/lmsp/v1/tasks/{task_id}")).json()["status"] != "running":
                await anyio.sleep(0.01)
        turn.release()
    with anyio.fail_after(10):   # the stream closes after the terminal event
        async with client.stream("GET", f"/lmsp/v1/tasks/{task_id}/events") as events:
            async for _ in events.aiter_bytes():
                pass
    assert (await client.get(f"/lmsp/v1/tasks/{task_id}")).json()["status"] == "succeeded"
    return task_id


async def test_the_scripted_scenario(tmp_path: Path) -> None:
    # The in-memory journal: its bus pushes at publish, so the reader that never reads
    # overflows during the turn, deterministically (a journaled bus feeds readers from
    # its ring and evicts one only when a publisher waits for it in vain).
    held = HeldAgent(hold=lambda text: text == "hello")       # the task's turn only
    async with daemon(tmp_path, session_journal="memory", agent_factory=held) as (
            client, bridge, _app):
        await run_task(client, held)                             # 1 accepted (the task's turn)
        sid = (await client.post("/session", json={})).json()["sessionId"]
        slow_reader = bridge.subscribe(sid, max_queued=16)      # never read: evicted
        ticket = bridge.send_prompt(sid, [{"type": "text", "text": "/chunks 40 x"}])
        with anyio.fail_after(10):
            await ticket                                         # 2 accepted
        assert slow_reader.evicted_reason is not None
        for _ in range(5):                                       # 1 running + 4 queued
            assert (await client.post(f"/session/{sid}/prompt",
                                      json=text_prompt("/sleep 30s hold"))).status_code == 202
        refused = await client.post(f"/session/{sid}/prompt", json=text_prompt("one too many"))
        assert refused.status_code == 503

        samples = await scrape(client)
    admissions = "acp_server_prompt_admissions_total"
    assert value(samples, admissions, outcome="accepted") == 7    # 5 REST + chunks + task
    assert value(samples, admissions, outcome="rejected") == 1
    assert value(samples, "acp_server_prompts_pending") == 5
    assert value(samples, "acp_server_prompts_running") == 1
    assert value(samples, "acp_server_prompts_queued") == 4
    # the REST session, and the task's: a completed response keeps its ACP session
    # for a continuation (previous_response_id, LmspConfig.live_sessions)
    assert value(samples, "acp_server_sessions") == 2
    assert value(samples, "acp_server_sse_evictions_total") == 1
    assert value(samples, "acp_server_lmsp_tasks", status="succeeded") == 1
    assert value(samples, "acp_server_lmsp_tasks", status="queued") == 0
    # the task's turn was held until it ran (run_task): each of its transitions once
    for status in ("queued", "loading", "running", "succeeded"):
        assert value(samples, "acp_server_lmsp_task_transitions_total", to=status) == 1
    assert value(samples, "acp_server_lmsp_task_transitions_total", to="failed") == 0
    prompt = "/session/{session_id}/prompt"
    http = "acp_server_http_requests_total"
    assert value(samples, http, door="rest", route=prompt, status="202") == 5
    assert value(samples, http, door="rest", route=prompt, status="503") == 1
    assert value(samples, http, door="lmsp", route="/lmsp/v1/tasks", status="202") == 1
    assert value(samples, "acp_server_http_request_duration_seconds_count",
                 door="rest", route=prompt) == 6
    # waits: the task's turn, the chunks turn, the first sleeper; two turns ended
    assert value(samples, "acp_server_prompt_queue_wait_seconds_count") == 3
    assert value(samples, "acp_server_turn_duration_seconds_count", stop_reason="end_turn") == 2
    assert value(samples, "acp_server_sse_subscribers", door="lmsp") == 0
    assert value(samples, "acp_server_acp_connections", transport="http") == 0
    assert ("process_resident_memory_bytes", frozenset()) in samples
    assert not any("session_id" in dict(labels) or sid in str(labels) for _, labels in samples)


async def test_open_streams_and_acp_connections_are_gauges(tmp_path: Path) -> None:
    async with daemon(tmp_path) as (client, _bridge, _app):
        sid = (await client.post("/session", json={})).json()["sessionId"]
        init = await client.post("/acp", json={"jsonrpc": "2.0", "id": 0, "method": "initialize",
                                               "params": {"protocolVersion": 1}})
        assert init.status_code == 200
        async with client.stream("GET", f"/session/{sid}/events") as stream:
            assert stream.status_code == 200
            samples = await scrape(client)
        assert value(samples, "acp_server_sse_subscribers", door="rest") == 1
        assert value(samples, "acp_server_acp_connections", transport="http") == 1
        assert value(samples, "acp_server_http_requests_total", door="acp", route="/acp",
                     status="200") == 1


async def test_the_store_commits_are_counted_by_whether_they_were_synced(
        tmp_path: Path) -> None:
    """A session's prompts are journaled in SQLite commits not flushed to the disk
    (``synced="false"``); a task (always durable) is a synced one."""
    async with daemon(tmp_path) as (client, bridge, server):
        sid = (await client.post("/session", json={"sessionScope": "thread"})).json()[
            "sessionId"]
        sent = await client.post(f"/session/{sid}/prompt", json=text_prompt("hi"))
        assert sent.status_code == 202
        with anyio.fail_after(10):
            while bridge.session_status(sid).pending_prompts:
                await anyio.sleep(0.01)
        before = await scrape(client)
        unsynced = value(before, "acp_server_store_commits_total", synced="false")
        synced = value(before, "acp_server_store_commits_total", synced="true")
        assert unsynced >= 1
        await run_task(client)
        after = await scrape(client)
        assert value(after, "acp_server_store_commits_total", synced="true") > synced
        store = server.lmsp.store   # type: ignore[attr-defined]
        assert value(after, "acp_server_store_commits_total", synced="true") + value(
            after, "acp_server_store_commits_total", synced="false") <= store.commits


async def test_an_agent_restart_is_counted(tmp_path: Path) -> None:
    import sys

    from bridge.agents.stdio import StdioAgentFactory

    factory = StdioAgentFactory([sys.executable, "-m", "bridge.agents.reference"], name="ref")
    async with local_server(tmp_path, agent_factory=factory) as srv:
        client = srv.client
        sid = (await client.post("/session", json={})).json()["sessionId"]
        ticket = srv.bridge.send_prompt(sid, [{"type": "text", "text": "/crash"}])
        with anyio.fail_after(10), contextlib.suppress(Exception):
            await ticket
        assert (await client.post("/session", json={})).status_code == 200   # restarts
        samples = await scrape(client)
    assert value(samples, "acp_server_agent_restarts_total", agent="ref") == 1


async def test_metrics_follow_the_health_auth_rule(tmp_path: Path) -> None:
    async with daemon(tmp_path, token="s3cret") as (client, _bridge, _app):
        assert (await client.get("/metrics")).status_code == 200            # loopback: open
        assert (await client.get("/capabilities")).status_code == 401
    async with daemon(tmp_path, token="s3cret", require_auth=True) as (client, _bridge, _app):
        refused = await client.get("/metrics")
        assert refused.status_code == 401 and refused.json() == {"error": "Unauthorized"}
        await scrape(client, Authorization="Bearer s3cret")
        samples = await scrape(client, Authorization="Bearer s3cret")
        assert value(samples, "acp_server_http_requests_total", door="ops", route="/metrics",
                     status="401") == 1


async def test_the_task_gauge_reads_postgres_once_per_ttl(tmp_path: Path) -> None:
    if not stores.postgres_dsn():
        pytest.skip(stores.SKIP_POSTGRES)
    url = stores.postgres_url_for(tmp_path, "metrics")
    async with daemon(tmp_path, store_url=url) as (client, _bridge, server):
        metrics = server.metrics
        await run_task(client)
        samples = await scrape(client)
        assert value(samples, "acp_server_lmsp_tasks", status="succeeded") == 1
        metrics.tasks.ttl_s = 3600                     # cached: no query per scrape
        fetched = metrics.tasks.fetches
        await run_task(client)
        for _ in range(3):
            samples = await scrape(client)
        assert metrics.tasks.fetches == fetched
        assert value(samples, "acp_server_lmsp_tasks", status="succeeded") == 1   # the cache
        metrics.tasks.ttl_s = 0                        # expired: the next scrape reads again
        samples = await scrape(client)
        assert metrics.tasks.fetches == fetched + 1
        assert value(samples, "acp_server_lmsp_tasks", status="succeeded") == 2


@pytest.mark.parametrize("observed", [
    [0.0, 0.001, 0.0011, 0.005, 2.5, 60.0, 299.9, 300.0, 301.0, 1e9],
    [],
])
def test_the_turn_histograms_expose_what_prometheus_histograms_would(
        observed: list[float]) -> None:
    """The turn histograms are plain numbers folded in when scraped
    (``metrics._TurnCollector``): their exposition is a ``prometheus_client``
    ``Histogram``'s fed the same observations, line for line (bucket bounds on their
    edges included), ``_created`` but for its value."""
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from acp_server.ops.metrics import TURN_BUCKETS, WAIT_BUCKETS, _TurnCollector

    ours, theirs = CollectorRegistry(), CollectorRegistry()
    collector = _TurnCollector()
    ours.register(collector)
    wait = Histogram("acp_server_prompt_queue_wait_seconds",
                     "Admission to the start of the turn.", buckets=WAIT_BUCKETS,
                     registry=theirs)
    turns = Histogram("acp_server_turn_duration_seconds",
                      "Start of the turn to its settlement.", ["stop_reason"],
                      buckets=TURN_BUCKETS, registry=theirs)
    for n, seconds in enumerate(observed):
        collector.wait.observe(seconds)
        wait.observe(seconds)
        reason = ("end_turn", "cancelled")[n % 2]
        series = collector.turns.get(reason)
        if series is None:
            series = collector.turns[reason] = type(collector.wait)(TURN_BUCKETS)
        series.observe(seconds)
        turns.labels(reason).observe(seconds)

    def lines(registry: CollectorRegistry) -> list[str]:
        return [line.rsplit(" ", 1)[0] if "_created" in line else line
                for line in generate_latest(registry).decode().splitlines()]

    assert lines(ours) == lines(theirs)
