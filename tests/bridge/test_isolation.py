"""Agents are isolated: an agent acts only on its own sessions (``bridge.agent_client``),
and a ``session/new`` answer naming a live session is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge import Bridge
from bridge.agents.base import RESOURCE_NOT_FOUND, RequestError
from bridge.errors import AgentProtocolError
from bridge.observer import BridgeObserver
from tests.bridge.helpers import drain
from tests.bridge.scripted_agent import ScriptedAgent

pytestmark = pytest.mark.anyio


class Dropped(BridgeObserver):
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def foreign_message_dropped(self, agent: str, method: str) -> None:
        self.seen.append((agent, method))


async def test_an_agent_reaches_only_its_own_sessions(tmp_path: Path) -> None:
    honest, evil = ScriptedAgent("honest"), ScriptedAgent("evil")
    (tmp_path / "secret.txt").write_text("secret")
    async with Bridge(honest, workspace_cwd=str(tmp_path), agents={"evil": evil}) as bridge:
        observer = Dropped()
        bridge.observe(observer)
        victim = (await bridge.create_session()).session_id
        own = (await bridge.create_session(agent="evil")).session_id
        watch = bridge.subscribe(victim)
        evil.client.session_update(victim, {"sessionId": victim, "update": {
            "sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "x"}}})
        answer = await evil.client.request_permission(victim, {"sessionId": victim,
                                                               "options": []})
        assert answer == {"outcome": {"outcome": "cancelled"}}
        with pytest.raises(RequestError) as refused:
            await evil.client.read_text_file(victim, {"sessionId": victim,
                                                      "path": "secret.txt"})
        assert refused.value.code == RESOURCE_NOT_FOUND
        # ... exactly as for a session nobody has: the agent learns nothing.
        with pytest.raises(RequestError) as unknown:
            await evil.client.read_text_file("nobody", {"sessionId": "nobody",
                                                        "path": "secret.txt"})
        assert (unknown.value.code, unknown.value.message) == (refused.value.code,
                                                                refused.value.message)
        assert drain(watch) == [] and bridge.permissions.pending_count == 0
        assert observer.seen == [("evil", "session/update"),
                                 ("evil", "session/request_permission"),
                                 ("evil", "fs/read_text_file")]
        assert bridge.stats().foreign_messages_dropped == 3
        # Its own session is served as before.
        assert (await evil.client.read_text_file(own, {"sessionId": own,
                                                       "path": "secret.txt"})) == {
            "content": "secret"}


async def test_a_session_new_naming_a_live_session_is_refused(tmp_path: Path) -> None:
    honest, evil = ScriptedAgent("honest"), ScriptedAgent("evil")
    async with Bridge(honest, workspace_cwd=str(tmp_path), agents={"evil": evil}) as bridge:
        victim = await bridge.create_session()
        before = bridge.get_session(victim.session_id)
        evil.next_ids.append(victim.session_id)
        with pytest.raises(AgentProtocolError) as refused:
            await bridge.create_session(agent="evil")
        assert refused.value.agent == "evil" and refused.value.code == "agent_protocol_error"
        assert bridge.get_session(victim.session_id) is before
        assert bridge.capacity.taken == 1 and bridge.stats().admission_in_flight == 0
        ticket = bridge.send_prompt(victim.session_id, [{"type": "text", "text": "hi"}])
        assert (await ticket).stop_reason == "end_turn"
        assert ("session/prompt", {"sessionId": victim.session_id, "prompt": [
            {"type": "text", "text": "hi"}]}) in honest.calls
