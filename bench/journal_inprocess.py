"""The session journal's cost in process: CPU µs per prompt and per event of the
``Bridge`` with the reference agent, on the in-memory journal and on the durable one
(SQLite), no HTTP, no other process.

    python -m bench.journal_inprocess              # both journals, interleaved, 3 rounds
    python -m bench.journal_inprocess store 5      # only the durable journal, 5 rounds
    python -m bench.journal_inprocess store prompts 9   # only the prompts run, 9 rounds

Two runs each round (or the one named: ``prompts`` or ``burst``), each on a fresh
bridge (and a fresh store file):

* *prompts*: ``CLIENTS`` concurrent callers each ``send_prompt`` a ``/chunks 1``
  prompt and await ``ticket.committed()`` (the 202's wait), ``PROMPTS`` in all, then
  every ticket; CPU µs per prompt of the process (``time.process_time``) and of the
  event loop's thread (``time.thread_time``), and commits per prompt.
* *burst*: one subscriber reads a ``BURST``-chunk prompt's events; CPU µs per event
  and events/s of wall time.

The figures are what the journal adds to a turn, apart from HTTP: decide a change by
them (interleaved before/after), where the HTTP rows swing with the machine's load.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from acp_server.store.sessions import StoreSessionJournal
from acp_server.store.sqlite import SqliteTaskStore
from bridge import Bridge, BridgeOptions
from bridge.agents.reference import ReferenceAgentFactory
from bridge.journal import MemoryJournal

CLIENTS = int(os.environ.get("BENCH_JOURNAL_CLIENTS", "16"))
PROMPTS = int(os.environ.get("BENCH_JOURNAL_PROMPTS", "4000"))
BURST = 10_000
CHUNK = [{"type": "text", "text": "/chunks 1 ping"}]


async def _prompts(bridge: Bridge, sid: str) -> dict[str, float]:
    left = [PROMPTS]
    tickets: list[Any] = []

    async def client() -> None:
        while left[0] > 0:
            left[0] -= 1
            ticket = bridge.send_prompt(sid, CHUNK)
            tickets.append(ticket)
            await ticket.committed()

    cpu, main, wall = time.process_time(), time.thread_time(), time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(CLIENTS):
            tg.start_soon(client)
    for ticket in tickets:
        await ticket
    return {"prompt_us": (time.process_time() - cpu) / PROMPTS * 1e6,
            "prompt_main_us": (time.thread_time() - main) / PROMPTS * 1e6,
            "prompts_s": PROMPTS / (time.perf_counter() - wall)}


async def _burst(bridge: Bridge, sid: str) -> dict[str, float]:
    subscription = bridge.subscribe(sid)
    seen = 0
    cpu, main, wall = time.process_time(), time.thread_time(), time.perf_counter()
    ticket = bridge.send_prompt(sid, [{"type": "text", "text": f"/chunks {BURST} " + "w" * BURST}])
    await ticket.committed()
    async for event in subscription:
        if event.type == "session_update" and event.prompt_id == ticket.prompt_id:
            seen += 1   # the echo of the prompt, then its chunks
        elif event.type == "turn_complete" and event.prompt_id == ticket.prompt_id:
            break
    subscription.close()
    assert seen == BURST + 1, seen
    wall = time.perf_counter() - wall
    return {"event_us": (time.process_time() - cpu) / BURST * 1e6,
            "event_main_us": (time.thread_time() - main) / BURST * 1e6,
            "events_s": BURST / wall}


async def measured(bridge: Bridge, folder: str, store: Any,
                   run: Callable[[Bridge, str], Awaitable[dict[str, float]]], *,
                   prompts: bool) -> dict[str, float]:
    """``run``'s figures on a new session whose agent has started (a prompt first), the
    garbage collector frozen meanwhile; ``prompts``: with the store's commits a prompt
    (``store``: one with a ``commits`` count, or ``None``)."""
    sid = (await bridge.create_session(cwd=folder)).session_id
    await bridge.send_prompt(sid, CHUNK)   # the agent started, warm
    gc.collect()
    gc.freeze()
    commits = store.commits if store is not None else 0
    figures = await run(bridge, sid)
    if store is not None and prompts:
        figures["commits_per_prompt"] = (store.commits - commits) / PROMPTS
    gc.unfreeze()
    return figures


async def _one(journal_name: str, run: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        factory = ReferenceAgentFactory()
        options = BridgeOptions(max_pending_prompts_per_session=0)
        if journal_name == "memory":
            store = None
            journal: Any = MemoryJournal()
        else:
            store = SqliteTaskStore(os.path.join(folder, "store.db"))
            await store.__aenter__()
            journal = StoreSessionJournal(store)
            await journal.__aenter__()
        try:
            async with Bridge(factory, workspace_cwd=folder, options=options,
                              journal=journal) as bridge:
                return await measured(bridge, folder, store,
                                      _prompts if run == "prompts" else _burst,
                                      prompts=run == "prompts")
        finally:
            if store is not None:
                await journal.__aexit__(None, None, None)
                await store.__aexit__(None, None, None)


RUNS = ("prompts", "burst")


def main(journals: list[str], rounds: int, runs: tuple[str, ...] = RUNS
         ) -> dict[str, list[dict[str, float]]]:
    out: dict[str, list[dict[str, float]]] = {j: [] for j in journals}
    for _ in range(rounds):
        for journal_name in journals:
            figures: dict[str, float] = {}
            for run in runs:
                figures.update(anyio.run(_one, journal_name, run, backend="asyncio",
                                         backend_options={"use_uvloop": True}))
            out[journal_name].append(figures)
            print(journal_name, " ".join(f"{k} {v:,.2f}" for k, v in figures.items()),
                  file=sys.stderr, flush=True)
    return out


if __name__ == "__main__":
    names = [a for a in sys.argv[1:] if not a.isdigit() and a not in RUNS] or ["memory", "store"]
    if unknown := [n for n in names if n not in ("memory", "store")]:
        sys.exit(f"usage: python -m bench.journal_inprocess [memory] [store] "
                 f"[{'|'.join(RUNS)}] [rounds]; not a journal or a run: {', '.join(unknown)}")
    count = next((int(a) for a in sys.argv[1:] if a.isdigit()), 3)
    result = main(names, count, tuple(a for a in sys.argv[1:] if a in RUNS) or RUNS)
    print(json.dumps({j: {k: sorted(r[k] for r in rows)[len(rows) // 2] for k in rows[0]}
                      for j, rows in result.items()}))
