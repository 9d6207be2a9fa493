from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio

from bridge import Bridge, BridgeOptions, Event, wire
from tests.bridge.scripted_agent import ScriptedAgent


@asynccontextmanager
async def open_bridge(workspace: Any, **options: Any) -> AsyncIterator[tuple[Bridge, ScriptedAgent]]:
    agent = ScriptedAgent()
    async with Bridge(agent, workspace_cwd=str(workspace), options=BridgeOptions(**options)) as bridge:
        yield bridge, agent


async def wait_until(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    """Until ``predicate()`` holds; ``timeout`` only bounds a hang (a loaded machine
    may not run this process for seconds)."""
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.001)


def text(value: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": value}]


def drain(subscription: Any) -> list[Any]:
    """Frames ready right now, without waiting."""
    frames = []
    while (frame := subscription.receive_nowait()) is not None:
        frames.append(frame)
    return frames


def envelope(event: Event) -> wire.EventEnvelope:
    """The event as a REST reader gets it (its ``bridge.wire`` envelope, decoded)."""
    return wire.decode_envelope(wire.envelope(event))
