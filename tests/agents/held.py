"""An in-process test agent: the reference agent, its prompts held until the test lets
each one through (a turn that lasts exactly as long as the test needs, whatever the
machine's load: no race with a ``/sleep``).

    agent = HeldAgent()                                  # every prompt held
    async with running_lmsp(tmp_path, agent_factory=agent) as srv:
        await srv.create("t0")
        turn = await agent.arrived(1)                     # the first prompt waits
        turn.text, agent.in_flight, agent.peak            # "t0", 1, 1
        turn.release()                                    # the reference agent runs it

``HeldAgent(hold=lambda text: text.startswith("held "))`` holds only the prompts whose
text (the first text block) matches; the others run at once. Contracts:

* a held prompt reaches the reference agent, unchanged, only after ``release()``; a
  ``session/cancel`` of its session meanwhile does not end it (the test releases it);
* ``in_flight`` counts the ``session/prompt`` calls entered and not yet answered (held
  or running), ``peak`` its highest value so far, ``turns`` every held prompt in the
  order they arrived;
* ``arrived(n)`` returns the ``n``-th held prompt once it is there (waits on a
  condition, bounded by ``timeout`` only against a hang).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc

from bridge.agents.reference import ReferenceAgentFactory, ReferenceConnection


@dataclass
class Turn:
    """One held prompt: its text and session; ``release()`` lets it run."""

    text: str
    session_id: str
    _gate: anyio.Event = field(default_factory=anyio.Event)

    def release(self) -> None:
        self._gate.set()

    @property
    def released(self) -> bool:
        return self._gate.is_set()


class _HeldConnection:
    def __init__(self, inner: ReferenceConnection, agent: HeldAgent) -> None:
        self.inner = inner
        self.agent = agent

    @property
    def closed(self) -> bool:
        return self.inner.closed

    async def request(self, method: str, params: Any) -> Any:
        if method != "session/prompt":
            return await self.inner.request(method, params)
        agent = self.agent
        agent.in_flight += 1
        agent.peak = max(agent.peak, agent.in_flight)
        try:
            text = next((b.get("text", "") for b in params.get("prompt", [])
                         if b.get("type") == "text"), "")
            if agent.hold(text):
                turn = Turn(text, params.get("sessionId", ""))
                agent.turns.append(turn)
                agent._changed()
                await turn._gate.wait()
            return await self.inner.request(method, params)
        finally:
            agent.in_flight -= 1
            agent._changed()

    async def notify(self, method: str, params: Any) -> None:
        await self.inner.notify(method, params)

    async def aclose(self) -> None:
        await self.inner.aclose()


class HeldAgent:
    """``AgentFactory`` (name ``"reference"``): see the module docstring."""

    name = "reference"

    def __init__(self, hold: Callable[[str], bool] = lambda text: True) -> None:
        self.hold = hold
        self.inner = ReferenceAgentFactory()
        self.turns: list[Turn] = []
        self.in_flight = 0
        self.peak = 0
        self._event = anyio.Event()

    def _changed(self) -> None:
        self._event.set()
        self._event = anyio.Event()

    async def connect(self, client: Any, task_group: anyio.abc.TaskGroup) -> _HeldConnection:
        return _HeldConnection(await self.inner.connect(client, task_group), self)

    async def until(self, condition: Callable[[], bool], timeout: float = 30) -> None:
        """Wait until ``condition()`` holds, checked at every prompt's entry and end."""
        with anyio.fail_after(timeout):
            while not condition():
                await self._event.wait()

    async def arrived(self, n: int, timeout: float = 30) -> Turn:
        await self.until(lambda: len(self.turns) >= n, timeout)
        return self.turns[n - 1]
