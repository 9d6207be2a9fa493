"""The session journal's cost (issue #23): the same REST runs with the durable journal
on SQLite (``--session-journal store``, the default: publish after commit) and with
the in-memory one (``--session-journal memory``).

    python -m bench journal

Rows: prompts accepted and completed per second (16 connections for ``SECONDS``, then
until nothing is pending), store / memory; one SSE reader of a 10,000-chunk burst,
events/s with journaling on, and store / memory.
"""

from __future__ import annotations

import asyncio
import tempfile
import time

import httpx

from bench.http_bench import (
    BURST,
    PROMPT,
    SHIPPED,
    _burst,
    accepted_only,
    acp_server,
    create_session,
    drained,
    load,
)
from bench.targets import record

ACCEPTED: dict[str, float] = {}   # 202s per second while loading, by journal


def accepted_and_completed(workspace: str, journal: str) -> float:
    """Prompts/s accepted (202) and completed, one session, no cap."""
    with acp_server(workspace, 0, None, "--http-server", SHIPPED,
                    "--session-journal", journal) as port:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
            sid = create_session(client)
        start = time.monotonic()
        accepted = load(port, f"/session/{sid}/prompt", PROMPT)
        assert accepted_only(accepted), accepted
        done = accepted["requests"] / (drained(port) - start)
        ACCEPTED[journal] = accepted["rps"]
        return done


def burst(workspace: str, journal: str) -> float:
    with acp_server(workspace, 0, None, "--http-server", SHIPPED,
                    "--session-journal", journal) as port:
        events, seconds = asyncio.run(_burst(port, 1, BURST))
    return events / seconds


def main() -> list[str]:
    with tempfile.TemporaryDirectory() as workspace:
        completed = {j: accepted_and_completed(workspace, j) for j in ("memory", "store")}
        events = {j: burst(workspace, j) for j in ("memory", "store")}
    record("REST accepted and completed, durable journal (SQLite) / in-memory journal",
           completed["store"] / completed["memory"], 0.8)
    record("REST one reader, 10,000-chunk burst, events/s, durable journal", events["store"],
           100_000)
    return ["## Session journal (REST, one run each)", "",
            "| run | in-memory journal | durable journal (SQLite) | ratio |",
            "|---|---:|---:|---:|",
            f"| prompts accepted and completed, /s | {completed['memory']:,.0f} | "
            f"{completed['store']:,.0f} | {completed['store'] / completed['memory']:.2f} |",
            f"| of which accepted (202) while loading, /s | {ACCEPTED['memory']:,.0f} | "
            f"{ACCEPTED['store']:,.0f} | {ACCEPTED['store'] / ACCEPTED['memory']:.2f} |",
            f"| one reader, {BURST:,}-chunk burst, events/s | {events['memory']:,.0f} | "
            f"{events['store']:,.0f} | {events['store'] / events['memory']:.2f} |"]
