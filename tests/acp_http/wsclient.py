"""A minimal WebSocket client on anyio + wsproto, so WebSocket tests run on both
backends (the SDK's client is asyncio-only).

    async with ws_connect(srv.base_url, "/acp") as ws:
        await ws.send_json({"jsonrpc": "2.0", "id": 0, "method": "initialize", ...})
        reply = await ws.receive_json()
"""

from __future__ import annotations

import contextlib
import json
from collections import deque
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import anyio
import anyio.abc
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    CloseConnection,
    Message,
    Ping,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)


class WsRejected(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"rejected with HTTP {status}")
        self.status = status


class WsClosed(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(f"closed with {code}")
        self.code = code


class WsClient:
    def __init__(self, stream: anyio.abc.SocketStream, ws: WSConnection) -> None:
        self.stream = stream
        self.ws = ws
        self.headers: dict[str, str] = {}
        self.subprotocol: str | None = None
        self._inbox: deque[str] = deque()
        self._text: list[str] = []
        self.close_code: int | None = None

    async def _pump(self) -> None:
        data = await self.stream.receive()
        self.ws.receive_data(data)
        for event in self.ws.events():
            if isinstance(event, TextMessage):
                self._text.append(event.data)
                if event.message_finished:
                    self._inbox.append("".join(self._text))
                    self._text = []
            elif isinstance(event, Message):
                continue   # binary
            elif isinstance(event, Ping):
                await self.stream.send(self.ws.send(event.response()))
            elif isinstance(event, CloseConnection):
                self.close_code = event.code
                with contextlib.suppress(Exception):
                    await self.stream.send(self.ws.send(event.response()))
            elif isinstance(event, AcceptConnection):
                self.headers = {k.decode().lower(): v.decode() for k, v in event.extra_headers}
                self.subprotocol = event.subprotocol
            elif isinstance(event, (RejectConnection, RejectData)):
                raise WsRejected(getattr(event, "status_code", 0))

    async def send_text(self, value: str) -> None:
        await self.stream.send(self.ws.send(TextMessage(data=value)))

    async def send_json(self, value: Any) -> None:
        await self.send_text(json.dumps(value))

    async def receive_text(self, timeout: float = 30.0) -> str:
        with anyio.fail_after(timeout):
            while not self._inbox:
                if self.close_code is not None:
                    raise WsClosed(self.close_code)
                await self._pump()
            return self._inbox.popleft()

    async def receive_json(self, timeout: float = 30.0) -> Any:
        return json.loads(await self.receive_text(timeout))

    async def wait_for(self, match: Any, timeout: float = 30.0) -> dict[str, Any]:
        with anyio.fail_after(timeout):
            while True:
                message = await self.receive_json(timeout)
                if match(message):
                    return message  # type: ignore[no-any-return]

    async def wait_closed(self, timeout: float = 30.0) -> int:
        with anyio.fail_after(timeout):
            while self.close_code is None:
                try:
                    await self._pump()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    break
        return self.close_code if self.close_code is not None else 1006

    async def close(self, code: int = 1000) -> None:
        """A close frame: 1000 ends the connection on the server (like DELETE), any
        other code leaves a resumable connection's sessions to a reconnect."""
        with contextlib.suppress(Exception):
            await self.stream.send(self.ws.send(CloseConnection(code=code)))


@contextlib.asynccontextmanager
async def ws_connect(base_url: str, path: str = "/acp", *, headers: dict[str, str] | None = None,
                     subprotocols: list[str] | None = None) -> AsyncIterator[WsClient]:
    parts = urlsplit(base_url)
    stream = await anyio.connect_tcp(parts.hostname or "127.0.0.1", parts.port or 80)
    async with stream:
        ws = WSConnection(ConnectionType.CLIENT)
        extra = [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
        await stream.send(ws.send(Request(host=parts.netloc, target=path, extra_headers=extra,
                                          subprotocols=subprotocols or [])))
        client = WsClient(stream, ws)
        with anyio.fail_after(30):
            while not client.headers and client.subprotocol is None:
                await client._pump()
        try:
            yield client
        finally:
            await client.close()
