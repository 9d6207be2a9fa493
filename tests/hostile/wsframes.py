"""Hand-built WebSocket frames (RFC 6455) on a bare TCP connection, for what a
well-behaved client library will not send: invalid UTF-8 in a text frame, a message
split into thousands of continuation frames, a ping flood, a frame over the cap sent
whole before anything is read.

    raw = await RawWs.open(port)                 # the upgrade; raw.status, raw.head
    await raw.send(frame(TEXT, b'{"jsonrpc":...}'))
    opcode, payload = await raw.next_frame()     # (CLOSE, b"\\x03\\xf1...") etc.
    code = await raw.close_code()                # the server's close code (1005: none,
                                                 # 1006: the connection ended without one)

Frames from the client are masked, as the protocol requires, with the all-zero key
(legal: the key is any four bytes), so a payload of megabytes costs no Python loop.
"""

from __future__ import annotations

import base64
import os
import struct

import anyio
import anyio.abc

CONTINUATION, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
ZERO_MASK = b"\0\0\0\0"


def frame(opcode: int, payload: bytes = b"", *, fin: bool = True) -> bytes:
    """One client frame (masked with the zero key)."""
    head = bytes([(0x80 if fin else 0) | opcode])
    size = len(payload)
    if size < 126:
        head += bytes([0x80 | size])
    elif size < 1 << 16:
        head += bytes([0x80 | 126]) + struct.pack("!H", size)
    else:
        head += bytes([0x80 | 127]) + struct.pack("!Q", size)
    return head + ZERO_MASK + payload


def upgrade(port: int, path: str = "/acp", *, key: str | None = "",
            version: str | None = "13", extra: str = "") -> bytes:
    """An upgrade request; ``key`` / ``version`` ``None`` leave the header out, and
    ``key`` ``""`` is a fresh valid key."""
    lines = [f"GET {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Upgrade: websocket",
             "Connection: Upgrade"]
    if version is not None:
        lines.append(f"Sec-WebSocket-Version: {version}")
    if key is not None:
        lines.append(f"Sec-WebSocket-Key: {key or base64.b64encode(os.urandom(16)).decode()}")
    return ("\r\n".join(lines) + "\r\n" + extra + "\r\n").encode()


class RawWs:
    def __init__(self, stream: anyio.abc.SocketStream, head: bytes, rest: bytes) -> None:
        self.stream = stream
        self.head = head.decode("latin-1")
        self.status = int(self.head.split(" ", 2)[1])
        self.body = rest if self.status != 101 else b""
        self._buf = rest if self.status == 101 else b""

    @classmethod
    async def open(cls, port: int, request: bytes | None = None, *,
                   timeout: float = 30) -> RawWs:
        """Connect and send ``request`` (a valid upgrade by default); returns once the
        answer's head arrived (a refusal's body, as far as it came, is ``body``)."""
        stream = await anyio.connect_tcp("127.0.0.1", port)
        buf = b""
        with anyio.fail_after(timeout):
            await stream.send(request if request is not None else upgrade(port))
            while b"\r\n\r\n" not in buf:
                try:
                    buf += await stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    break
        head, _, rest = buf.partition(b"\r\n\r\n")
        raw = cls(stream, head, rest)
        if raw.status != 101:
            with anyio.move_on_after(2):   # the rest of a short refusal body, if any
                while b"}" not in raw.body and len(raw.body) < 4096:
                    try:
                        raw.body += await stream.receive()
                    except (anyio.EndOfStream, anyio.BrokenResourceError):
                        break
        return raw

    async def send(self, data: bytes) -> None:
        await self.stream.send(data)

    async def next_frame(self, timeout: float = 30) -> tuple[int, bytes]:
        """The server's next frame (unmasked, not reassembled); ``anyio.EndOfStream``
        when the connection ends first."""
        with anyio.fail_after(timeout):
            while True:
                parsed = _parse(self._buf)
                if parsed is not None:
                    opcode, payload, used = parsed
                    self._buf = self._buf[used:]
                    return opcode, payload
                try:
                    self._buf += await self.stream.receive()
                except (anyio.BrokenResourceError, ConnectionResetError):
                    raise anyio.EndOfStream from None

    async def next_text(self, timeout: float = 30) -> bytes:
        """The next text frame, skipping pongs and pings."""
        while True:
            opcode, payload = await self.next_frame(timeout)
            if opcode == TEXT:
                return payload
            if opcode == CLOSE:
                raise AssertionError(f"closed: {payload!r}")

    async def close_code(self, timeout: float = 30) -> int:
        """Read until the server's close frame (its code; 1005 without one) or the
        end of the connection (1006); other frames are skipped."""
        while True:
            try:
                opcode, payload = await self.next_frame(timeout)
            except anyio.EndOfStream:
                return 1006
            if opcode == CLOSE:
                return struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005

    async def aclose(self) -> None:
        await self.stream.aclose()


def _parse(buf: bytes) -> tuple[int, bytes, int] | None:
    if len(buf) < 2:
        return None
    size, offset = buf[1] & 0x7F, 2
    if size == 126:
        if len(buf) < 4:
            return None
        size, offset = struct.unpack("!H", buf[2:4])[0], 4
    elif size == 127:
        if len(buf) < 10:
            return None
        size, offset = struct.unpack("!Q", buf[2:10])[0], 10
    if len(buf) < offset + size:
        return None
    return buf[0] & 0x0F, buf[offset:offset + size], offset + size
