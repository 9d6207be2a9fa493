"""LMSP's create → complete path in process: CPU µs per task created over the app (as
ASGI, no server, no socket) and run to its end by the runner and the reference agent,
on a SQLite (or PostgreSQL) store.

    python -m bench.lmsp_inprocess              # 3 rounds, each on a fresh server
    python -m bench.lmsp_inprocess 5 creates    # 5 rounds, the runner off (creates only)
    BENCH_LMSP_STORE=postgresql://… python -m bench.lmsp_inprocess   # a new schema a round

Each round: ``open_server`` on a fresh store file (``--max-running-tasks`` 16, no
queued-task cap), its heap settled as ``acp-server serve`` does (``settle_heap``),
then ``CALLERS`` callers (``bench lmsp``'s 8 closed-loop connections) each POST
``/lmsp/v1/tasks`` and await the 202 (which waits for the commit), ``TASKS`` in all,
then wait until no task is queued or running. Printed per task: CPU µs of the event
loop's thread (``loop``: the create path, the runner, the agent's turn, the settling
of commits) and of the process (``process``: the store's writer thread too), and the
store's commits and statements per task; also the create's latency (p50 µs, 202
included) and tasks/s of wall time (moves with the machine's load; decide by CPU).

``creates`` runs the same with the runner off (``--max-running-tasks 0``).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.lowlevel

from acp_server.serve_cli import settle_heap
from acp_server.ops.request_log import configure_logging, unconfigure_access_writer
from acp_server.lmsp import LmspConfig
from acp_server.server import open_server
from acp_server.settings import Settings
from bench.inprocess import counted_exchange
from bench.lmsp_bench import fresh_schema

TASKS = int(os.environ.get("BENCH_LMSP_TASKS", "3000"))
CALLERS = 8
RUNNING = 16
PATH = "/lmsp/v1/tasks"
UNFINISHED = ("queued", "loading", "running", "cancelling")
BODY = json.dumps({"type": "response",
                   "input": {"model": "reference", "input": "bench"}}).encode()


def _unfinished(counts: dict[str, int]) -> int:
    return sum(counts.get(status, 0) for status in UNFINISHED)


def _scope() -> dict[str, Any]:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": PATH, "raw_path": PATH.encode(),
            "query_string": b"", "root_path": "", "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 4170),
            "headers": [(b"host", b"127.0.0.1:4170"), (b"content-type", b"application/json"),
                        (b"content-length", str(len(BODY)).encode())]}


@contextlib.asynccontextmanager
async def _served(running: int) -> AsyncIterator[Any]:
    configure_logging("text", stream=open(os.devnull, "w"))
    try:
        with tempfile.TemporaryDirectory() as workspace:
            store = os.environ.get("BENCH_LMSP_STORE")
            store = fresh_schema(store) if store else \
                f"sqlite:///{os.path.join(workspace, 'bench.db')}"
            settings = Settings(workspace=workspace, port=0, store=store,
                                max_running_tasks=running,
                                state_dir=os.path.join(workspace, "state"))
            async with open_server(settings,
                                   lmsp_config=LmspConfig(max_queued_tasks=None)) as server:
                settle_heap()   # as ``acp-server serve`` does once started
                try:
                    yield server
                finally:
                    gc.unfreeze()   # the next round collects this one's
    finally:
        unconfigure_access_writer()


class _Statements:
    """Statements the SQLite writer ran, when it is SQLite: a stand-in for the writer's
    connection that counts its ``execute`` calls (every statement of the writer is one,
    ``BEGIN`` and ``COMMIT`` too). Not the connection's trace callback: SQLite calls it
    from inside each statement's step, where the module has let go of the GIL, so every
    statement had to win the GIL back from the busy loop once more (a 10-row insert
    took ~4x the writer thread's CPU, 216 µs against ~50, and the loop paid for the hand-offs)."""

    def __init__(self, store: Any) -> None:
        self.count = 0
        self.store = store
        self.conn = getattr(store, "_writer", None)
        if self.conn is not None:
            store._writer = self

    def execute(self, sql: str, *args: Any) -> Any:
        self.count += 1
        return self.conn.execute(sql, *args)

    def executemany(self, sql: str, *args: Any) -> Any:
        self.count += 1
        return self.conn.executemany(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)

    def restore(self) -> None:
        if self.conn is not None and self.store._writer is self:
            self.store._writer = self.conn


async def _round(running: int) -> dict[str, float]:
    async with _served(running) as server:
        store, service = server.lmsp.store, server.lmsp
        receive, send, statuses = counted_exchange(BODY)
        left, latencies = [TASKS], []

        async def caller() -> None:
            while left[0] > 0:
                left[0] -= 1
                began = time.perf_counter()
                await app(_scope(), receive, send)
                latencies.append(time.perf_counter() - began)
                await anyio.lowlevel.checkpoint()   # the server's next request

        app = server.app
        statements = _Statements(store)
        commits = store.commits
        start, start_process, wall = time.thread_time(), time.process_time(), time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(CALLERS):
                tg.start_soon(caller)
        if running:   # (a claim committed but not yet back in the runner: ``loading``)
            while service.runner.running or _unfinished(await store.status_counts()):
                await anyio.sleep(0.002)
        elapsed = time.perf_counter() - wall
        thread, process = time.thread_time() - start, time.process_time() - start_process
        statements.restore()
        assert statuses == {202: TASKS}, statuses
        if running:
            counts = await store.status_counts()
            assert counts.get("succeeded") == TASKS, counts
        return {"loop_us": thread / TASKS * 1e6,
                "process_us": process / TASKS * 1e6,
                "commits": (store.commits - commits) / TASKS,
                "statements": statements.count / TASKS,
                "latency_p50_us": statistics.median(latencies) * 1e6,
                "tasks_s": TASKS / elapsed}


def run(rounds: int = 3, mode: str = "e2e") -> dict[str, float]:
    """The best (lowest CPU, highest rate) of ``rounds``, each on a fresh server."""
    running = RUNNING if mode == "e2e" else 0
    best: dict[str, float] = {}
    for _ in range(rounds):
        figures = anyio.run(_round, running, backend="asyncio",
                            backend_options={"use_uvloop": True})
        print(" ".join(f"{k} {v:.2f}" for k, v in figures.items()), file=sys.stderr)
        best = {k: (max if k == "tasks_s" else min)(v, best.get(k, v))
                for k, v in figures.items()}
    return best


def main(argv: list[str]) -> None:
    rounds = int(argv[0]) if argv else 3
    mode = argv[1] if len(argv) > 1 else "e2e"
    best = run(rounds, mode)
    print(json.dumps({k: round(v, 2) for k, v in best.items()}))


if __name__ == "__main__":
    main(sys.argv[1:])
