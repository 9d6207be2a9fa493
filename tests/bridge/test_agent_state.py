"""``bridge.agent_state``: a session's state kept current by the setters' successes
and by the agent's own mode and option reports."""

from __future__ import annotations

from typing import Any

import msgspec

from bridge.agent_state import record, reported
from bridge.agents.reference_settings import SessionSettings


def _state() -> dict[str, Any]:
    return SessionSettings().state()


def test_the_agents_own_reports() -> None:
    """A ``current_mode_update`` (raw, as a stdio agent's, or decoded) moves the mode;
    a ``config_option_update`` replaces the options; anything else, or bytes that are
    no JSON, changes nothing."""
    state = _state()
    update = {"sessionId": "s", "update": {"sessionUpdate": "current_mode_update",
                                           "currentModeId": "plan"}}
    reported(state, msgspec.Raw(msgspec.json.encode(update)))
    assert state["modes"]["currentModeId"] == "plan"
    update["update"]["currentModeId"] = "yolo"
    reported(state, update)
    assert state["modes"]["currentModeId"] == "yolo"
    options = [{"id": "reasoning_effort", "currentValue": "low"}]
    reported(state, {"update": {"sessionUpdate": "config_option_update",
                                "configOptions": options}})
    assert state["configOptions"] == options
    before = dict(state)
    for other in (msgspec.Raw(b'{"update":{"sessionUpdate":"agent_message_chunk",'
                              b'"content":{"type":"text","text":"current_mode_"}}}'),
                  msgspec.Raw(b'{"update":"current_mode_update"'),   # cut off
                  {"update": {"sessionUpdate": "current_mode_update", "currentModeId": 3}}):
        reported(state, other)
    assert state == before
    bare: dict[str, Any] = {}   # an agent with no modes gets none
    reported(bare, update)
    assert bare == {}


def test_a_setters_success() -> None:
    state = _state()
    record(state, "session/set_mode", {"modeId": "plan"}, {})
    record(state, "session/set_model", {"modelId": "reference-large"}, {})
    record(state, "session/set_config_option", {"configId": "x", "value": "y"},
           {"configOptions": []})
    assert (state["modes"]["currentModeId"], state["models"]["currentModelId"],
            state["configOptions"]) == ("plan", "reference-large", [])
    bare: dict[str, Any] = {}
    record(bare, "session/set_mode", {"modeId": "plan"}, None)
    assert bare == {}
