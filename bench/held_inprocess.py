"""The bridge's held path alone: ``bench.journal_inprocess``'s runs on a durable
journal whose commits land at once on the event loop (no writer thread, no SQL), so
what is left over the in-memory journal is the bridge's held-events path and the
journal's own bookkeeping.

    python -m bench.held_inprocess                 # memory and instant, 3 rounds
    python -m bench.held_inprocess instant 5       # only the instant journal
    python -m bench.held_inprocess instant prompts profile   # cProfile one run

Journals (any of them, in that order each round): ``memory``; ``memyield`` (in
memory, each client giving the loop a turn after each prompt, as the 202's wait
does); ``minsync`` (``MinimalJournal`` landing each record as it is appended);
``minimal`` (``MinimalJournal``: records land on the loop's next turn, each waiter
woken once); ``instant`` (the store's journal over ``InstantStore``); ``store``
(SQLite); ``behind`` (SQLite, write-behind window 1,024).

The stand-in store queues nothing: ``submit`` takes the commit's records at once
(``prepare``) and lands it on the loop's next turn (``on_done``), as a store whose
commits took no time would. Reads and everything else go to a real SQLite store.
"""

from __future__ import annotations

import asyncio
import cProfile
import json
import os
import pstats
import sys
import tempfile
from typing import Any

import anyio

from acp_server.store.sessions import StoreSessionJournal
from acp_server.store.sqlite import SqliteTaskStore
from bench import journal_inprocess as ji
from bridge import Bridge, BridgeOptions
from bridge.agents.reference import ReferenceAgentFactory
from bridge.journal import EventRecord, MemoryJournal


async def _prompts_yielding(bridge: Bridge, sid: str) -> dict[str, float]:
    """``journal_inprocess._prompts`` with a client that gives the loop a turn after
    each prompt (as a durable journal's wait does): the in-memory journal's schedule
    made like the durable one's, to tell scheduling from the held path's own work."""
    import time
    left = [ji.PROMPTS]
    tickets: list[Any] = []

    async def client() -> None:
        while left[0] > 0:
            left[0] -= 1
            ticket = bridge.send_prompt(sid, ji.CHUNK)
            tickets.append(ticket)
            await ticket.committed()
            await anyio.sleep(0)

    cpu, main, wall = time.process_time(), time.thread_time(), time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(ji.CLIENTS):
            tg.start_soon(client)
    for ticket in tickets:
        await ticket
    return {"prompt_us": (time.process_time() - cpu) / ji.PROMPTS * 1e6,
            "prompt_main_us": (time.thread_time() - main) / ji.PROMPTS * 1e6,
            "prompts_s": ji.PROMPTS / (time.perf_counter() - wall)}


class MinimalJournal:
    """A durable journal of the least bookkeeping: records land on the loop's next
    turn, each waiter woken once, by the commit that carries its record. What the
    bridge's held path costs with a journal that costs ~nothing."""

    durable = True

    def __init__(self, sync: bool = False) -> None:
        self.sync = sync   # each record lands as it is appended: nobody ever waits
        self._next = 1
        self._pending: list[Any] = []
        self._through = 0
        self._waiters: list[tuple[int, Any]] = []
        self._on_events: Any = lambda records: None
        self.commits = 0

    def bind(self, on_events: Any) -> None:
        self._on_events = on_events

    def append(self, record: Any) -> int:
        seq = self._next
        self._next += 1
        if not self._pending and not self.sync:
            asyncio.get_running_loop().call_soon(self._land)
        self._pending.append(record)
        if self.sync:
            self._land()
        return seq

    @property
    def appended(self) -> int:
        return self._next - 1

    def _land(self) -> None:
        batch, self._pending = self._pending, []
        self.commits += 1
        self._through = self._next - 1
        newest = {}
        for record in batch:
            if type(record) is EventRecord:
                newest[record.session_id, record.epoch] = record
        if newest:
            self._on_events(list(newest.values()))
        waiters, self._waiters = self._waiters, []
        for seq, event in waiters:
            event.set()

    async def wait(self, seq: int, *, fail_fast: bool = False) -> None:
        if seq <= self._through or seq == 0:
            return
        event = anyio.Event()
        self._waiters.append((seq, event))
        await event.wait()

    def hold(self, session_id: str, held: bool) -> None:
        pass

    async def restore(self) -> list[Any]:
        return []

    async def record_of(self, session_id: str) -> Any:
        return None

    async def read(self, session_id: str, *, seed: bool = False) -> Any:
        return None

    async def ended(self, *, before: Any, limit: int) -> list[Any]:
        return []

    async def purge(self, closed_before: float, max_bytes: int = 0) -> int:
        return 0

    async def aclose(self) -> None:
        return None


class InstantStore:
    """A store whose journal commits land at once on the loop (see the module)."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.commits = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def submit(self, op: Any) -> bool:
        if op.prepare is not None:
            op.prepare()
        op.result = ({}, set(), ())
        self.commits += 1
        asyncio.get_running_loop().call_soon(op.on_done, op)
        return True


async def _one(journal_name: str, run: str, profile: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        factory = ReferenceAgentFactory()
        options = BridgeOptions(max_pending_prompts_per_session=0)
        real = None
        if journal_name in ("minimal", "minsync"):
            journal = store = MinimalJournal(sync=journal_name == "minsync")
        elif journal_name in ("memory", "memyield"):
            journal: Any = MemoryJournal()
            store = None
        else:
            real = SqliteTaskStore(os.path.join(folder, "store.db"))
            await real.__aenter__()
            store = InstantStore(real) if journal_name == "instant" else real
            journal = StoreSessionJournal(store, write_behind=1024 if journal_name == "behind"
                                          else 0)
            await journal.__aenter__()
        try:
            async with Bridge(factory, workspace_cwd=folder, options=options,
                              journal=journal) as bridge:
                prompts = _prompts_yielding if journal_name in ("memyield", "minsync") \
                    else ji._prompts
                chosen = prompts if run == "prompts" else ji._burst

                async def profiled(bridge: Bridge, sid: str) -> dict[str, float]:
                    prof = cProfile.Profile() if profile else None
                    if prof:
                        prof.enable()
                    figures = await chosen(bridge, sid)
                    if prof:
                        prof.disable()
                        pstats.Stats(prof).sort_stats("tottime").print_stats(45)
                    return figures

                return await ji.measured(bridge, folder, store, profiled,
                                         prompts=run == "prompts")
        finally:
            if real is not None:
                await journal.__aexit__(None, None, None)
                await real.__aexit__(None, None, None)


def main(journals: list[str], rounds: int, runs: tuple[str, ...], profile: bool) -> None:
    out: dict[str, list[dict[str, float]]] = {j: [] for j in journals}
    for _ in range(rounds):
        for name in journals:
            figures: dict[str, float] = {}
            for run in runs:
                figures.update(anyio.run(_one, name, run, profile, backend="asyncio",
                                         backend_options={"use_uvloop": True}))
            out[name].append(figures)
            print(name, " ".join(f"{k} {v:,.2f}" for k, v in figures.items()),
                  file=sys.stderr, flush=True)
    print(json.dumps({j: {k: sorted(r[k] for r in rows)[len(rows) // 2] for k in rows[0]}
                      for j, rows in out.items()}))


if __name__ == "__main__":
    args = sys.argv[1:]
    names = [a for a in args if a in ("memory", "memyield", "minsync", "minimal", "instant", "store",
                                   "behind")] or ["memory", "instant"]
    runs = tuple(a for a in args if a in ji.RUNS) or ji.RUNS
    count = next((int(a) for a in args if a.isdigit()), 1 if "profile" in args else 3)
    main(names, count, runs, "profile" in args)
