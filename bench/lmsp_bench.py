"""LMSP benchmarks: durable task creations/s over HTTP (group commit against one commit
per create, same run), and events/s streamed to 100 concurrent subscribers.

    python -m bench lmsp          # once wired into bench/__main__.py SECTIONS
    python -m bench.lmsp_bench

* creates: ``acp-server serve`` through ``bench.server`` (SQLite WAL, ``synchronous=FULL``, runner off so only
  the create path is measured) loaded by ``bench.loadgen`` from another process with
  ``CONNECTIONS`` keep-alive connections; every answer must be 202 (each one sent
  after its fsync).
* end to end: the same server with the runner on (``--max-running-tasks 16``) and
  ``E2E_CLIENTS`` connections creating for ``SECONDS``; then ``GET /lmsp/v1/tasks?status=``
  ``queued`` / ``running`` polled until both are empty; tasks/s = creates / (first
  create → every task terminal), next to the create rate of that load and of the
  runner-off load above. On PostgreSQL too when a database is at hand.
* fan-out: one task producing ``CHUNKS`` deltas; ``SUBSCRIBERS`` raw-socket SSE readers
  connected before it starts; events/s = events delivered to all readers / time from
  the task's start to the last reader's terminal event.
* PostgreSQL, same run, when a database is at hand (``ACP_SERVER_BENCH_POSTGRES``, else
  a throwaway cluster from ``tests/lmsp/pg.sh``, else "n/a (no PostgreSQL)"): creates/s
  against one instance (fresh schema, same load), and event latency from a writer on
  instance A to a subscriber on instance B: a queued task is cancelled on A while B
  streams it; latency = ``POST …/cancel`` sent on A → ``response.cancelled`` read on B
  (an upper bound of commit → NOTIFY → re-read → SSE). SQLite's figure is the same
  measure within one instance (one SQLite file cannot be shared across machines).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from bench.http_bench import served
from bench.targets import record

SECONDS = float(os.environ.get("BENCH_SECONDS", "4"))
CONNECTIONS = 64
SUBSCRIBERS = 100
E2E_CLIENTS = 8
E2E_RUNNING = 16
CHUNKS = 2000
TASK = json.dumps({"type": "response", "input": {"model": "reference", "input": "bench"}})
LATENCY_SAMPLES = 50
PG_SCRIPT = Path(__file__).resolve().parents[1] / "tests" / "lmsp" / "pg.sh"
PG_PORT = 54339


@contextlib.contextmanager
def lmsp_server(workspace: str, *, running: int = 0, store: str | None = None,
                group_commit: bool = True) -> Iterator[int]:
    """``acp-server serve`` (``bench.server``) running ``running`` tasks at once on
    ``store`` (default: a new SQLite file), no queued-task cap; yields its port."""
    os.makedirs(workspace, exist_ok=True)
    store = store or f"sqlite:///{os.path.join(workspace, f'bench-{time.monotonic_ns()}.db')}"
    knobs = ["--unbounded-task-queue", *(() if group_commit else ("--no-group-commit",))]
    with served(workspace, "--store", store, "--max-running-tasks", str(running),
                knobs=knobs) as port:
        yield port


def creates(workspace: str, *, group_commit: bool) -> dict:
    with lmsp_server(workspace, group_commit=group_commit) as port:
        return _load(port)


def _load(port: int, connections: int = CONNECTIONS) -> dict:
    out = subprocess.run([sys.executable, "-m", "bench.loadgen", "--port", str(port),
                          "--method", "POST", "--path", "/lmsp/v1/tasks", "--body", TASK,
                          "--seconds", str(SECONDS), "--connections", str(connections)],
                         capture_output=True, text=True, check=True)
    result = json.loads(out.stdout)
    assert set(result["statuses"]) == {"202"}, result
    return result


def _all_terminal(port: int) -> float:
    """``time.monotonic()`` once no task is queued, loading, running or cancelling (a
    claimed task is ``loading`` while its agent session is made)."""
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
        while True:
            busy = [client.get("/lmsp/v1/tasks", params={"status": status, "limit": 1}).json()
                    ["data"] for status in ("queued", "loading", "running", "cancelling")]
            if not any(busy):
                return time.monotonic()
            time.sleep(0.01)


def end_to_end(port: int) -> dict:
    """Creates (8 connections) while 16 run, until every task is terminal."""
    result = _load(port, E2E_CLIENTS)
    done_at = _all_terminal(port)
    result["completed_per_s"] = result["requests"] / (done_at - result["started_at"])
    result["drain_s"] = done_at - result["started_at"]
    return result


def _e2e_row(name: str, r: dict) -> str:
    return (f"| {name} | {r['requests']} | {r['rps']:.0f} | {r['drain_s']:.2f} "
            f"| {r['completed_per_s']:.0f} |")


async def _subscriber(port: int, task_id: str, ready: asyncio.Event, counts: list[int],
                      done_at: list[float]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET /lmsp/v1/tasks/{task_id}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 f"Accept: text/event-stream\r\n\r\n".encode())
    seen, tail = 0, b""
    ready.set()
    while True:
        chunk = await reader.read(1 << 16)
        if not chunk:
            break
        data = tail + chunk
        seen += data.count(b"\nid: ") - tail.count(b"\nid: ")
        tail = data[-64:]
        if b"event: response.completed" in data:
            break
    done_at.append(time.perf_counter())
    counts.append(seen)
    writer.close()


async def _fan_out(port: int) -> tuple[int, float]:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
        blocker = {"type": "response", "input": {"model": "reference", "input": "/sleep 1s b"}}
        await client.post("/lmsp/v1/tasks", json=blocker)
        text = f"/chunks {CHUNKS} " + "word " * CHUNKS
        task = (await client.post("/lmsp/v1/tasks", json={
            "type": "response", "input": {"model": "reference", "input": text}})).json()
        counts: list[int] = []
        done_at: list[float] = []
        readies = [asyncio.Event() for _ in range(SUBSCRIBERS)]
        readers = [asyncio.create_task(_subscriber(port, task["id"], r, counts, done_at))
                   for r in readies]
        await asyncio.gather(*(r.wait() for r in readies))
        while (await client.get(f"/lmsp/v1/tasks/{task['id']}")).json()["status"] == "queued":
            await asyncio.sleep(0.002)
        start = time.perf_counter()
        await asyncio.gather(*readers)
    return sum(counts), max(done_at) - start


# -- PostgreSQL: creates/s and A → B latency ---------------------------------------------
@contextlib.contextmanager
def postgres_dsn() -> Iterator[str | None]:
    """``ACP_SERVER_BENCH_POSTGRES`` or ``ACP_SERVER_TEST_POSTGRES``, else a throwaway
    cluster (stopped after), else None."""
    for name in ("ACP_SERVER_BENCH_POSTGRES", "ACP_SERVER_TEST_POSTGRES"):
        if os.environ.get(name):
            yield os.environ[name]
            return
    directory = tempfile.mkdtemp(prefix="acp-bench-pg.")
    try:
        started = subprocess.run(["bash", str(PG_SCRIPT), "start", directory, str(PG_PORT)],
                                 capture_output=True, text=True)
        if started.returncode != 0:
            yield None
            return
        try:
            yield started.stdout.strip().split("=", 1)[1]
        finally:
            subprocess.run(["bash", str(PG_SCRIPT), "stop", directory], capture_output=True)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def fresh_schema(dsn: str) -> str:
    """A new schema in ``dsn``; the URL of it."""
    import urllib.parse

    import psycopg

    name = f"bench_{secrets.token_hex(4)}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    parts = urllib.parse.urlsplit(dsn)
    query = urllib.parse.parse_qsl(parts.query) + [("options", f"-csearch_path={name}")]
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))


def instance(workspace: str, url: str, running: int = 0) -> contextlib.AbstractContextManager[int]:
    """An LMSP server on ``url`` that runs ``running`` tasks at once."""
    return lmsp_server(workspace, running=running, store=url)


async def _latency(writer: int, reader: int) -> list[float]:
    """Seconds from ``POST …/cancel`` on ``writer`` to ``response.cancelled`` on ``reader``."""
    samples: list[float] = []
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{writer}", timeout=30) as a, \
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{reader}", timeout=30) as b:
        for _ in range(LATENCY_SAMPLES):
            task = (await a.post("/lmsp/v1/tasks", content=TASK)).json()
            async with b.stream("GET", f"/lmsp/v1/tasks/{task['id']}/events") as response:
                lines = response.aiter_lines()
                async for line in lines:
                    if line.startswith("event: response.created"):
                        break
                began = time.perf_counter()
                cancel = asyncio.create_task(a.post(f"/lmsp/v1/tasks/{task['id']}/cancel"))
                async for line in lines:
                    if line.startswith("event: response.cancelled"):
                        samples.append(time.perf_counter() - began)
                        break
                await cancel
    return samples


def _ms(samples: list[float]) -> str:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
    return f"{statistics.median(ordered) * 1000:.1f} / {p95 * 1000:.1f}"


E2E_HEAD = [f"| tasks created ({E2E_CLIENTS} connections, {SECONDS:g} s) and completed "
            f"(`--max-running-tasks {E2E_RUNNING}`, reference agent) | tasks | creates/s "
            f"| first create → all terminal, s | completed tasks/s |", "|---|---|---|---|---|"]


def postgres_rows(workspace: str, sqlite_latency: list[float]) -> list[str]:
    with postgres_dsn() as dsn:
        if dsn is None:
            record("LMSP tasks completed end to end, PostgreSQL, tasks/s", None, 500,
                   note="no PostgreSQL")
            return ["", "PostgreSQL: n/a (no PostgreSQL)"]
        with instance(os.path.join(workspace, "pg-c"), fresh_schema(dsn)) as port:
            pg_creates = _load(port)
        with instance(os.path.join(workspace, "pg-e"), fresh_schema(dsn), E2E_RUNNING) as port:
            pg_e2e = end_to_end(port)
        record("LMSP tasks completed end to end, PostgreSQL, tasks/s", pg_e2e["completed_per_s"],
               500, note=f"creates alone {pg_creates['rps']:.0f}/s")
        url = fresh_schema(dsn)
        with instance(os.path.join(workspace, "pg-a"), url) as a, \
                instance(os.path.join(workspace, "pg-b"), url) as b:
            across = asyncio.run(_latency(a, b))
    return [
        "", f"PostgreSQL (same run, same load; local cluster, synchronous_commit=on): "
        f"{pg_creates['rps']:.0f} creates/s (one instance)", "",
        *E2E_HEAD, _e2e_row("PostgreSQL, runner on", pg_e2e), "",
        f"| event latency, cancel on writer → `response.cancelled` on subscriber "
        f"({LATENCY_SAMPLES} samples) | p50 / p95 ms |", "|---|---|",
        f"| PostgreSQL, instance A → instance B (LISTEN/NOTIFY wake-up, re-read) "
        f"| {_ms(across)} |",
        f"| SQLite, one instance (in-process hub) | {_ms(sqlite_latency)} |",
    ]


def main() -> list[str]:
    with tempfile.TemporaryDirectory() as workspace:
        grouped = creates(workspace, group_commit=True)
        single = creates(workspace, group_commit=False)
        with lmsp_server(workspace, running=E2E_RUNNING) as port:
            e2e = end_to_end(port)
        with lmsp_server(workspace, running=1) as port:
            events, elapsed = asyncio.run(_fan_out(port))
        with lmsp_server(workspace) as port:
            sqlite_latency = asyncio.run(_latency(port, port))
        record("LMSP tasks completed end to end, SQLite, tasks/s", e2e["completed_per_s"], 1000,
               note=f"creates alone {grouped['rps']:.0f}/s")
        postgres = postgres_rows(workspace, sqlite_latency)
    ratio = grouped["rps"] / single["rps"]
    return [
        f"## LMSP (SQLite WAL, synchronous=FULL; {CONNECTIONS} keep-alive connections from a "
        f"separate process, {SECONDS:g} s each)", "",
        "| durable `POST /lmsp/v1/tasks` → 202 | creates/s | ratio |", "|---|---|---|",
        f"| group commit (one transaction + fsync per batch) | {grouped['rps']:.0f} "
        f"| {ratio:.2f} |",
        f"| one commit per create | {single['rps']:.0f} | 1.00 |", "",
        *E2E_HEAD, _e2e_row("SQLite, runner on", e2e), "",
        f"Fan-out: one task of {CHUNKS} deltas to {SUBSCRIBERS} SSE subscribers: "
        f"{events} events in {elapsed:.2f} s = {events / elapsed:.0f} events/s",
        *postgres,
    ]


if __name__ == "__main__":
    print("\n".join(main()))
