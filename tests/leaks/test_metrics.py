"""``GET /metrics`` keeps a bounded set of series however much work went through:
no label takes a value per session, prompt, client, path or address, nor any
string an agent chooses.

    async with running_server(tmp_path, agent_factory=agent) as srv:
        ...   # many turns, each ended with a stop reason of the agent's own making
        assert _label_values(await srv.client.get("/metrics"), "stop_reason") <= KNOWN
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.bridge.scripted_agent import ScriptedAgent
from tests.rest.server import running_server

pytestmark = pytest.mark.anyio

CYCLES = 200
ACP_STOP_REASONS = {"end_turn", "max_tokens", "max_turn_requests", "refusal", "cancelled"}


def _label_values(text: str, family: str, label: str) -> set[str]:
    pattern = re.compile(rf'^{family}[a-z_]*\{{[^}}]*\b{label}="([^"]*)"', re.MULTILINE)
    return set(pattern.findall(text))


async def test_stop_reasons_an_agent_makes_up_are_one_series(tmp_path: Path) -> None:
    """An agent answering ``session/prompt`` with a ``stopReason`` outside ACP's five
    adds no series per value: they are counted as ``other``."""
    agent = ScriptedAgent()
    async with running_server(tmp_path, agent_factory=agent) as srv:
        sid = (await srv.create_session())["sessionId"]
        for n in range(CYCLES):
            agent.release(f"k{n}", f"made-up-{n}" if n % 2 else "max_tokens")
            accepted = (await srv.prompt(sid, f"hold k{n}")).json()
            frames = await srv.events_until(sid, "turn_complete",
                                            last_event_id=accepted["lastEventId"])
            # the event itself carries the agent's word, as it said it
            assert frames[-1][1]["data"]["stopReason"] == (f"made-up-{n}" if n % 2
                                                           else "max_tokens")
        text = (await srv.client.get("/metrics")).text
        assert _label_values(text, "acp_server_turn_duration_seconds", "stop_reason") == \
            {"max_tokens", "other"}
        assert f'stop_reason="other"}} {CYCLES // 2}' in text.replace(".0\n", "\n")
