"""HTTP benchmarks: the 503 and 202 prompt paths against a bare Starlette route, and
turn latency, each server in its own process and the load from another.

    python -m bench http

* 503 path: a session whose queue (cap 1) is held by a ``/sleep`` prompt; every
  POST is refused with ``prompt_queue_full``.
* 202 path: cap disabled, ``/chunks 1`` prompts that the reference agent finishes at once.
* bare: ``bench.bare_server``, a Starlette route returning the same 503 bytes.
* latency: POST to ``turn_complete`` on an open SSE stream, sequential turns.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import httpx
from httpx_sse import connect_sse

SECONDS = float(os.environ.get("BENCH_SECONDS", "4"))
CONNECTIONS = 16
PROMPT = json.dumps({"prompt": [{"type": "text", "text": "/chunks 1 ping"}]})
TURNS = 300


@contextlib.contextmanager
def server(argv: list[str], marker: str) -> Iterator[int]:
    proc = subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if marker in line:
                yield int(line.split(marker, 1)[1].split()[0].rsplit(":", 1)[-1])
                break
        else:
            raise RuntimeError(f"server {argv} exited before listening")
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def acp_server(workspace: str, cap: int) -> contextlib.AbstractContextManager[int]:
    return server(["-m", "acp_server", "serve", "--port", "0", "--workspace", workspace,
                   "--state-dir", os.path.join(workspace, ".state"),
                   "--max-pending-prompts-per-session", str(cap)], "listening on http://")


def load(port: int, path: str, body: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "bench.loadgen", "--port", str(port),
                          "--method", "POST", "--path", path, "--body", body,
                          "--seconds", str(SECONDS), "--connections", str(CONNECTIONS)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def create_session(client: httpx.Client) -> str:
    return client.post("/session", json={"sessionScope": "thread"}).json()["sessionId"]


def latency(port: int) -> tuple[float, float]:
    samples = []
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        sid = create_session(client)
        with connect_sse(client, "GET", f"/session/{sid}/events") as source:
            events = source.iter_sse()
            for _ in range(TURNS):
                start = time.perf_counter()
                prompt_id = client.post(f"/session/{sid}/prompt", content=PROMPT,
                                        headers={"Content-Type": "application/json"}).json()["promptId"]
                for sse in events:
                    if sse.event == "turn_complete" and json.loads(sse.data)["promptId"] == prompt_id:
                        break
                samples.append((time.perf_counter() - start) * 1000)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.99) - 1]


def main() -> list[str]:
    with tempfile.TemporaryDirectory() as workspace:
        with acp_server(workspace, 1) as port:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
                sid = create_session(client)
                client.post(f"/session/{sid}/prompt",
                            json={"prompt": [{"type": "text", "text": "/sleep 600s hold"}]})
            full = load(port, f"/session/{sid}/prompt", PROMPT)
        with server(["-m", "bench.bare_server"], "listening on ") as port:
            bare = load(port, "/session/00000000-0000-4000-8000-000000000000/prompt", PROMPT)
        with acp_server(workspace, 0) as port:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
                sid = create_session(client)
            accepted = load(port, f"/session/{sid}/prompt", PROMPT)
            p50, p99 = latency(port)
    assert set(full["statuses"]) == {"503"}, full
    assert set(accepted["statuses"]) == {"202"}, accepted
    return [
        f"## HTTP (uvicorn, {CONNECTIONS} keep-alive connections from a separate process, "
        f"{SECONDS:g} s each)", "",
        "| route | requests/s | ratio to bare |", "|---|---|---|",
        f"| bare Starlette route, same 503 bytes | {bare['rps']:.0f} | 1.00 |",
        f"| `POST /session/{{id}}/prompt` → 503 `prompt_queue_full` | {full['rps']:.0f} "
        f"| {full['rps'] / bare['rps']:.2f} |",
        f"| `POST /session/{{id}}/prompt` → 202 (reference agent runs each turn) "
        f"| {accepted['rps']:.0f} | {accepted['rps'] / bare['rps']:.2f} |",
        "", f"Turn latency, POST → `turn_complete` on SSE ({TURNS} sequential turns): "
        f"p50 {p50:.2f} ms, p99 {p99:.2f} ms",
    ]
