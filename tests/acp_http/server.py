"""The ``/acp`` tests' helpers on the in-process server (``tests.harness.local_server``).

    async with running_acp_server(tmp_path, grace_s=0.3) as srv:
        conn_id, init = await srv.initialize()
        async with srv.stream(conn_id) as conn_stream:          # connection stream
            await srv.post(conn_id, request(1, "session/new", {"cwd": srv.workspace}))
            reply = await conn_stream.wait_for_id(1)

``grace_s`` and ``max_connections`` are the registry's (``--acp-reap-grace-s``,
``--max-acp-connections``), ``clock`` its clock (``FakeClock``).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
from httpx_sse import aconnect_sse

from acp_server.acp_http import ConnectionRegistry
from acp_server.acp_http.registry import Clock
from tests.harness.local import LocalServer, local_server

JSON = {"Content-Type": "application/json"}


def request(rpc_id: Any, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if rpc_id is not None:
        message["id"] = rpc_id
    if params is not None:
        message["params"] = params
    return message


def text(value: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": value}]


def said(messages: list[dict[str, Any]]) -> str:
    """The agent's text in ``messages``: its ``agent_message_chunk`` updates, joined."""
    return "".join(m["params"]["update"]["content"]["text"] for m in messages
                   if m.get("method") == "session/update"
                   and m["params"]["update"]["sessionUpdate"] == "agent_message_chunk")


@dataclass
class Sse:
    """Frames of one open SSE stream, collected in the background."""

    response: httpx.Response
    frames: list[tuple[str | None, dict[str, Any]]] = field(default_factory=list)
    ended: bool = False
    _changed: anyio.Event = field(default_factory=anyio.Event)

    def _add(self, event_id: str | None, data: dict[str, Any]) -> None:
        self.frames.append((event_id, data))
        self._changed.set()
        self._changed = anyio.Event()

    def _end(self) -> None:
        self.ended = True
        self._changed.set()

    @property
    def messages(self) -> list[dict[str, Any]]:
        return [data for _id, data in self.frames]

    async def wait_for(self, match: Callable[[dict[str, Any]], bool],
                       timeout: float = 30.0) -> dict[str, Any]:
        with anyio.fail_after(timeout):
            seen = 0
            while True:
                for data in self.messages[seen:]:
                    if match(data):
                        return data
                seen = len(self.frames)
                if self.ended:
                    raise AssertionError(f"stream ended; frames: {self.messages}")
                await self._changed.wait()

    async def wait_for_id(self, rpc_id: Any, timeout: float = 30.0) -> dict[str, Any]:
        return await self.wait_for(lambda m: m.get("id") == rpc_id and "method" not in m,
                                   timeout)

    async def wait_for_end(self, timeout: float = 30.0) -> None:
        with anyio.fail_after(timeout):
            while not self.ended:
                await self._changed.wait()


class RunningAcpServer(LocalServer):
    acp_path = "/acp"   # where the helpers below send (an alias: /workspaces/{id}/acp)

    @property
    def registry(self) -> ConnectionRegistry:
        return self.server.acp

    async def initialize(self, **headers: str) -> tuple[str, dict[str, Any]]:
        response = await self.client.post(self.acp_path, json=request(0, "initialize",
                                                               {"protocolVersion": 1}),
                                          headers=headers)
        assert response.status_code == 200, response.text
        return response.headers["acp-connection-id"], response.json()

    async def post(self, conn_id: str | None, message: Any, session_id: str | None = None,
                   **headers: str) -> httpx.Response:
        sent = {"Content-Type": "application/json", **headers}
        if conn_id is not None:
            sent["Acp-Connection-Id"] = conn_id
        if session_id is not None:
            sent["Acp-Session-Id"] = session_id
        return await self.client.post(self.acp_path, content=json.dumps(message), headers=sent)

    @contextlib.asynccontextmanager
    async def stream(self, conn_id: str, session_id: str | None = None,
                     **headers: str) -> AsyncIterator[Sse]:
        sent = {"Acp-Connection-Id": conn_id, **headers}
        if session_id is not None:
            sent["Acp-Session-Id"] = session_id
        async with aconnect_sse(self.client, "GET", self.acp_path, headers=sent) as source:
            assert source.response.status_code == 200, await source.response.aread()
            sse = Sse(source.response)

            async def read() -> None:
                try:
                    async for event in source.aiter_sse():
                        if event.data:
                            sse._add(event.id or None, json.loads(event.data))
                except (httpx.HTTPError, anyio.ClosedResourceError):
                    pass
                finally:
                    sse._end()

            async with anyio.create_task_group() as tg:
                tg.start_soon(read)
                try:
                    yield sse
                finally:
                    tg.cancel_scope.cancel()

    async def new_session(self, conn_id: str, conn_stream: Sse, rpc_id: Any = 1) -> str:
        response = await self.post(conn_id, request(rpc_id, "session/new",
                                                    {"cwd": self.workspace, "mcpServers": []}))
        assert response.status_code == 202, response.text
        reply = await conn_stream.wait_for_id(rpc_id)
        return reply["result"]["sessionId"]  # type: ignore[no-any-return]

    async def prompt(self, conn_id: str, session_id: str, rpc_id: Any,
                     value: str) -> httpx.Response:
        return await self.post(conn_id, request(rpc_id, "session/prompt", {
            "sessionId": session_id, "prompt": text(value)}), session_id)


class FakeClock:
    """A ``Clock`` the test moves: ``sleep`` returns once ``advance`` passed its end."""

    def __init__(self) -> None:
        self.time = 0.0
        self.sleepers = 0
        self._moved = anyio.Event()

    def now(self) -> float:
        return self.time

    async def sleep(self, seconds: float) -> None:
        deadline = self.time + seconds
        self.sleepers += 1
        try:
            while self.time < deadline:
                await self._moved.wait()
        finally:
            self.sleepers -= 1

    def advance(self, seconds: float) -> None:
        self.time += seconds
        moved, self._moved = self._moved, anyio.Event()
        moved.set()


def running_acp_server(workspace: Any, *, max_connections: int = 64, grace_s: float = 10.0,
                       clock: Clock | None = None, **kwargs: Any
                       ) -> contextlib.AbstractAsyncContextManager[RunningAcpServer]:
    """``tests.harness.local_server`` with the ``/acp`` helpers."""
    return local_server(workspace, kind=RunningAcpServer, max_acp_connections=max_connections,
                        acp_reap_grace_s=grace_s, acp_clock=clock, **kwargs)
