"""An in-process test agent: the reference agent plus what it lacks for the ``/acp``
tests: an advertised extension (``_example.com/echo``, ``_example.com/note``), a
``session/load`` that never ends (ids ``slow-*``), and elicitations.

    factory = ExtendedFactory()
    async with running_acp_server(tmp_path, agent_factory=factory) as srv: ...

Prompts starting ``/elicit form`` ask ``elicitation/create`` (form mode) and reply
``Elicited <action> <content as JSON>``; ``/elicit url`` asks a URL elicitation
(``elicitationId`` ``e-1``), then sends ``elicitation/complete`` for it.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import anyio.abc

from bridge.agents.reference import ReferenceAgentFactory, ReferenceConnection

FORM = {"mode": "form", "message": "Your name?",
        "requestedSchema": {"type": "object", "properties": {"name": {"type": "string"}},
                            "required": ["name"]}}


class _ExtendedConnection:
    """The reference agent plus an advertised extension (``_example.com/echo``), an
    unadvertised one, and a ``session/load`` that never ends for ids ``slow-*``."""

    def __init__(self, inner: ReferenceConnection) -> None:
        self.inner = inner
        self.notes: list[Any] = []

    @property
    def closed(self) -> bool:
        return self.inner.closed

    async def request(self, method: str, params: Any) -> Any:
        if method == "initialize":
            result = await self.inner.request(method, params)
            result["agentCapabilities"]["_meta"] = {"example.com": {"echo": True}}
            return result
        if method == "_example.com/echo":
            return {"echoed": params}
        if method == "session/load" and str(params.get("sessionId")).startswith("slow-"):
            await anyio.sleep_forever()
        if method == "session/prompt":
            text = params["prompt"][0].get("text", "")
            if text.startswith("/elicit"):
                return await self._elicit(params["sessionId"], text)
        return await self.inner.request(method, params)

    async def _elicit(self, sid: str, text: str) -> Any:
        client = self.inner.client
        if text.startswith("/elicit url"):
            asked = {"sessionId": sid, "mode": "url", "message": "Sign in",
                     "elicitationId": "e-1", "url": "https://example.com/sign-in"}
        else:
            asked = {"sessionId": sid, **FORM}
        answer = await client.create_elicitation(sid, asked)
        if asked["mode"] == "url":
            client.complete_elicitation(None, {"elicitationId": "e-1"})
        said = f"Elicited {answer.get('action')} {json.dumps(answer.get('content'))}"
        client.session_update(sid, {"sessionId": sid, "update": {
            "sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": said}}})
        return {"stopReason": "end_turn"}

    async def notify(self, method: str, params: Any) -> None:
        if method.startswith("_example.com/"):
            self.notes.append((method, params))
            return
        await self.inner.notify(method, params)

    async def aclose(self) -> None:
        await self.inner.aclose()


class ExtendedFactory:
    name = "reference"

    def __init__(self) -> None:
        self.inner = ReferenceAgentFactory()
        self.connection: _ExtendedConnection | None = None

    async def connect(self, client: Any, task_group: anyio.abc.TaskGroup) -> _ExtendedConnection:
        self.connection = _ExtendedConnection(await self.inner.connect(client, task_group))
        return self.connection
