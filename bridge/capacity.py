"""The session cap, and each agent's share of it.

    capacity = SessionCapacity(limit=32, agents=["reference", "qwen"])
    capacity.take("qwen")          # SessionLimitExceededError when there is no room
    ...                            # the slot is held while the session is made and lives
    capacity.release("qwen")       # exactly once per take
    await capacity.changed.wait()  # a slot was released

The rule (``--max-sessions N`` with ``k`` configured agents):

* A slot is taken when a session starts being made (``session/new``, ``load``,
  ``resume``, ``fork``) and held until the session is gone; a spawn that fails, times
  out or is abandoned by its caller gives it back at once. At most ``N`` slots are
  taken in all.
* Every agent is guaranteed ``reserve = N // (2k)`` slots (none with one agent, or
  when ``N < 2k``): an agent may take a slot only while every other agent can still
  get its reserve, i.e. while it holds fewer than
  ``share(agent) = N - sum(max(reserve, held(other)) for each other agent)``.

So one agent that hangs or fails (32 ``session/new`` that are never answered) holds
at most its share, never another agent's reserve, and an agent alone uses the whole
cap. With ``N`` unlimited there is no cap and no share.

Agents come and go while the server runs (``--model-server``'s models are listed
again, ``bridge.agents.catalog``): ``add(agent)`` makes ``k`` one more (the reserve is
computed again; slots already held stay held). A slot may be held under a name that is
not (yet) an agent: a session restored from the journal whose model is not listed
(``bridge.restore``) holds its slot on its own agent's name. Such a name counts what it
holds against the others' shares, and gets no reserve until ``add`` makes it an agent.
"""

from __future__ import annotations

from collections.abc import Iterable

from bridge.errors import SessionLimitExceededError
from bridge.wakeup import Wakeup


class SessionCapacity:
    def __init__(self, limit: int | None, agents: Iterable[str]) -> None:
        self.limit = limit
        self._agents = dict.fromkeys(agents)   # the agents, in order (a reserve each)
        self._held = dict.fromkeys(self._agents, 0)   # those, and any name holding a slot
        self.reserve = 0
        self._reserve()
        self.taken = 0
        self.changed = Wakeup()   # set whenever a slot is released

    def add(self, agent: str) -> None:
        """``agent`` is an agent from now on (a model listed later); no-op if it was."""
        if agent not in self._agents:
            self._agents[agent] = None
            self._held.setdefault(agent, 0)
            self._reserve()

    def _reserve(self) -> None:
        count, limit = len(self._agents), self.limit
        self.reserve = limit // (2 * count) if limit is not None and count > 1 else 0

    def held(self, agent: str) -> int:
        return self._held.get(agent, 0)

    def share(self, agent: str) -> int | None:
        """The most slots ``agent`` may hold now (``None``: no cap)."""
        if self.limit is None:
            return None
        others = sum(max(self.reserve, held) if name in self._agents else held
                     for name, held in self._held.items() if name != agent)
        return self.limit - others

    def available(self, agent: str) -> bool:
        return self._refusal(agent) is None

    def check(self, agent: str) -> None:
        refusal = self._refusal(agent)
        if refusal is not None:
            raise refusal

    def take(self, agent: str) -> None:
        """Take one slot for ``agent`` or raise ``SessionLimitExceededError``."""
        self.check(agent)
        self._held[agent] = self._held.get(agent, 0) + 1
        self.taken += 1

    def release(self, agent: str) -> None:
        self._held[agent] -= 1
        self.taken -= 1
        self.changed.set()

    def _refusal(self, agent: str) -> SessionLimitExceededError | None:
        limit = self.limit
        if limit is None:
            return None
        if self.taken >= limit:
            return SessionLimitExceededError(limit)
        share = self.share(agent)
        assert share is not None
        if self.held(agent) >= share:
            return SessionLimitExceededError(share, scope="agent", agent=agent)
        return None


__all__ = ["SessionCapacity"]
