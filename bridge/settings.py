"""Settings a client changes through a session's agent (``/acp`` ``session/set_mode``,
``session/set_model``, ``session/set_config_option``): once the agent accepted one, it
is kept in the session's journal record (``SessionOpened.settings``), committed before
the client gets the agent's answer, and applied to the agent again when the session's
agent side is restored (``bridge.restore``), so the setting after a restart is the
one acknowledged.

    keep(session.settings, "mode", "session/set_mode", params, sid)   # kept: True
    await apply_again(bridge, session, result)             # after a restore, in order

Contracts: one entry per setting (``mode``, ``model``, ``config:<configId>``: a
``change_of``'s ``setting``, ``bridge.setting_changes``; a later
change replaces it, keeping the order the settings were first made), its value
``[method, params]`` (the params without ``sessionId``); at most ``MAX_KEPT`` of them
and ``MAX_KEPT_BYTES`` of params each (``keep``: one past either is applied by the agent
but not kept for a restart, logged). An entry that is not ``[method, params]`` when
read back is dropped (logged), the others applied. Applying them again asks the
agent each in turn with ``sessionId`` set; one it refuses (or does not answer in time)
is logged and left as the agent has it, never failing the restore. They are asked
within what is left of the restore's time (``within_s``: ``restore_timeout_ms`` less
the agent's start and its ``session/load`` or ``new``, ``bridge.restore``): once it
has run out, the ones not answered yet are left as the agent has them (one line
naming them), and the restore goes on, so an agent that hangs on them does not hold
it past its bound. The agent's answer
to the restore (``result``, its session state) is updated to say what was applied:
``modes.currentModeId``, ``models.currentModelId``, a ``configOptions`` entry's
``currentValue``.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from bridge.agent_state import record
from bridge.errors import BridgeError
from bridge.loggable import loggable

if TYPE_CHECKING:
    from bridge.bridge import Bridge
    from bridge.session import Session

log = logging.getLogger("bridge.settings")

SETTING_METHODS = frozenset({"session/set_mode", "session/set_model",
                             "session/set_config_option"})
MAX_KEPT = 32             # settings kept per session (``keep``)
MAX_KEPT_BYTES = 16_384   # a setting's params, JSON-encoded
_encoder = msgspec.json.Encoder()


def kept(method: str, params: dict[str, Any]) -> list[Any]:
    return [method, {k: v for k, v in params.items() if k != "sessionId"}]


def keep(settings: dict[str, Any], key: str, method: str, params: dict[str, Any],
         session_id: str) -> bool:
    """Keep ``method`` with ``params`` in ``settings`` under ``key`` (``kept``);
    ``False`` (logged, nothing kept) for a new key past ``MAX_KEPT`` or params over
    ``MAX_KEPT_BYTES`` encoded: the record is rewritten whole at every setter, and an
    agent that accepts any ``configId`` would let a client grow it without end."""
    entry = kept(method, params)
    size = len(_encoder.encode(entry[1]))
    if size > MAX_KEPT_BYTES or (key not in settings and len(settings) >= MAX_KEPT):
        log.warning("session %s: the %s the agent accepted is not kept for a restart "
                    "(%s)", session_id, loggable(key, 128),
                    f"{size} bytes, over {MAX_KEPT_BYTES}" if size > MAX_KEPT_BYTES
                    else f"{MAX_KEPT} settings kept already")
        return False
    settings[key] = entry
    return True


def _well_formed(entry: Any) -> bool:
    return (isinstance(entry, (list, tuple)) and len(entry) == 2
            and entry[0] in SETTING_METHODS and isinstance(entry[1], dict))


async def apply_again(bridge: Bridge, session: Session, result: dict[str, Any], *,
                      within_s: float = math.inf) -> None:
    """Ask the restored agent for each of ``session.settings`` again, within
    ``within_s`` seconds in all (the module's contracts); ``result`` (the restore's
    answer) is updated in place."""
    sid = session.session_id
    entries = list(session.settings.items())
    asked = 0   # entries done with (applied, refused or dropped)
    with anyio.move_on_after(max(within_s, 0)):
        for key, entry in entries:
            await _apply(bridge, session, key, entry, result)
            asked += 1
        return
    left = ", ".join(loggable(key, 128) for key, _ in entries[asked:])
    log.warning("session %s: the restore's time ran out before its agent answered %d "
                "kept setting(s) again (%s); left as the agent has them", sid,
                len(entries) - asked, loggable(left, 1024))


async def _apply(bridge: Bridge, session: Session, key: str, entry: Any,
                 result: dict[str, Any]) -> None:
    """One kept setting asked of the agent again (``apply_again``)."""
    sid = session.session_id
    if not _well_formed(entry):   # a record written otherwise: never asked
        log.warning("session %s: a kept setting %s is not [method, params]: dropped",
                    sid, loggable(key, 128))
        del session.settings[key]
        return
    method, params = entry
    try:
        answer = await bridge._agent_request(session.agent, method,
                                             {**params, "sessionId": sid})
    except BridgeError as exc:
        log.warning("session %s: its agent refused the %s it had accepted before the "
                    "restart (%s); left as the agent has it", sid, loggable(key, 128),
                    loggable(str(exc)))   # a client's id, the agent's message
        return
    record(result, method, params, answer)   # the state as that setting left it
