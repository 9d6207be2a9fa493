"""Bridge benchmarks: admission cost and prompt throughput, per anyio backend.

    python -m bench bridge

* ``send_prompt`` accepted / rejected: µs per call, measured over batches of calls
  with no ``await`` in between (the admission path only).
* prompts/s through the reference agent, in process and over stdio: sequential
  turns (each awaited before the next) and a pipelined batch (all admitted, then
  awaited), each a one-chunk echo.
"""

from __future__ import annotations

import sys
import tempfile
import time
from typing import Any

import anyio

from bench.targets import record
from bridge import Bridge, BridgeOptions
from bridge.agents.reference import ReferenceAgentFactory
from bridge.agents.stdio import StdioAgentFactory
from bridge.errors import PromptQueueFullError

PROMPT = [{"type": "text", "text": "/chunks 1 ping"}]
HOLD = [{"type": "text", "text": "/sleep 30s hold"}]


async def admission_costs(workspace: str, calls: int = 20_000) -> dict[str, float]:
    options = BridgeOptions(max_pending_prompts_per_session=0, subscriber_max_queued=2048)
    async with Bridge(ReferenceAgentFactory(), workspace_cwd=workspace, options=options) as bridge:
        sid = (await bridge.create_session()).session_id
        bridge.send_prompt(sid, HOLD)  # keeps everything after it queued
        best = float("inf")
        for _ in range(5):
            batch = 1000
            start = time.perf_counter()
            for _ in range(batch):
                bridge.send_prompt(sid, PROMPT)
            best = min(best, (time.perf_counter() - start) / batch)
            for entry in bridge.pending_prompts(sid)[1:]:
                bridge.remove_pending_prompt(sid, entry.prompt_id)
        accepted_us = best * 1e6
    options = BridgeOptions(max_pending_prompts_per_session=5)
    async with Bridge(ReferenceAgentFactory(), workspace_cwd=workspace, options=options) as bridge:
        sid = (await bridge.create_session()).session_id
        for _ in range(5):
            bridge.send_prompt(sid, HOLD)
        start = time.perf_counter()
        for _ in range(calls):
            try:
                bridge.send_prompt(sid, PROMPT)
            except PromptQueueFullError:
                pass
        rejected_us = (time.perf_counter() - start) / calls * 1e6
        await bridge.cancel_session(sid)
    return {"accepted_us": accepted_us, "rejected_us": rejected_us}


async def throughput(factory: Any, workspace: str, sequential: int, pipelined: int) -> dict[str, float]:
    options = BridgeOptions(max_pending_prompts_per_session=0)
    async with Bridge(factory, workspace_cwd=workspace, options=options) as bridge:
        sid = (await bridge.create_session()).session_id
        await bridge.send_prompt(sid, PROMPT)   # warm up
        start = time.perf_counter()
        for _ in range(sequential):
            await bridge.send_prompt(sid, PROMPT)
        seq_rate = sequential / (time.perf_counter() - start)
        start = time.perf_counter()
        tickets = [bridge.send_prompt(sid, PROMPT) for _ in range(pipelined)]
        for ticket in tickets:
            await ticket
        pipe_rate = pipelined / (time.perf_counter() - start)
    return {"sequential_per_s": seq_rate, "pipelined_per_s": pipe_rate}


async def run_backend() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as workspace:
        stdio = StdioAgentFactory([sys.executable, "-m", "bridge.agents.reference"], cwd=workspace)
        return {
            "admission": await admission_costs(workspace),
            "in_process": await throughput(ReferenceAgentFactory(), workspace, 2000, 2000),
            "stdio": await throughput(stdio, workspace, 1000, 1000),
        }


def main() -> list[str]:
    lines = ["## bridge (reference agent)", "",
             "| backend | send_prompt accepted µs | send_prompt rejected µs | in-process seq prompts/s "
             "| in-process pipelined prompts/s | stdio seq prompts/s | stdio pipelined prompts/s |",
             "|---|---|---|---|---|---|---|"]
    for backend in ("asyncio", "trio"):
        r = anyio.run(run_backend, backend=backend)
        record(f"`send_prompt` refused ({backend}), µs", r["admission"]["rejected_us"], 1.5,
               lower_is_better=True)
        lines.append(
            f"| {backend} | {r['admission']['accepted_us']:.2f} | {r['admission']['rejected_us']:.2f} "
            f"| {r['in_process']['sequential_per_s']:.0f} | {r['in_process']['pipelined_per_s']:.0f} "
            f"| {r['stdio']['sequential_per_s']:.0f} | {r['stdio']['pipelined_per_s']:.0f} |")
    return lines
