"""qwen's events for the setters (``bridge.setting_changes``), published by the one
setter path (``Bridge.set_setting``; ``forward`` for ``/acp``): ``approval_mode_changed``,
``model_switched``, ``model_switch_failed``, with qwen's field names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from bridge import Bridge, BridgeOptions
from bridge.agents.reference import ReferenceAgentFactory
from bridge.errors import AgentError
from bridge.setting_changes import SettingChange, change_of
from tests.bridge.helpers import drain, envelope, text, wait_until

pytestmark = pytest.mark.anyio

SETTER_EVENTS = {"approval_mode_changed", "model_switched", "model_switch_failed"}


def _setter_events(subscription: Any) -> list[dict[str, Any]]:
    seen = []
    for frame in drain(subscription):
        if frame.type in SETTER_EVENTS:
            found = envelope(frame)
            seen.append({"type": found.type, "data": found.data, "promptId": found.promptId,
                         "originatorClientId": found.originatorClientId})
    return seen


async def test_each_setter_publishes_qwens_event(tmp_path: Path) -> None:
    async with Bridge(ReferenceAgentFactory(), workspace_cwd=str(tmp_path),
                      options=BridgeOptions()) as bridge:
        made = await bridge.create_session()
        sid = made.session_id
        sub = bridge.subscribe(sid)
        # /acp's path (forward) and REST's (set_setting with the caller's client id)
        await bridge.forward(sid, "session/set_mode", {"sessionId": sid, "modeId": "plan"})
        answer, change = await bridge.set_setting(
            sid, "session/set_model", {"sessionId": sid, "modelId": "reference-large"},
            client_id=made.client_id)
        assert (answer, change) == ({}, SettingChange("model", "model", "reference",
                                                      "reference-large"))
        _, change = await bridge.set_setting(sid, "session/set_config_option", {
            "sessionId": sid, "configId": "reasoning_effort", "value": "high"})
        assert change == SettingChange("config:reasoning_effort", None, "default", "high")
        with pytest.raises(AgentError):
            await bridge.set_setting(sid, "session/set_model",
                                     {"sessionId": sid, "modelId": "gpt-9"},
                                     client_id="client_not-issued")
        with pytest.raises(AgentError):   # a mode refused: no event (as qwen's)
            await bridge.forward(sid, "session/set_mode", {"sessionId": sid, "modeId": "x"})
        assert await bridge.set_mode(sid, "yolo", client_id=made.client_id) == "plan"
        assert _setter_events(sub) == [
            {"type": "approval_mode_changed", "promptId": None, "originatorClientId": None,
             "data": {"sessionId": sid, "previous": "default", "next": "plan",
                      "persisted": False}},
            {"type": "model_switched", "promptId": None, "originatorClientId": made.client_id,
             "data": {"sessionId": sid, "modelId": "reference-large"}},
            # a client id the session never issued is not named as the originator
            {"type": "model_switch_failed", "promptId": None, "originatorClientId": None,
             "data": {"sessionId": sid, "requestedModelId": "gpt-9",
                      "error": 'Unknown model "gpt-9"'}},
            {"type": "approval_mode_changed", "promptId": None,
             "originatorClientId": made.client_id,
             "data": {"sessionId": sid, "previous": "plan", "next": "yolo",
                      "persisted": False}}]


async def test_a_setter_during_a_turn_names_the_running_prompt(tmp_path: Path) -> None:
    """qwen stamps its running prompt's id (``activePromptId``) on the event."""
    async with Bridge(ReferenceAgentFactory(), workspace_cwd=str(tmp_path),
                      options=BridgeOptions()) as bridge:
        sid = (await bridge.create_session()).session_id
        sub = bridge.subscribe(sid)
        ticket = bridge.send_prompt(sid, text("/sleep 60s hold"))
        await wait_until(lambda: bridge.session_status(sid).active_prompt_id is not None)
        await bridge.forward(sid, "session/set_model",
                             {"sessionId": sid, "modelId": "reference-large"})
        assert [(e["type"], e["promptId"]) for e in _setter_events(sub)] == \
            [("model_switched", ticket.prompt_id)]
        await bridge.cancel_session(sid)
        with anyio.fail_after(30):
            await ticket


def test_change_of_options_of_category_mode_and_model() -> None:
    """An agent offering its mode or model as a config option (ACP categories ``mode``,
    ``model``): the same kinds, so the same events."""
    state = {"configOptions": [
        {"id": "m", "category": "model", "currentValue": "a"},
        {"id": "approval", "category": "mode", "currentValue": "ask"},
        {"id": "effort", "category": "thought_level", "currentValue": "low"}]}
    assert change_of(state, "session/set_config_option", {"configId": "m", "value": "b"}) == \
        SettingChange("config:m", "model", "a", "b")
    assert change_of(state, "session/set_config_option",
                     {"configId": "approval", "value": "code"}) == \
        SettingChange("config:approval", "mode", "ask", "code")
    assert change_of(state, "session/set_config_option",
                     {"configId": "effort", "value": "high"}).kind is None  # type: ignore[union-attr]
    assert change_of(state, "session/set_config_option",
                     {"configId": "unknown", "value": 1}) == \
        SettingChange("config:unknown", None, None, 1)
    assert change_of({}, "session/set_mode", {"modeId": "plan"}) == \
        SettingChange("mode", "mode", None, "plan")
    assert change_of({}, "session/set_mode", {"modeId": 3}) is None
    assert change_of({}, "session/other", {"modeId": "plan"}) is None


async def test_a_setter_whose_setting_is_not_kept_still_waits_for_its_event(
        tmp_path: Path) -> None:
    """With the session's kept settings full (``bridge.settings.MAX_KEPT``) a new one is
    not kept for a restart, but its event is committed before the answer all the same
    (the answer came back with the event still pending)."""
    from acp_server.store.sessions import StoreSessionJournal
    from acp_server.store.sqlite import SqliteTaskStore
    from bridge.settings import MAX_KEPT

    async with SqliteTaskStore(str(tmp_path / "store.db")) as store, \
            StoreSessionJournal(store) as journal, \
            Bridge(ReferenceAgentFactory(), workspace_cwd=str(tmp_path),
                   options=BridgeOptions(), journal=journal) as bridge:
        sid = (await bridge.create_session()).session_id
        session = bridge.get_session(sid)
        for n in range(MAX_KEPT):
            session.settings[f"config:{n}"] = ["session/set_config_option", {"configId": str(n)}]
        await bridge.forward(sid, "session/set_mode", {"sessionId": sid, "modeId": "plan"})
        assert "mode" not in session.settings
        assert journal.appended == journal._durable_through
