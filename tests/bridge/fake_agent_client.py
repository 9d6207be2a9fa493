"""A recording ``AgentClient`` for agent tests (shared by the reference and stdio tests).

    client = FakeClient(root=tmp_path)
    conn = await factory.connect(client, tg)
    ...
    assert client.texts(session_id) == "Echo: hi"
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import msgspec

from bridge.agents.base import RequestError
from bridge.errors import AgentDiedError

ALLOW = {"outcome": {"outcome": "selected", "optionId": "allow_once"}}
REJECT = {"outcome": {"outcome": "selected", "optionId": "reject_once"}}
CANCELLED = {"outcome": {"outcome": "cancelled"}}


class FakeClient:
    """Records updates (decoded to dicts), answers permission with ``permission_answer``.

    ``hold_permission=True`` makes permission requests wait for ``release`` to be set.
    ``write_text_file`` writes only inside ``root`` (else ``RequestError(-32602)``).
    """

    def __init__(self, root: Path | None = None, permission_answer: dict[str, Any] = ALLOW) -> None:
        self.root = root
        self.permission_answer = permission_answer
        self.hold_permission = False
        self.release = anyio.Event()
        self.permission_started = anyio.Event()
        self.updates: list[dict[str, Any]] = []
        self.raw_updates: list[msgspec.Raw | dict[str, Any]] = []
        self.permission_requests: list[dict[str, Any]] = []
        self.permission_finished = 0
        self.writes: list[dict[str, Any]] = []
        self.lost: list[AgentDiedError] = []

    def session_update(self, session_id: str, params: msgspec.Raw | dict[str, Any]) -> None:
        self.raw_updates.append(params)
        decoded = msgspec.json.decode(params) if isinstance(params, msgspec.Raw) else params
        assert decoded["sessionId"] == session_id
        self.updates.append(decoded)

    async def request_permission(self, session_id: str, params: dict[str, Any]) -> dict[str, Any]:
        assert params["sessionId"] == session_id
        self.permission_requests.append(params)
        self.permission_started.set()
        if self.hold_permission:
            await self.release.wait()
        self.permission_finished += 1
        return self.permission_answer

    async def read_text_file(self, session_id: str, params: dict[str, Any]) -> dict[str, Any]:
        return {"content": Path(self._confined(params["path"])).read_text()}

    async def write_text_file(self, session_id: str, params: dict[str, Any]) -> dict[str, Any]:
        path = self._confined(params["path"])
        Path(path).write_text(params["content"])
        self.writes.append(params)
        return {}

    def connection_lost(self, error: AgentDiedError) -> None:
        self.lost.append(error)

    def _confined(self, path: str) -> str:
        if self.root is None or not os.path.isabs(path):
            raise RequestError(-32602, "Path must be absolute and a root must be set")
        real = os.path.realpath(path)
        root = os.path.realpath(self.root)
        if os.path.commonpath([real, root]) != root:
            raise RequestError(-32602, f"Path outside the workspace: {path}")
        return real

    # -- helpers for assertions

    def session_updates(self, session_id: str) -> list[dict[str, Any]]:
        return [u["update"] for u in self.updates if u["sessionId"] == session_id]

    def chunks(self, session_id: str, kind: str = "agent_message_chunk") -> list[str]:
        return [
            u["content"]["text"]
            for u in self.session_updates(session_id)
            if u["sessionUpdate"] == kind
        ]

    def texts(self, session_id: str) -> str:
        return "".join(self.chunks(session_id))

    def clear(self) -> None:
        self.updates.clear()
        self.raw_updates.clear()


def prompt(session_id: str, text: str) -> dict[str, Any]:
    return {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]}
