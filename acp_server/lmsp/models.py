"""LMSP's models: which bridge and agent a task's ``model`` runs on.

    models = BridgeModels(bridge)            # every agent of the bridge, by its name
    models["qwen3:14b"]                      # (bridge, "qwen3:14b")
    if "new-model" not in models:
        await refresh_models(models)         # --model-server listed again (if due)
    available(models)                        # "available: qwen3:14b, reference"

Contracts: ``BridgeModels`` is a live view of ``bridge.agents``: an agent added while
the server runs (a model ``--model-server`` lists later, ``bridge.agents.catalog``) is a
model from then on, with no copy to keep in step; agents are never removed, so a model
seen once stays. ``refresh_models`` asks the bridge's agent finder to list again
(rate-limited, single-flight: ``Bridge.refresh_agents``), waiting at most ``wait_s``; it
does nothing for a plain mapping (tests compose their own).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from acp_server.lmsp.problems import shown

if TYPE_CHECKING:
    from bridge import Bridge

Target = tuple["Bridge", "str | None"]


class BridgeModels(Mapping[str, Target]):
    """Every agent of ``bridge`` as a model of the same name, as it is now."""

    def __init__(self, bridge: Bridge) -> None:
        self.bridge = bridge

    def __getitem__(self, name: str) -> Target:
        if name in self.bridge.agents:
            return self.bridge, name
        raise KeyError(name)

    def __contains__(self, name: object) -> bool:
        return name in self.bridge.agents

    def __iter__(self) -> Iterator[str]:
        return iter(self.bridge.agents.names)

    def __len__(self) -> int:
        return len(self.bridge.agents.names)

    async def refresh(self, *, wait_s: float | None = None) -> None:
        await self.bridge.refresh_agents(wait_s=wait_s)


async def refresh_models(models: Mapping[str, Target], *, wait_s: float | None = None) -> None:
    """List the agents again when ``models`` is a ``BridgeModels`` (see the docstring)."""
    if isinstance(models, BridgeModels):
        await models.refresh(wait_s=wait_s)


SHOWN_MODELS = 20   # a model server listing hundreds: the first names and a count


def available(models: Mapping[str, Target]) -> str:
    """The models a ``model_not_found`` detail lists: ``available: a, b`` (sorted; past
    ``SHOWN_MODELS`` names, ``and N more``), or ``none available``."""
    names = sorted(models)
    if not names:
        return "none available"
    more = len(names) - SHOWN_MODELS
    listed = ", ".join(shown(name) for name in names[:SHOWN_MODELS])
    return f"available: {listed}" + (f", and {more} more" if more > 0 else "")


__all__ = ["BridgeModels", "available", "refresh_models"]
