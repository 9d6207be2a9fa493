"""The transport-agnostic session bridge (no HTTP here).

    from bridge import Bridge, BridgeOptions
    from bridge.agents.reference import ReferenceAgentFactory

    async with Bridge(ReferenceAgentFactory(), workspace_cwd=".") as bridge:
        info = await bridge.create_session()
        result = await bridge.send_prompt(info.session_id, [{"type": "text", "text": "hi"}])
"""

from __future__ import annotations

from bridge.bridge import Bridge
from bridge.bus import EventBus, Subscription
from bridge.cancel import CancelToken
from bridge.errors import *  # noqa: F403
from bridge.events import Event
from bridge.errors import InvalidPromptError
from bridge.options import BridgeOptions
from bridge.status import (
    AgentStatus,
    BridgeStats,
    PromptTerminal,
    SessionHistory,
    SessionInfo,
    SessionStatus,
)
from bridge.ticket import PromptResult, PromptTicket
from bridge.wakeup import Wakeup

__all__ = [
    "AgentStatus", "Bridge", "BridgeOptions", "BridgeStats", "CancelToken", "Event", "EventBus",
    "InvalidPromptError", "PromptResult", "PromptTerminal", "PromptTicket", "SessionHistory",
    "SessionInfo", "SessionStatus", "Subscription", "Wakeup",
]
