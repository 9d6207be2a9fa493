"""``acp-server serve`` with an event-loop lag probe beside it, for the benchmarks only.

    python -m bench.probed_server /tmp/lag.txt serve --port 0 --workspace /tmp/w
    # acp-server listening on http://127.0.0.1:41234 (...); /tmp/lag.txt gains lines
    # "<time.monotonic()> <lag ms>", flushed every half second

The probe is a task in the server's event loop that sleeps ``INTERVAL_S`` and records
how late it woke (``lag = elapsed - INTERVAL_S``). It wraps ``acp_server.cli.serve``
from the outside, so the server itself carries nothing for it; the bench reads the
samples whose time falls inside its load window.
"""

from __future__ import annotations

import sys
import time

import anyio

from acp_server import cli

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


def main() -> int:
    path, argv = sys.argv[1], sys.argv[2:]
    serve = cli.serve

    async def probed(settings: cli.Settings) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(probe, path)
            await serve(settings)
            tg.cancel_scope.cancel()

    cli.serve = probed  # type: ignore[assignment]
    return cli.main(argv)


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


if __name__ == "__main__":
    sys.exit(main())
