"""What a setter changed (``AgentCallsAPI._set``, the one setter path of every door:
REST's ``/approval-mode``, ``/model``, ``/config-option`` and ``/acp``'s
``session/set_mode``, ``set_model``, ``set_config_option``), and the events ``qwen
serve`` 0.24.4 publishes for it on the session's bus.

    change = change_of(session.agent_result, "session/set_mode", {"modeId": "plan"})
    (change.setting, change.kind, change.old, change.new)   # "mode", "mode", "default", "plan"
    announce(session, change, client_id)         # approval_mode_changed on the bus
    announce_failure(session, change, exc, client_id)   # model_switch_failed, for a model

Contracts:

* ``change_of`` reads the session's state (``bridge.agent_state``) before the agent is
  asked, under the session's setter lock: ``session/set_mode`` is the setting ``mode``
  (``old``: ``modes.currentModeId``), ``session/set_model`` ``model``
  (``models.currentModelId``), ``session/set_config_option`` ``config:<configId>``
  (that option's ``currentValue``); ``old`` is ``None`` when the agent never said.
  ``kind`` is the qwen setting it is: ``mode`` and ``model``, and an option of ACP
  category ``mode`` or ``model`` (how an agent may offer them) the same; ``None`` for
  any other option. ``None`` for params that name no setting.
* ``announce`` publishes qwen's event of the kind: ``approval_mode_changed``
  ``{sessionId, previous, next, persisted: false}`` (``previous`` is the new mode when
  the old one is unknown, as REST's answer says) and ``model_switched`` ``{sessionId,
  modelId}``; nothing for another option (qwen publishes none; the agent's own
  ``config_option_update`` reaches the stream as its ``session_update``).
  ``announce_failure`` publishes ``model_switch_failed`` ``{sessionId,
  requestedModelId, error}`` when the agent refused a model or failed to answer;
  nothing for another kind (as qwen's). The envelope carries the running prompt's id
  (qwen's ``activePromptId``) and the setter's client id as ``originatorClientId``
  when the session issued it. On a closed bus nothing is published. The events are
  the bus's like any other: journaled, replayed.
* The agent's refusal of a setter (its JSON-RPC error) is bounded as every agent
  error is, as it is made (``bridge.errors.AgentError``: the message cut
  at ``MAX_AGENT_MESSAGE`` characters, a ``data`` over ``MAX_AGENT_DATA`` bytes of
  JSON replaced by a marker): an agent does not make every setter answer megabytes.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from bridge import events as ev
from bridge.wire import MAX_AGENT_MESSAGE

if TYPE_CHECKING:
    from bridge.session import Session


@dataclasses.dataclass(frozen=True, slots=True)
class SettingChange:
    setting: str        # mode | model | config:<configId>
    kind: str | None    # mode | model: the qwen setting it is; None: another option
    old: Any            # as last known before (None: the agent never said)
    new: Any


def _current(state: dict[str, Any], key: str, field: str) -> Any:
    found = state.get(key)
    return found.get(field) if isinstance(found, dict) else None


def change_of(state: dict[str, Any], method: str, params: Any) -> SettingChange | None:
    """The setting ``method`` with ``params`` changes in a session of ``state``."""
    if not isinstance(params, dict):
        return None
    if method == "session/set_mode" and isinstance(params.get("modeId"), str):
        return SettingChange("mode", "mode", _current(state, "modes", "currentModeId"),
                             params["modeId"])
    if method == "session/set_model" and isinstance(params.get("modelId"), str):
        return SettingChange("model", "model", _current(state, "models", "currentModelId"),
                             params["modelId"])
    config_id = params.get("configId")
    if method != "session/set_config_option" or not isinstance(config_id, str):
        return None
    options = state.get("configOptions")
    option = next((o for o in options if isinstance(o, dict) and o.get("id") == config_id),
                  None) if isinstance(options, list) else None
    category = option.get("category") if option is not None else None
    return SettingChange(f"config:{config_id}",
                         category if category in ("mode", "model") else None,
                         option.get("currentValue") if option is not None else None,
                         params.get("value"))


def _envelope(session: Session, client_id: str | None) -> dict[str, Any]:
    active = session.active
    known = client_id is not None and session.knows_client(client_id)
    return {"prompt_id": active.prompt_id if active is not None else None,
            "originator_client_id": client_id if known else None}


def announce(session: Session, change: SettingChange, client_id: str | None) -> None:
    """qwen's event for a setter the agent accepted (the module contracts)."""
    sid, new = session.session_id, change.new
    if change.kind == "mode" and isinstance(new, str):
        previous = change.old if isinstance(change.old, str) and change.old else new
        session.bus.publish(ev.APPROVAL_MODE_CHANGED, ev.ApprovalModeChanged(
            session_id=sid, previous=previous, next=new, persisted=False),
            **_envelope(session, client_id))
    elif change.kind == "model" and isinstance(new, str):
        session.bus.publish(ev.MODEL_SWITCHED, ev.ModelSwitched(session_id=sid, model_id=new),
                            **_envelope(session, client_id))


def announce_failure(session: Session, change: SettingChange, error: BaseException,
                     client_id: str | None) -> None:
    """qwen's event for a model the agent refused or did not answer."""
    if change.kind == "model" and isinstance(change.new, str):
        message = str(getattr(error, "message", None) or error)[:MAX_AGENT_MESSAGE] or "Refused"
        session.bus.publish(ev.MODEL_SWITCH_FAILED, ev.ModelSwitchFailed(
            session_id=session.session_id, requested_model_id=change.new, error=message),
            **_envelope(session, client_id))
