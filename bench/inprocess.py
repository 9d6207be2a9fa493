"""The 503 path in process: CPU µs per refused prompt of our app (the front layer, the
hot route, the bridge's refusal, the access line, the request metrics), called as ASGI
the way a server calls it, against the floors called the same way.

    python -m bench.inprocess   # raw 0.84 µs, bare 8.28 µs, ours 6.49 µs, ours_process 6.57 µs,
                                # accepted 80.1 µs, accepted_app 27.9 µs, accepted_process 88.2 µs
    figures = in_subprocess()   # {"raw": 0.84, "bare": 8.28, "ours": 6.49, ...}

No server, no socket: ``time.thread_time`` of the calling thread over ``CALLS``
refusals, the best of ``ROUNDS`` batches, the three apps interleaved twice; and
``ours_process``, the process's CPU over the same batches of ours (the access writer's
thread included: work moved off the event loop still counts there).
Stable to a few percent where requests/s across server processes swing by tens of
percent, so this is the figure to decide a change of our code by; what a server adds
(its parser, its writes, granian's hand-offs between threads) is in the HTTP rows'
CPU µs per request. The access line is formatted as ``acp-server serve`` does
(``configure_logging``), into ``os.devnull``.

The accepted-and-completed row's parts (``accepted``): ``CALLERS`` callers (wrk's 16
connections) send ``ACCEPTED`` prompts (``/chunks 1``, no cap, in-memory session
journal) to the app as ASGI, each call followed by a turn of the loop (a server's
next request), until the reference agent has run every turn: CPU µs per prompt of
the event loop's thread (``accepted``: the 202 path and the turn), of the app calls
alone (``accepted_app``: the front layer, admission, the 202 answer, the audit
record, the access line) and of the process (``accepted_process``: the store's
writer with the audit log, the access writer). What a server adds on top is its own
per-request cost (the 503 rows' CPU µs).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.lowlevel
import httpx

from acp_server.ops import request_log
from acp_server.ops.request_log import configure_logging, unconfigure_access_writer
from acp_server.server import open_server
from acp_server.settings import Settings
from bench import floor_server
from bridge.options import BridgeOptions

CALLS = int(os.environ.get("BENCH_INPROC_CALLS", "20000"))
ACCEPTED = int(os.environ.get("BENCH_INPROC_ACCEPTED", "6000"))
CALLERS = 16
ROUNDS = 5
BODY = b'{"prompt": [{"type": "text", "text": "/chunks 1 ping"}]}'
HOLD = {"prompt": [{"type": "text", "text": "/sleep 600s hold"}]}


def _scope(path: str) -> dict[str, Any]:
    """What a server hands the app for wrk's POST (a fresh dict per request)."""
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
            "query_string": b"", "root_path": "", "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 4170),
            "headers": [(b"host", b"127.0.0.1:4170"), (b"content-type", b"application/json"),
                        (b"content-length", str(len(BODY)).encode())]}


async def cpu_us(app: Any, path: str) -> tuple[float, float]:
    """CPU µs per call of ``app`` with one refused prompt: of this thread, and of the
    whole process (what other threads do for it, the access writer's formatting)."""
    message = {"type": "http.request", "body": BODY, "more_body": False}
    statuses: set[int] = set()

    async def receive() -> dict[str, Any]:
        return message

    async def send(sent: dict[str, Any]) -> None:
        if sent["type"] == "http.response.start":
            statuses.add(sent["status"])

    best = best_process = float("inf")
    for _ in range(ROUNDS):
        flush_access_writer()   # what earlier calls queued is not this round's
        start, start_process = time.thread_time(), time.process_time()
        for _ in range(CALLS):
            await app(_scope(path), receive, send)
        best = min(best, (time.thread_time() - start) / CALLS * 1e6)
        flush_access_writer()   # the lines still queued: the process's, not this thread's
        best_process = min(best_process, (time.process_time() - start_process) / CALLS * 1e6)
    assert statuses == {503}, statuses
    return best, best_process


@contextlib.asynccontextmanager
async def _served(*, pending_limit: int, journal: str | None = None,
                  first: dict[str, Any] | None = None) -> AsyncIterator[tuple[Any, str]]:
    """(the server, a thread session's id) in process, logging to /dev/null, with
    ``first`` sent to the session as its first prompt when given."""
    configure_logging("text", stream=open(os.devnull, "w"))
    try:
        with tempfile.TemporaryDirectory() as workspace:
            extra = {} if journal is None else {"session_journal": journal}
            settings = Settings(workspace=workspace, port=0, **extra,
                                options=BridgeOptions(
                                    max_pending_prompts_per_session=pending_limit),
                                state_dir=os.path.join(workspace, "state"))
            async with open_server(settings) as server:
                transport = httpx.ASGITransport(app=server.app)
                async with httpx.AsyncClient(transport=transport,
                                             base_url="http://127.0.0.1:4170") as client:
                    created = await client.post("/session", json={"sessionScope": "thread"})
                    sid = created.json()["sessionId"]
                    if first is not None:
                        await client.post(f"/session/{sid}/prompt", json=first)
                yield server, sid
    finally:
        unconfigure_access_writer()


async def measure() -> dict[str, float]:
    """{"raw": µs, "bare": µs, "ours": µs, "ours_process": µs}, the best of each over two
    interleavings (``ours_process``: the whole process's CPU for ours)."""
    async with _served(pending_limit=1, first=HOLD) as (server, sid):
        apps = {"raw": (floor_server.raw, floor_server.PATH),
                "bare": (floor_server.bare, floor_server.PATH),
                "ours": (server.app, f"/session/{sid}/prompt")}
        best = {name: float("inf") for name in [*apps, "ours_process"]}
        for _ in range(2):
            for name, (app, path) in apps.items():
                thread, process = await cpu_us(app, path)
                best[name] = min(best[name], thread)
                if name == "ours":
                    best["ours_process"] = min(best["ours_process"], process)
        return best


async def accepted(rounds: int = 3) -> dict[str, float]:
    """The accepted-and-completed load in process, the best of ``rounds`` (see the
    module docstring): {"accepted": µs, "accepted_app": µs, "accepted_process": µs}."""
    async with _served(pending_limit=0, journal="memory") as (server, sid):
        best: dict[str, float] = {}
        for _ in range(rounds):
            figures = await _accepted_round(server.app, server.bridge.get_session(sid),
                                            f"/session/{sid}/prompt")
            best = {k: min(v, best.get(k, v)) for k, v in figures.items()}
        return best


def counted_exchange(body: bytes) -> tuple[Any, Any, dict[int, int]]:
    """``receive`` giving ``body`` whole every time, ``send`` counting the statuses
    answered, and those counts: one request's ASGI pair, reused by every call."""
    message = {"type": "http.request", "body": body, "more_body": False}
    statuses: dict[int, int] = {}

    async def receive() -> dict[str, Any]:
        return message

    async def send(sent: dict[str, Any]) -> None:
        if sent["type"] == "http.response.start":
            statuses[sent["status"]] = statuses.get(sent["status"], 0) + 1

    return receive, send, statuses


async def _accepted_round(app: Any, session: Any, path: str) -> dict[str, float]:
    receive, send, statuses = counted_exchange(BODY)
    left, in_app = [ACCEPTED], [0.0]

    async def caller() -> None:
        while left[0] > 0:
            left[0] -= 1
            before = time.thread_time()
            await app(_scope(path), receive, send)
            in_app[0] += time.thread_time() - before
            await anyio.lowlevel.checkpoint()   # the server's next request: a new turn

    flush_access_writer()
    start, start_process = time.thread_time(), time.process_time()
    async with anyio.create_task_group() as tg:
        for _ in range(CALLERS):
            tg.start_soon(caller)
    while session.pending:   # every turn run (a sleep, not a spin: its CPU would count)
        await anyio.sleep(0.0005)
    flush_access_writer()
    thread, process = time.thread_time() - start, time.process_time() - start_process
    assert statuses == {202: ACCEPTED}, statuses
    return {"accepted": thread / ACCEPTED * 1e6, "accepted_app": in_app[0] / ACCEPTED * 1e6,
            "accepted_process": process / ACCEPTED * 1e6}


def flush_access_writer() -> None:
    if request_log.access_writer is not None:
        request_log.access_writer.flush()


def run() -> dict[str, float]:
    refused = anyio.run(measure, backend="asyncio", backend_options={"use_uvloop": True})
    return {**refused,
            **anyio.run(accepted, backend="asyncio", backend_options={"use_uvloop": True})}


def in_subprocess(source: str | None = None) -> dict[str, float]:
    """``run()`` in a process of its own (it configures logging), for ``bench.http_bench``;
    ``source``: another source tree (``BENCH_BEFORE``), whose ``acp_server`` and floors
    this file measures."""
    env = None if source is None else {**os.environ, "PYTHONPATH": source}
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--json"],
                         capture_output=True, text=True, check=True, env=env, cwd=source)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


if __name__ == "__main__":
    figures = run()
    if "--json" in sys.argv:
        print(json.dumps(figures))
    else:
        print(", ".join(f"{name} {us:.2f} µs" for name, us in figures.items()))
