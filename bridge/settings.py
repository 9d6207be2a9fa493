"""Settings a client changes through a session's agent (``/acp`` ``session/set_mode``,
``session/set_model``, ``session/set_config_option``): once the agent accepted one, it
is kept in the session's journal record (``SessionOpened.settings``), committed before
the client gets the agent's answer, and applied to the agent again when the session's
agent side is restored (``bridge.restore``), so the setting after a restart is the
one acknowledged.

    key = setting_key("session/set_mode", params)          # "mode"
    await apply_again(bridge, session, result)             # after a restore, in order

Contracts: one entry per setting (``mode``, ``model``, ``config:<configId>``; a later
change replaces it, keeping the order the settings were first made), its value
``[method, params]`` (the params without ``sessionId``). Applying them again asks the
agent each in turn with ``sessionId`` set; one it refuses (or does not answer in time)
is logged and left as the agent has it, never failing the restore. The agent's answer
to the restore (``result``, its session state) is updated to say what was applied:
``modes.currentModeId``, ``models.currentModelId``, a ``configOptions`` entry's
``currentValue``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from bridge.agent_state import record
from bridge.errors import BridgeError
from bridge.loggable import loggable

if TYPE_CHECKING:
    from bridge.bridge import Bridge
    from bridge.session import Session

log = logging.getLogger("bridge.settings")

SETTING_METHODS = frozenset({"session/set_mode", "session/set_model",
                             "session/set_config_option"})


def setting_key(method: str, params: Any) -> str | None:
    """The setting ``method`` with ``params`` changes (``None``: not one kept)."""
    if not isinstance(params, dict):
        return None
    if method == "session/set_mode" and isinstance(params.get("modeId"), str):
        return "mode"
    if method == "session/set_model" and isinstance(params.get("modelId"), str):
        return "model"
    if method == "session/set_config_option" and isinstance(params.get("configId"), str):
        return f"config:{params['configId']}"
    return None


def kept(method: str, params: dict[str, Any]) -> list[Any]:
    return [method, {k: v for k, v in params.items() if k != "sessionId"}]


async def apply_again(bridge: Bridge, session: Session, result: dict[str, Any]) -> None:
    """Ask the restored agent for each of ``session.settings`` again (the module's
    contracts); ``result`` (the restore's answer) is updated in place."""
    sid = session.session_id
    for key, (method, params) in list(session.settings.items()):
        try:
            answer = await bridge._agent_request(session.agent, method,
                                                 {**params, "sessionId": sid})
        except BridgeError as exc:
            log.warning("session %s: its agent refused the %s it had accepted before the "
                        "restart (%s); left as the agent has it", sid, loggable(key, 128),
                        loggable(str(exc)))   # a client's id, the agent's message
            continue
        record(result, method, params, answer)   # the state as that setting left it

