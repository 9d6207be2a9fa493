"""A raw HTTP/2 client (the ``h2`` state machine on an anyio socket) that can misbehave:
ignore the server's stream limit, send oversized headers, never read (a tiny window).

    async with await H2Client.connect(port, window=1) as h2:
        stream_id = h2.request("GET", "/health")
        [outcome] = await h2.settle([stream_id])   # a status, "reset" or "closed"
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.abc
import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings


class H2Client:
    def __init__(self, stream: anyio.abc.SocketStream, conn: h2.connection.H2Connection,
                 port: int) -> None:
        self.stream = stream
        self.conn = conn
        self.port = port
        self.outcomes: dict[int, Any] = {}
        self.closed = False

    @classmethod
    async def connect(cls, port: int, *, window: int | None = None) -> H2Client:
        stream = await anyio.connect_tcp("127.0.0.1", port)
        conn = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=True, header_encoding=None, validate_outbound_headers=False))
        conn.initiate_connection()
        if window is not None:
            conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window})
        client = cls(stream, conn, port)
        await client.flush()
        return client

    async def __aenter__(self) -> H2Client:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stream.aclose()

    def request(self, method: str, path: str,
                extra: list[tuple[bytes, bytes]] | None = None) -> int:
        """Open a stream (ignoring the peer's concurrency limit) and end it."""
        stream_id = self.conn.get_next_available_stream_id()
        headers = [(b":method", method.encode()), (b":path", path.encode()),
                   (b":scheme", b"http"), (b":authority", f"127.0.0.1:{self.port}".encode()),
                   *(extra or [])]
        self.conn.remote_settings.max_concurrent_streams = 1 << 30
        self.conn.send_headers(stream_id, headers, end_stream=True)
        return stream_id

    async def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            await self.stream.send(data)

    async def settle(self, stream_ids: list[int], timeout: float = 20) -> list[Any]:
        """Each stream's outcome: its status (once its headers arrive), ``"reset"`` or
        ``"closed"`` (the connection ended first)."""
        await self.flush()
        with anyio.move_on_after(timeout):
            while not self.closed and any(s not in self.outcomes for s in stream_ids):
                try:
                    data = await self.stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionResetError):
                    self.closed = True
                    break
                try:
                    events = self.conn.receive_data(data)
                except h2.exceptions.ProtocolError:
                    self.closed = True
                    break
                for event in events:
                    self._note(event)
                await self.flush()
        return [self.outcomes.get(s, "closed" if self.closed else "pending") for s in stream_ids]

    def _note(self, event: Any) -> None:
        if isinstance(event, h2.events.ResponseReceived):
            status = dict(event.headers)[b":status"]
            self.outcomes.setdefault(event.stream_id, int(status))
        elif isinstance(event, h2.events.StreamReset):
            self.outcomes.setdefault(event.stream_id, "reset")
        elif isinstance(event, h2.events.DataReceived):
            # read and acknowledged, so only streams opened with a tiny window stall
            self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.closed = True
