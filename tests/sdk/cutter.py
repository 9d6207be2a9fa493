"""A loopback TCP proxy that loses connections the way a network or a restart does.

    async with cutter(server.port) as proxy:
        proxy.cut_prompts = 1          # the next prompt POST reaches the server, its answer never
        async with DaemonClient(proxy.url) as client: ...
        await proxy.down()             # every connection closed, then connections refused
        await proxy.up()               # listening again on the same port

Contracts: bytes pass unchanged both ways. A connection whose request starts ``POST
…/prompt `` while ``cut_prompts`` is above 0 is closed on both sides as the server's
answer starts (no byte of it reaches the client), and ``cut_prompts`` drops by one.
``down()`` closes the listener and every open connection: a new connection is refused
by the kernel until ``up()``. ``prompt_posts`` counts the prompt POSTs that reached the
server, ``connections`` the connections accepted. Every task belongs to the context
manager's task group.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import anyio
import anyio.abc


@dataclass
class Cutter:
    upstream_port: int
    port: int = 0
    cut_prompts: int = 0
    prompt_posts: int = 0
    connections: int = 0
    _listener: anyio.abc.Listener[anyio.abc.SocketStream] | None = None
    _scopes: set[anyio.CancelScope] = field(default_factory=set)
    _tasks: anyio.abc.TaskGroup | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def up(self) -> None:
        assert self._tasks is not None and self._listener is None
        [self._listener] = (await anyio.create_tcp_listener(
            local_host="127.0.0.1", local_port=self.port)).listeners
        self.port = self._listener.extra(anyio.abc.SocketAttribute.local_port)
        self._tasks.start_soon(self._serve, self._listener)

    async def down(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            await listener.aclose()
        for scope in list(self._scopes):
            scope.cancel()
        while self._scopes:   # until every connection is closed
            await anyio.sleep(0.005)

    async def _serve(self, listener: anyio.abc.SocketListener) -> None:
        assert self._tasks is not None
        while True:
            try:
                client = await listener.accept()
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                return   # down()
            self.connections += 1
            self._tasks.start_soon(self._connection, client)

    async def _connection(self, client: anyio.abc.SocketStream) -> None:
        with anyio.CancelScope() as scope:
            self._scopes.add(scope)
            try:
                upstream = await anyio.connect_tcp("127.0.0.1", self.upstream_port)
                async with client, upstream, anyio.create_task_group() as pumps:
                    cut = anyio.Event()
                    pumps.start_soon(self._requests, client, upstream, cut)
                    pumps.start_soon(self._answers, upstream, client, cut, pumps.cancel_scope)
            except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass
            finally:
                self._scopes.discard(scope)

    async def _requests(self, client: anyio.abc.SocketStream, upstream: anyio.abc.SocketStream,
                        cut: anyio.Event) -> None:
        async for chunk in client:
            head = chunk.split(b"\r\n", 1)[0]
            if head.startswith(b"POST ") and head.split(b" ")[1].endswith(b"/prompt"):
                self.prompt_posts += 1
                if self.cut_prompts > 0:
                    self.cut_prompts -= 1
                    cut.set()
            await upstream.send(chunk)
        await upstream.send_eof()

    async def _answers(self, upstream: anyio.abc.SocketStream, client: anyio.abc.SocketStream,
                       cut: anyio.Event, pumps: anyio.CancelScope) -> None:
        async for chunk in upstream:
            if cut.is_set():
                pumps.cancel()   # the answer arrived: lost on the way
                return
            await client.send(chunk)
        pumps.cancel()


@contextlib.asynccontextmanager
async def cutter(upstream_port: int) -> AsyncIterator[Cutter]:
    proxy = Cutter(upstream_port)
    async with anyio.create_task_group() as tasks:
        proxy._tasks = tasks
        await proxy.up()
        try:
            yield proxy
        finally:
            await proxy.down()
            tasks.cancel_scope.cancel()
