"""The reference agent's session settings: modes, models and one config option, so
that the setters (``session/set_mode``, ``session/set_model``,
``session/set_config_option``) are testable end to end::

    settings = SessionSettings()
    settings.state()      # {"modes": {...}, "models": {...}, "configOptions": [...]}
    settings.set_mode("plan")     # the update to send: current_mode_update

Contracts: every session starts in mode ``default`` with model ``reference`` and
``reasoning_effort`` ``default``. The modes are ``qwen --acp``'s ids less ``auto``
(``default``, ``plan``, ``auto-edit``, ``yolo``), so a qwen mode the agent does not
advertise can be asked for; the models ``reference`` and ``reference-large``;
``reasoning_effort`` a select of qwen's values. An id or value not advertised is
JSON-RPC -32602 with a message naming it, and nothing changes. A mode set is
reported with a ``current_mode_update``, an option set with a
``config_option_update`` (its answer carries every option too, as ACP's); a model
set has no update of its own in ACP. The settings hold no turn state: they do not
change what a prompt answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bridge.agents.base import RequestError
from bridge.jsonrpc import INVALID_PARAMS

MODES = (("default", "Default", "Ask before editing files or running commands"),
         ("plan", "Plan", "Plan only: read, never write"),
         ("auto-edit", "Auto edit", "Edit files without asking"),
         ("yolo", "YOLO", "Never ask"))
MODELS = (("reference", "Reference"), ("reference-large", "Reference (large)"))
EFFORTS = ("none", "default", "low", "medium", "high", "xhigh", "max")
EFFORT_ID = "reasoning_effort"


@dataclass(eq=False)
class SessionSettings:
    mode: str = "default"
    model: str = "reference"
    effort: str = "default"

    def state(self) -> dict[str, Any]:
        """The settings as a ``session/new`` (``load``, ``resume``, ``fork``) answer has them."""
        return {
            "modes": {"currentModeId": self.mode, "availableModes": [
                {"id": mode, "name": name, "description": about} for mode, name, about in MODES]},
            "models": {"currentModelId": self.model, "availableModels": [
                {"modelId": model, "name": name} for model, name in MODELS]},
            "configOptions": self.options(),
        }

    def options(self) -> list[dict[str, Any]]:
        return [{"id": EFFORT_ID, "name": "Reasoning effort", "category": "thought_level",
                 "type": "select", "currentValue": self.effort,
                 "options": [{"value": effort, "name": effort} for effort in EFFORTS]}]

    def set_mode(self, mode: Any) -> dict[str, Any]:
        """Set the mode; the ``session/update`` that reports it."""
        if not isinstance(mode, str) or mode not in {m for m, _n, _a in MODES}:
            raise RequestError(INVALID_PARAMS, f"Unknown mode {_shown(mode)}",
                               {"modeId": mode})
        self.mode = mode
        return {"sessionUpdate": "current_mode_update", "currentModeId": mode}

    def set_model(self, model: Any) -> None:
        if not isinstance(model, str) or model not in {m for m, _n in MODELS}:
            raise RequestError(INVALID_PARAMS, f"Unknown model {_shown(model)}",
                               {"modelId": model})
        self.model = model

    def set_option(self, config_id: Any, value: Any) -> dict[str, Any]:
        """Set a config option; the ``session/update`` that reports it."""
        if config_id != EFFORT_ID:
            raise RequestError(INVALID_PARAMS, f"Unknown config option {_shown(config_id)}",
                               {"configId": config_id})
        if value not in EFFORTS:
            raise RequestError(INVALID_PARAMS, f"Invalid value {_shown(value)} for "
                               f"{EFFORT_ID}", {"configId": config_id, "value": value})
        self.effort = value
        return {"sessionUpdate": "config_option_update", "configOptions": self.options()}


def _shown(value: Any) -> str:
    return f'"{value[:100]}"' if isinstance(value, str) else "(not a string)"
