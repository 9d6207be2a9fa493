"""The in-process ``Relay`` with everything around it scripted: a clock that moves only
when the relay sleeps, a server whose links a test drops at will, and an editor.

    clock = FakeClock()
    server = FakeServer(answer=echo_result)          # answers every request
    async with editor_and_relay(server, clock, give_up_after_s=2) as (editor, relay):
        await editor.request("initialize", {})       # the first link is up
        server.lose_all()                            # every link lost at once
        await editor.response(2)                     # what the editor got under id 2
    relay.exit_code

No sleeps: the clock's ``sleep`` adds to ``now`` and yields once, so backoff and
give-up run as fast as the relay can loop; tests wait on conditions with a guard.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel

from acp_server.connect import Clock, EditorWriter, LinkLost, Relay, StartupError, Target

INIT_RESULT = {"protocolVersion": 1, "agentCapabilities": {"loadSession": True},
               "_meta": {"acp-server": {"resumable": True}}}
GUARD_S = 20.0   # a hang fails the test instead of the suite (not a timing assertion)


class FakeClock(Clock):
    def __init__(self) -> None:
        self.t = 1000.0
        self.slept: list[float] = []

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t += max(0.0, seconds)
        await anyio.lowlevel.checkpoint()


Answer = Callable[["FakeLink", dict[str, Any]], Awaitable[None]]


async def echo_result(link: FakeLink, message: dict[str, Any]) -> None:
    """Answer every request with ``{"method": ...}``; notifications are kept only."""
    if "id" in message and "method" in message:
        link.push({"jsonrpc": "2.0", "id": message["id"],
                   "result": {"method": message["method"]}})


class FakeLink:
    transport = "fake"

    def __init__(self, server: FakeServer) -> None:
        self.server = server
        self._send, self._receive = anyio.create_memory_object_stream[bytes | LinkLost](1000)
        self.loss: LinkLost | None = None

    @property
    def lost(self) -> bool:
        return self.loss is not None

    async def send(self, payload: bytes, *, session_id: str | None = None,
                   wait: Any = None) -> None:
        if self.loss is not None:
            raise self.loss
        message = json.loads(payload)
        self.server.received.append(message)
        await self.server.answer(self, message)

    async def receive(self) -> bytes:
        item = await self._receive.receive()
        if isinstance(item, LinkLost):
            raise item
        return item

    async def watch_session(self, session_id: str) -> None:
        return None

    async def close(self) -> None:
        self.server.closed += 1

    def push(self, message: dict[str, Any]) -> None:
        self._send.send_nowait(json.dumps(message).encode())

    def lose(self, reason: str = "cut", code: int | None = None) -> None:
        if self.loss is None:
            self.loss = LinkLost(reason, code=code)
            self._send.send_nowait(self.loss)


@dataclass
class FakeServer:
    """``connect`` for ``Relay``: each call is one link (or a ``StartupError`` while
    ``refusing``); ``on_connect`` may drop the new link at once."""

    answer: Answer = echo_result
    refusing: str | None = None        # the StartupError kind, while connects fail
    on_connect: Callable[[FakeLink], None] | None = None
    connects: int = 0
    refused: int = 0
    closed: int = 0
    links: list[FakeLink] = field(default_factory=list)
    received: list[dict[str, Any]] = field(default_factory=list)

    @contextlib.asynccontextmanager
    async def connect(self, target: Target, init: bytes) -> AsyncIterator[tuple[FakeLink, bytes]]:
        await anyio.lowlevel.checkpoint()
        if self.refusing is not None:
            self.refused += 1
            raise StartupError(f"refused ({self.refusing})", kind=self.refusing)
        self.connects += 1
        link = FakeLink(self)
        self.links.append(link)
        answer = {"jsonrpc": "2.0", "id": json.loads(init)["id"], "result": INIT_RESULT}
        if self.on_connect is not None:
            self.on_connect(link)
        yield link, json.dumps(answer).encode()

    def lose_all(self, code: int | None = None) -> None:
        for link in self.links:
            link.lose(code=code)


@dataclass
class FakeEditor:
    lines: Any
    got: list[dict[str, Any]] = field(default_factory=list)
    changed: anyio.Event = field(default_factory=anyio.Event)

    async def write(self, data: bytes) -> None:
        self.got += [json.loads(line) for line in data.splitlines() if line]
        self.changed.set()
        self.changed = anyio.Event()

    async def send(self, message: dict[str, Any]) -> None:
        await self.lines.send(json.dumps(message).encode())

    async def request(self, method: str, params: Any, rpc_id: Any) -> None:
        await self.send({"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params})

    async def until(self, match: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        with anyio.fail_after(GUARD_S):
            while True:
                for message in self.got:
                    if match(message):
                        return message
                await self.changed.wait()

    async def response(self, rpc_id: Any) -> dict[str, Any]:
        return await self.until(lambda m: m.get("id") == rpc_id and "method" not in m)


@contextlib.asynccontextmanager
async def editor_and_relay(server: FakeServer, clock: FakeClock, **options: Any
                           ) -> AsyncIterator[tuple[FakeEditor, Relay]]:
    """A relay on ``server`` and ``clock``; on leaving, the editor's stdin is closed and
    the relay awaited (under the guard)."""
    send, receive = anyio.create_memory_object_stream[bytes](100)
    editor = FakeEditor(send)
    with anyio.fail_after(GUARD_S):
        async with EditorWriter(editor.write) as out, anyio.create_task_group() as tg:
            relay = Relay(Target("http://127.0.0.1:9/acp"), out=out, clock=clock,
                          connect=server.connect, **options)
            done = anyio.Event()

            async def run() -> None:
                async with receive:
                    await relay.run(receive)
                done.set()

            tg.start_soon(run)
            async with send:
                yield editor, relay
            await done.wait()
