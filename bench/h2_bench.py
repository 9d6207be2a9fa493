"""HTTP/2 benchmarks on each server (granian, uvicorn): prompts multiplexed on one
connection beside the session's event stream, against 16 HTTP/1.1 connections; and the
latency the daemon adds between an agent's chunk and an SSE reader, over both.

    python -m bench h2

* multiplexed: one HTTP/2 connection (``httpx``, ``http2=True``, one connection at
  most) holds ``GET /session/{id}/events`` open and sends ``BATCH`` (100) prompts at
  once, ``ROUNDS`` times; each batch is done when its 100 ``turn_complete`` frames have
  arrived on that stream. prompts/s = prompts / time. The same with HTTP/1.1: the
  stream on its own connection and 16 connections sending the prompts. Every prompt
  must be answered 202 and completed; the client is the same library both times.
* latency: the agent is ``bench/stamp_agent.py`` (a stdio ACP agent) whose chunks
  carry ``time.time_ns()`` taken just before it writes them; the reader subtracts it
  from its own clock when the frame arrives: agent pipe → bridge → bus → SSE → server →
  socket → reader, p50 / p99 over ``CHUNKS`` chunks, HTTP/1.1 and HTTP/2.
"""

from __future__ import annotations

import asyncio
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from acp_server.http.options import DEFAULT_SERVER
from bench.http_bench import acp_server
from bench.targets import record

BATCH = 100
ROUNDS = int(os.environ.get("BENCH_H2_ROUNDS", "10"))
H1_CONNECTIONS = 16
CHUNKS = int(os.environ.get("BENCH_LATENCY_CHUNKS", "500"))
PROMPT = {"prompt": [{"type": "text", "text": "/chunks 1 ping"}]}
STAMP = re.compile(rb'"text": ?"(\d{19})"')


async def _stream(client: httpx.AsyncClient, sid: str, done: list[int],
                  ready: asyncio.Event, wake: asyncio.Event) -> None:
    async with client.stream("GET", f"/session/{sid}/events") as events:
        ready.set()
        async for line in events.aiter_lines():
            if line == "event: turn_complete":
                done[0] += 1
                wake.set()


async def _prompts(base_url: str, http2: bool) -> float:
    """prompts/s completed: ``BATCH`` at a time, ``ROUNDS`` times."""
    limits = httpx.Limits(max_connections=1 if http2 else H1_CONNECTIONS + 1)
    async with httpx.AsyncClient(base_url=base_url, http1=not http2, http2=http2,
                                 limits=limits, timeout=120) as client:
        sid = (await client.post("/session", json={})).json()["sessionId"]
        done, ready, wake = [0], asyncio.Event(), asyncio.Event()
        reader = asyncio.create_task(_stream(client, sid, done, ready, wake))
        await ready.wait()
        gate = asyncio.Semaphore(BATCH if http2 else H1_CONNECTIONS)

        async def one() -> None:
            async with gate:
                answer = await client.post(f"/session/{sid}/prompt", json=PROMPT)
                assert answer.status_code == 202, answer.text
                if not http2:
                    assert answer.http_version == "HTTP/1.1"
                else:
                    assert answer.http_version == "HTTP/2"

        start = time.perf_counter()
        for round_ in range(1, ROUNDS + 1):
            await asyncio.gather(*(one() for _ in range(BATCH)))
            while done[0] < round_ * BATCH:
                wake.clear()
                await wake.wait()
        elapsed = time.perf_counter() - start
        reader.cancel()
        return ROUNDS * BATCH / elapsed


async def _latency(base_url: str, http2: bool) -> tuple[float, float]:
    async with httpx.AsyncClient(base_url=base_url, http1=not http2, http2=http2,
                                 timeout=120) as client:
        sid = (await client.post("/session", json={})).json()["sessionId"]
        samples: list[float] = []
        async with client.stream("GET", f"/session/{sid}/events") as events:
            answer = await client.post(f"/session/{sid}/prompt", json={
                "prompt": [{"type": "text", "text": str(CHUNKS)}]})
            assert answer.status_code == 202, answer.text
            async for chunk in events.aiter_raw():
                now = time.time_ns()
                for stamp in STAMP.findall(chunk):
                    samples.append((now - int(stamp)) / 1e6)
                if b"turn_complete" in chunk:
                    break
    assert len(samples) == CHUNKS, len(samples)
    samples.sort()
    return statistics.median(samples), samples[min(len(samples) - 1, int(len(samples) * 0.99))]


SERVERS = tuple(os.environ.get("BENCH_H2_SERVERS", "granian,uvicorn").split(","))


def _measure(workspace: str, server: str, agent: str) -> dict[str, Any]:
    with acp_server(workspace, 0, None, "--http-server", server) as port:
        base = f"http://127.0.0.1:{port}"
        h2 = asyncio.run(_prompts(base, http2=True))
        h1 = asyncio.run(_prompts(base, http2=False))
    with acp_server(workspace, 0, None, "--http-server", server, "--agent", agent) as port:
        base = f"http://127.0.0.1:{port}"
        lat1 = asyncio.run(_latency(base, http2=False))
        lat2 = asyncio.run(_latency(base, http2=True))
    return {"h2": h2, "h1": h1, "lat1": lat1, "lat2": lat2}


def main() -> list[str]:
    agent = f"{sys.executable} {Path(__file__).with_name('stamp_agent.py')}"
    with tempfile.TemporaryDirectory() as workspace:
        runs = {server: _measure(workspace, server, agent) for server in SERVERS}
    shipped = runs.get(DEFAULT_SERVER) or next(iter(runs.values()))
    h2, h1 = shipped["h2"], shipped["h1"]
    record(f"{BATCH} prompts multiplexed on one HTTP/2 connection (beside its event "
           f"stream), prompts/s / {H1_CONNECTIONS} HTTP/1.1 connections", h2 / h1, 0.5,
           note=f"{h2:.0f} vs {h1:.0f} prompts/s; all answered")
    record("daemon-added latency, agent chunk → SSE reader, HTTP/2 p99, ms",
           shipped["lat2"][1], 10.0, lower_is_better=True)
    lines = [f"## HTTP/2 (httpx as the client both ways, {ROUNDS} × {BATCH} prompts; "
             f"the default server: {DEFAULT_SERVER})", "",
             "| server, transport | prompts/s completed | ratio |", "|---|---|---|"]
    for server, run in runs.items():
        lines += [f"| {server}, HTTP/1.1: {H1_CONNECTIONS} connections + the event "
                  f"stream's own | {run['h1']:.0f} | 1.00 |",
                  f"| {server}, HTTP/2: one connection, {BATCH} prompts at once + the "
                  f"event stream | {run['h2']:.0f} | {run['h2'] / run['h1']:.2f} |"]
    lines += ["", f"| agent chunk → SSE reader ({CHUNKS} chunks, stdio agent) "
              "| p50 ms | p99 ms |", "|---|---|---|"]
    for server, run in runs.items():
        for name, key in (("HTTP/1.1", "lat1"), ("HTTP/2", "lat2")):
            lines.append(f"| {name}, {server} | {run[key][0]:.2f} | {run[key][1]:.2f} |")
    return lines


if __name__ == "__main__":
    print("\n".join(main()))
