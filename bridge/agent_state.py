"""A session's state as its agent answered it (``Session.agent_result``: its
``session/new``, ``load`` or ``resume`` answer), kept current::

    record(session.agent_result, "session/set_mode", {"modeId": "plan"}, answer)
    reported(session.agent_result, params)   # a session/update: current_mode_update

Contracts: ``record`` notes a setter's success (``session/set_mode``: the current mode;
``session/set_model``: the current model; an answer with ``configOptions``: those);
``reported`` notes the agent's own ``current_mode_update`` (qwen's agent leaving plan
mode, say) and ``config_option_update``, and reads nothing of any other update: the
raw bytes of one are only searched (no copy, no decode), so a turn's chunks cost a scan.
A state with no ``modes`` (``models``) gets none.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

_REPORTS = re.compile(rb'"(?:current_mode_update|config_option_update)"')
_decode = msgspec.json.Decoder(dict[str, Any])


def record(state: dict[str, Any], method: str, params: dict[str, Any], answer: Any) -> None:
    """A setter's success in a session's state."""
    modes, models = state.get("modes"), state.get("models")
    if method == "session/set_mode" and isinstance(modes, dict):
        state["modes"] = {**modes, "currentModeId": params.get("modeId")}
    elif method == "session/set_model" and isinstance(models, dict):
        state["models"] = {**models, "currentModelId": params.get("modelId")}
    elif isinstance(answer, dict) and isinstance(answer.get("configOptions"), list):
        state["configOptions"] = answer["configOptions"]   # set_config_option's answer


def reported(state: dict[str, Any], params: msgspec.Raw | dict[str, Any]) -> None:
    """A ``session/update``'s mode or options in a session's state."""
    if isinstance(params, msgspec.Raw):
        if _REPORTS.search(memoryview(params)) is None:
            return
        try:
            params = _decode.decode(params)
        except msgspec.MsgspecError:
            return
    update = params.get("update")
    if not isinstance(update, dict):
        return
    kind, modes = update.get("sessionUpdate"), state.get("modes")
    if kind == "current_mode_update" and isinstance(modes, dict) \
            and isinstance(update.get("currentModeId"), str):
        state["modes"] = {**modes, "currentModeId": update["currentModeId"]}
    elif kind == "config_option_update" and isinstance(update.get("configOptions"), list):
        state["configOptions"] = update["configOptions"]
