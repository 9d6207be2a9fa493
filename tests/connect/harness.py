"""The adapter as an editor sees it: a child process spoken to over its stdin/stdout,
and a TCP relay in front of the server whose connections a test can cut.

    async with spawn_adapter(url, "--transport", "websocket") as adapter:
        init = await adapter.request("initialize", {"protocolVersion": 1})
        adapter.updates                      # every notification, in order
    async with tcp_relay(server_port) as relay:
        relay.cut()                          # drop every connection through it
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PermissionAnswer = Callable[[dict[str, Any]], dict[str, Any] | None]


def allow_first(request: dict[str, Any]) -> dict[str, Any]:
    option = request["params"]["options"][0]["optionId"]
    return {"outcome": {"outcome": "selected", "optionId": option}}


@dataclass
class Adapter:
    process: anyio.abc.Process
    lines: MemoryObjectReceiveStream[bytes]
    stderr: list[str] = field(default_factory=list)
    received: list[dict[str, Any]] = field(default_factory=list)   # everything, in order
    asked: list[dict[str, Any]] = field(default_factory=list)      # requests of the agent
    answer_permission: PermissionAnswer | None = allow_first
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _held: list[dict[str, Any]] = field(default_factory=list)
    _scanned: int = 0

    async def send(self, message: Any) -> None:
        await self.send_raw(json.dumps(message).encode() + b"\n")

    async def send_raw(self, data: bytes) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send(data)

    async def receive(self, timeout: float = 20.0) -> dict[str, Any]:
        """The next message (anything held back by ``request`` first)."""
        if self._held:
            return self._held.pop(0)
        with anyio.fail_after(timeout):
            line = await self.lines.receive()
        message: dict[str, Any] = json.loads(line)
        self.received.append(message)
        return message

    async def request(self, method: str, params: Any, *, timeout: float = 30.0,
                      rpc_id: Any = None) -> dict[str, Any]:
        """Send a request; the response. Meanwhile requests of the agent are answered
        with ``answer_permission`` (``None``: left unanswered), others held back."""
        rpc_id = next(self.ids) if rpc_id is None else rpc_id
        await self.send({"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params})
        return await self.response(rpc_id, timeout=timeout)

    async def response(self, rpc_id: Any, *, timeout: float = 30.0) -> dict[str, Any]:
        def answers(message: dict[str, Any]) -> bool:
            return message.get("id") == rpc_id and "method" not in message

        return await self.until(answers, timeout=timeout)

    async def until(self, match: Callable[[dict[str, Any]], bool], *,
                    timeout: float = 30.0) -> dict[str, Any]:
        """The first message (already received or next) that ``match``es; requests of
        the agent met on the way are answered (``answer_permission``)."""
        for message in self.received[self._scanned:]:
            if match(message):
                return message
        self._scanned = len(self.received)
        with anyio.fail_after(timeout):
            while True:
                message = await self._next()
                if "method" in message and "id" in message:
                    await self._asked(message)
                if match(message):
                    return message

    async def _next(self) -> dict[str, Any]:
        with anyio.fail_after(60):
            line = await self.lines.receive()
        message: dict[str, Any] = json.loads(line)
        self.received.append(message)
        return message

    async def _asked(self, message: dict[str, Any]) -> None:
        self.asked.append(message)
        if message["method"] == "session/request_permission" and self.answer_permission:
            result = self.answer_permission(message)
            if result is not None:
                await self.send({"jsonrpc": "2.0", "id": message["id"], "result": result})

    def updates(self, session_id: str | None = None) -> list[dict[str, Any]]:
        return [m["params"]["update"] for m in self.received
                if m.get("method") == "session/update"
                and (session_id is None or m["params"]["sessionId"] == session_id)]

    def texts(self, kind: str, session_id: str | None = None) -> list[str]:
        return [u["content"].get("text", "") for u in self.updates(session_id)
                if u["sessionUpdate"] == kind]

    async def exit_code(self, timeout: float = 30.0) -> int:
        with anyio.fail_after(timeout):
            return await self.process.wait()


@contextlib.asynccontextmanager
async def spawn_adapter(url: str, *args: str, env: dict[str, str] | None = None,
                        answer_permission: PermissionAnswer | None = allow_first,
                        ) -> AsyncIterator[Adapter]:
    command = [sys.executable, "-m", "acp_server.connect.cli", url, *args]
    environment = {k: v for k, v in os.environ.items() if k != "ACP_SERVER_TOKEN"}
    environment.update({"PYTHONPATH": ROOT, **(env or {})})
    process = await anyio.open_process(command, env=environment)
    send, receive = anyio.create_memory_object_stream[bytes](10_000)
    adapter = Adapter(process, receive, answer_permission=answer_permission)
    async with process, anyio.create_task_group() as tg:
        async def read_stdout() -> None:
            assert process.stdout is not None
            buffer = b""
            async with send:
                async for chunk in process.stdout:
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        await send.send(line)

        async def read_stderr() -> None:
            assert process.stderr is not None
            async for chunk in process.stderr:
                adapter.stderr.extend(chunk.decode(errors="replace").splitlines())

        tg.start_soon(read_stdout)
        tg.start_soon(read_stderr)
        try:
            yield adapter
        finally:
            with contextlib.suppress(Exception):
                assert process.stdin is not None
                await process.stdin.aclose()
            with anyio.move_on_after(10) as scope:
                await process.wait()
            if scope.cancelled_caught:
                process.kill()
            tg.cancel_scope.cancel()


@dataclass
class TcpRelay:
    """Forwards a local port to ``target_port``; ``cut()`` drops every connection
    made so far, ``refusing`` turns new connections away, ``freeze()`` / ``thaw()``
    hold every byte (the sockets stay open)."""

    port: int
    target_port: int
    refusing: bool = False
    connections: int = 0
    _scopes: list[anyio.CancelScope] = field(default_factory=list)
    _thawed: anyio.Event | None = None   # set while frozen: bytes wait, sockets stay open

    def freeze(self) -> None:
        """Stop forwarding in both directions, every socket left open (a peer that
        went silent: a paused process, a dead network path)."""
        if self._thawed is None:
            self._thawed = anyio.Event()

    def thaw(self) -> None:
        if self._thawed is not None:
            self._thawed.set()
            self._thawed = None

    def cut(self) -> None:
        for scope in self._scopes:
            scope.cancel()
        self._scopes.clear()

    async def _handle(self, client: anyio.abc.SocketStream) -> None:
        async with client:
            if self.refusing:
                return
            try:
                upstream = await anyio.connect_tcp("127.0.0.1", self.target_port)
            except OSError:
                return
            self.connections += 1
            with anyio.CancelScope() as scope:
                self._scopes.append(scope)
                async with upstream, anyio.create_task_group() as tg:
                    async def copy(a: anyio.abc.SocketStream, b: anyio.abc.SocketStream) -> None:
                        with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError,
                                                 anyio.ClosedResourceError, OSError):
                            async for chunk in a:
                                while self._thawed is not None:
                                    await self._thawed.wait()
                                await b.send(chunk)
                        tg.cancel_scope.cancel()

                    tg.start_soon(copy, client, upstream)
                    tg.start_soon(copy, upstream, client)
            if scope in self._scopes:
                self._scopes.remove(scope)


@contextlib.asynccontextmanager
async def tcp_relay(target_port: int) -> AsyncIterator[TcpRelay]:
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    relay = TcpRelay(port, target_port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, relay._handle)
        try:
            yield relay
        finally:
            relay.cut()
            tg.cancel_scope.cancel()


def port_of(base_url: str) -> int:
    return int(base_url.rsplit(":", 1)[1])
