"""The one server process of the benchmarks: ``acp-server serve`` with a few knobs the
command does not offer, and an event-loop lag probe beside it.

    python -m bench.server [--lag-probe FILE] [--no-group-commit] [--unbounded-task-queue]
                           [--subscriber-max-queued N] serve --port 0 --workspace /tmp/w ...
    # acp-server listening on http://127.0.0.1:41234 (...)

It is ``acp_server.cli.main`` (flags, ``open_server``, ``run_http``: the server exactly as
shipped) with ``serve_cli.serve`` wrapped from the outside, so the server carries nothing for
the benchmarks:

* ``--lag-probe FILE``: a task in the server's event loop sleeps ``INTERVAL_S`` and
  records how late it woke (``lag = elapsed - INTERVAL_S``); FILE gains lines
  ``"<time.monotonic()> <lag ms>"``, flushed every half second (``lag_p99`` reads the
  samples inside a load window).
* ``--no-group-commit``: one store commit per create (``open_server(group_commit=False)``).
* ``--unbounded-task-queue``: no LMSP queued-task cap (``LmspConfig(max_queued_tasks=None)``),
  so a create benchmark never sees a 503.
* ``--subscriber-max-queued N``: the bridge's per-subscriber frame queue.

Spawned with ``tests.harness.ServeProcess(..., runner=["-m", "bench.server", ...])``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from typing import Any

import anyio

from acp_server import cli, serve_cli
from acp_server.lmsp import LmspConfig

INTERVAL_S = 0.001
FLUSH_S = 0.5


async def probe(path: str) -> None:
    samples: list[str] = []
    flushed = time.monotonic()
    with open(path, "a") as out:
        try:
            while True:
                before = time.monotonic()
                await anyio.sleep(INTERVAL_S)
                now = time.monotonic()
                samples.append(f"{now:.6f} {(now - before - INTERVAL_S) * 1000:.3f}\n")
                if now - flushed >= FLUSH_S:
                    out.writelines(samples)
                    out.flush()
                    samples.clear()
                    flushed = now
        finally:
            out.writelines(samples)


def lag_p99(path: str, start: float, end: float) -> tuple[float, float, int]:
    """(p50, p99, samples) in ms of the probe's samples taken in ``[start, end]``."""
    lags = []
    with open(path) as f:
        for line in f:
            at, lag = line.split()
            if start <= float(at) <= end:
                lags.append(float(lag))
    if not lags:
        return float("nan"), float("nan"), 0
    lags.sort()
    return lags[len(lags) // 2], lags[min(len(lags) - 1, int(len(lags) * 0.99))], len(lags)


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="python -m bench.server")
    parser.add_argument("--lag-probe", metavar="FILE")
    parser.add_argument("--no-group-commit", dest="group_commit", action="store_false")
    parser.add_argument("--unbounded-task-queue", action="store_true")
    parser.add_argument("--subscriber-max-queued", type=int)
    return parser.parse_known_args(argv)


def main(argv: list[str]) -> int:
    knobs, rest = parse(argv)
    serve = serve_cli.serve
    overrides: dict[str, Any] = {"group_commit": knobs.group_commit}
    if knobs.unbounded_task_queue:
        overrides["lmsp_config"] = LmspConfig(max_queued_tasks=None)

    async def bench_serve(settings: serve_cli.Settings, **kwargs: Any) -> None:
        if knobs.subscriber_max_queued is not None:
            options = dataclasses.replace(settings.options,
                                          subscriber_max_queued=knobs.subscriber_max_queued)
            settings = dataclasses.replace(settings, options=options)
        async with anyio.create_task_group() as tg:
            if knobs.lag_probe:
                tg.start_soon(probe, knobs.lag_probe)
            await serve(settings, **kwargs, **overrides)
            tg.cancel_scope.cancel()

    serve_cli.serve = bench_serve  # type: ignore[assignment]
    return cli.main(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
