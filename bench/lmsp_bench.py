"""LMSP benchmarks: durable task creations/s over HTTP (group commit against one commit
per create, same run), and events/s streamed to 100 concurrent subscribers.

    python -m bench lmsp          # once wired into bench/__main__.py SECTIONS
    python -m bench.lmsp_bench

* creates: ``bench.lmsp_server`` (SQLite WAL, ``synchronous=FULL``, runner off so only
  the create path is measured) loaded by ``bench.loadgen`` from another process with
  ``CONNECTIONS`` keep-alive connections; every answer must be 202 (each one sent
  after its fsync).
* fan-out: one task producing ``CHUNKS`` deltas; ``SUBSCRIBERS`` raw-socket SSE readers
  connected before it starts; events/s = events delivered to all readers / time from
  the task's start to the last reader's terminal event.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
import time
from collections.abc import Iterator

import httpx

from bench.http_bench import server

SECONDS = float(os.environ.get("BENCH_SECONDS", "4"))
CONNECTIONS = 64
SUBSCRIBERS = 100
CHUNKS = 2000
TASK = json.dumps({"type": "response", "input": {"model": "reference", "input": "bench"}})


@contextlib.contextmanager
def lmsp_server(workspace: str, *flags: str) -> Iterator[int]:
    db = os.path.join(workspace, f"bench-{time.monotonic_ns()}.db")
    with server(["-m", "bench.lmsp_server", "--db", db, "--workspace", workspace, *flags],
                "lmsp listening on ") as port:
        yield port


def creates(workspace: str, *flags: str) -> dict:
    import subprocess
    import sys

    with lmsp_server(workspace, *flags) as port:
        out = subprocess.run([sys.executable, "-m", "bench.loadgen", "--port", str(port),
                              "--method", "POST", "--path", "/lmsp/v1/tasks", "--body", TASK,
                              "--seconds", str(SECONDS), "--connections", str(CONNECTIONS)],
                             capture_output=True, text=True, check=True)
    result = json.loads(out.stdout)
    assert set(result["statuses"]) == {"202"}, result
    return result


async def _subscriber(port: int, task_id: str, ready: asyncio.Event, counts: list[int],
                      done_at: list[float]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET /lmsp/v1/tasks/{task_id}/events HTTP/1.1\r\nHost: x\r\n"
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


def main() -> list[str]:
    with tempfile.TemporaryDirectory() as workspace:
        grouped = creates(workspace, "--group-commit")
        single = creates(workspace, "--no-group-commit")
        with lmsp_server(workspace, "--max-running-tasks", "1") as port:
            events, elapsed = asyncio.run(_fan_out(port))
    ratio = grouped["rps"] / single["rps"]
    return [
        f"## LMSP (SQLite WAL, synchronous=FULL; {CONNECTIONS} keep-alive connections from a "
        f"separate process, {SECONDS:g} s each)", "",
        "| durable `POST /lmsp/v1/tasks` → 202 | creates/s | ratio |", "|---|---|---|",
        f"| group commit (one transaction + fsync per batch) | {grouped['rps']:.0f} "
        f"| {ratio:.2f} |",
        f"| one commit per create | {single['rps']:.0f} | 1.00 |", "",
        f"Fan-out: one task of {CHUNKS} deltas to {SUBSCRIBERS} SSE subscribers: "
        f"{events} events in {elapsed:.2f} s = {events / elapsed:.0f} events/s",
    ]


if __name__ == "__main__":
    print("\n".join(main()))
