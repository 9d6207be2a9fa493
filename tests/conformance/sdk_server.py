"""Another implementation of the ACP Streamable HTTP transport: the Python SDK's ASGI
server (``agent-client-protocol``), hosting an echo agent that keeps each session's
history and replays it on ``session/load`` before answering.

    app = sdk_app()            # serve it with uvicorn (the SDK is asyncio-only)
"""

from __future__ import annotations

import uuid
from typing import Any

from acp import (PROTOCOL_VERSION, Agent, InitializeResponse, LoadSessionResponse,
                 NewSessionResponse, PromptResponse, text_block, update_agent_message,
                 update_user_message)
from acp.http.asgi import create_asgi_app
from acp.schema import AgentCapabilities, Implementation


class HistoryAgent(Agent):
    """Echoes each prompt; ``histories`` (shared by every connection) keeps the turns."""

    def __init__(self, histories: dict[str, list[tuple[str, str]]]) -> None:
        self.histories = histories
        self.conn: Any = None

    def on_connect(self, conn: Any) -> None:
        self.conn = conn

    async def initialize(self, protocol_version: int, client_capabilities: Any = None,
                         client_info: Any = None, **kwargs: Any) -> InitializeResponse:
        return InitializeResponse(protocol_version=PROTOCOL_VERSION,
                                  agent_capabilities=AgentCapabilities(loadSession=True),
                                  agent_info=Implementation(name="history-echo", version="1"))

    async def new_session(self, cwd: str, additional_directories: Any = None,
                          mcp_servers: Any = None, **kwargs: Any) -> NewSessionResponse:
        session_id = uuid.uuid4().hex
        self.histories[session_id] = []
        return NewSessionResponse(session_id=session_id)

    async def load_session(self, cwd: str, session_id: str, mcp_servers: Any = None,
                           additional_directories: Any = None, **kwargs: Any
                           ) -> LoadSessionResponse:
        for user, agent in self.histories.get(session_id, []):
            await self.conn.session_update(session_id, update_user_message(text_block(user)))
            await self.conn.session_update(session_id, update_agent_message(text_block(agent)))
        return LoadSessionResponse()

    async def prompt(self, prompt: list[Any], session_id: str, **kwargs: Any) -> PromptResponse:
        said = " ".join(getattr(block, "text", "") for block in prompt)
        await self.conn.session_update(session_id, update_agent_message(
            text_block(f"Echo: {said}")))
        self.histories.setdefault(session_id, []).append((said, f"Echo: {said}"))
        return PromptResponse(stop_reason="end_turn")

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        return None


def sdk_app() -> Any:
    histories: dict[str, list[tuple[str, str]]] = {}
    return create_asgi_app(lambda conn: HistoryAgent(histories))
