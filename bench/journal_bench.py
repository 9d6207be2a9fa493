"""The session journal's cost (issue #23): the same REST runs with the durable journal
on SQLite (``--session-journal store``, the default: publish after commit), with it
and a bounded write-behind window for events (``--session-write-behind WINDOW``), and
with the in-memory one (``--session-journal memory``), in that order, each run once.

    python -m bench journal

Rows: prompts accepted and completed per second (16 connections for ``SECONDS``, then
until nothing is pending), store / memory; one SSE reader of a 10,000-chunk burst,
events/s with journaling on, and store / memory (``warm_burst``: the median of three
bursts after one of warm-up).
"""

from __future__ import annotations

import tempfile
import time

import httpx

from bench.http_bench import (
    BURST,
    PROMPT,
    SHIPPED,
    accepted_only,
    acp_server,
    create_session,
    drained,
    latency,
    load,
    warm_burst,
)
from bench.targets import record

ACCEPTED: dict[str, float] = {}   # 202s per second while loading, by journal
WINDOW = 1024
JOURNALS = {"memory": ("--session-journal", "memory"),
            "store": ("--session-journal", "store"),
            "behind": ("--session-journal", "store", "--session-write-behind", str(WINDOW))}


def accepted_and_completed(workspace: str, journal: str) -> float:
    """Prompts/s accepted (202) and completed, one session, no cap."""
    with acp_server(workspace, 0, None, "--http-server", SHIPPED, *JOURNALS[journal]) as port:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
            sid = create_session(client)
        start = time.monotonic()
        accepted = load(port, f"/session/{sid}/prompt", PROMPT)
        assert accepted_only(accepted), accepted
        done = accepted["requests"] / (drained(port) - start)
        ACCEPTED[journal] = accepted["rps"]
        return done


def burst(workspace: str, journal: str) -> tuple[float, float, float]:
    """One reader's events/s of a burst, then turn latency (POST -> ``turn_complete``
    on the open stream, sequential turns): p50 and p99 in ms."""
    with acp_server(workspace, 0, None, "--http-server", SHIPPED, *JOURNALS[journal]) as port:
        events, seconds = warm_burst(port, 1, BURST)
        p50, p99 = latency(port)
    return events / seconds, p50, p99


def main() -> list[str]:
    with tempfile.TemporaryDirectory() as workspace:
        completed = {j: accepted_and_completed(workspace, j) for j in JOURNALS}
        bursts = {j: burst(workspace, j) for j in JOURNALS}
    events = {j: b[0] for j, b in bursts.items()}
    p50 = {j: b[1] for j, b in bursts.items()}
    p99 = {j: b[2] for j, b in bursts.items()}
    record("REST accepted and completed, durable journal (SQLite) / in-memory journal",
           completed["store"] / completed["memory"], 0.8)
    record("REST one reader, 10,000-chunk burst, events/s, durable journal", events["store"],
           100_000)
    record(f"REST one reader, 10,000-chunk burst, events/s, durable journal, write-behind "
           f"{WINDOW}", events["behind"], 100_000)

    def row(name: str, by: dict[str, float], digits: int = 0) -> str:
        return (f"| {name} | {by['memory']:,.{digits}f} | {by['store']:,.{digits}f} | "
                f"{by['store'] / by['memory']:.2f} | {by['behind']:,.{digits}f} | "
                f"{by['behind'] / by['memory']:.2f} |")

    return ["## Session journal (REST, one run each)", "",
            "| run | in-memory journal | durable (SQLite), publish after commit | ratio | "
            f"durable, write-behind {WINDOW} | ratio |",
            "|---|---:|---:|---:|---:|---:|",
            row("prompts accepted and completed, /s", completed),
            row("of which accepted (202) while loading, /s", ACCEPTED),
            row(f"one reader, {BURST:,}-chunk burst, events/s", events),
            row("turn latency p50 (POST -> turn_complete), ms", p50, 2),
            row("turn latency p99, ms", p99, 2)]
