"""The 503 path in process on uvicorn's own HTTP/1.1 request cycle: CPU µs per refused
prompt of our app called with a real ``RequestResponseCycle``'s ``receive`` and
``send`` (its parser's work not included: the cycle is made with the whole body in
hand, as uvicorn makes it for wrk's small POSTs), so the front layer's uvicorn-only
paths (``acp_server.http.whole``: one write per answer, no body clock for a body in
hand) are measured, which ``bench.inprocess``'s plain callables never take.

    python -m bench.uvicorn_inprocess   # ours_uvicorn 11.40 µs (the best of 6 batches)

The cycle's making (~2 µs) is in the figure, the same on both sides of a comparison.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import anyio
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from bench import inprocess

BATCHES = 6
LOGGER = logging.getLogger("bench.uvicorn_inprocess")


class _Transport:
    """What the cycle writes to: counted, dropped."""

    def __init__(self) -> None:
        self.writes = 0

    def write(self, data: bytes) -> None:
        self.writes += 1

    def close(self) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


def _cycle(path: str, transport: _Transport, flow: FlowControl) -> RequestResponseCycle:
    """uvicorn's cycle of one POST whose body has all arrived (its message event set)."""
    event = asyncio.Event()
    cycle = RequestResponseCycle(inprocess._scope(path), transport, flow, LOGGER, LOGGER, False,
                                 [(b"server", b"uvicorn")], event, False, True, lambda: None)
    cycle.body, cycle.more_body = bytearray(inprocess.BODY), False
    event.set()
    return cycle


async def measure() -> dict[str, float]:
    async with inprocess._served(pending_limit=1, first=inprocess.HOLD) as (server, sid):
        path = f"/session/{sid}/prompt"
        transport = _Transport()
        flow = FlowControl(transport)  # type: ignore[arg-type]
        best = float("inf")
        for _ in range(BATCHES):
            inprocess.flush_access_writer()
            start = time.thread_time()
            for _ in range(inprocess.CALLS):
                cycle = _cycle(path, transport, flow)
                await server.app(cycle.scope, cycle.receive, cycle.send)
            best = min(best, (time.thread_time() - start) / inprocess.CALLS * 1e6)
        assert transport.writes == BATCHES * inprocess.CALLS, transport.writes  # one a 503
        return {"ours_uvicorn": best}


if __name__ == "__main__":
    figures = anyio.run(measure, backend="asyncio", backend_options={"use_uvloop": True})
    print(", ".join(f"{name} {us:.2f} µs" for name, us in figures.items()))
