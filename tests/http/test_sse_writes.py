"""``SseResponse``'s ends, driven as an ASGI app with a hand-made ``send``/``receive``:
a failed write is the client gone (``after_disconnect`` runs), an ``OSError`` of the
frames' own source is not, and a cancel from outside is never taken for a disconnect
(it propagates, ``after_disconnect`` does not run)."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from acp_server.http.sse import SseResponse

pytestmark = pytest.mark.anyio


class Frames(SseResponse):
    """One frame, then the end; ``fail`` raises from the source instead."""

    def __init__(self, fail: BaseException | None = None) -> None:
        self.ends: list[str] = []
        super().__init__(keepalive_comment=b"ka", heartbeat_s=60.0,
                         on_close=lambda: self.ends.append("closed"),
                         after_disconnect=self._gone)
        self.fail = fail
        self.left = [b"data: 1\n\n"]

    async def _gone(self) -> None:
        self.ends.append("after_disconnect")

    async def wait_ready(self) -> bool:
        if self.fail is not None:
            raise self.fail
        return bool(self.left)

    def pop_frame(self) -> bytes | None:
        return self.left.pop() if self.left else None


class Peer:
    """The server side: ``send`` fails from the ``fail_at``-th message on (a closed
    transport); ``receive`` waits (shielded unless ``shield=False``) until ``release``:
    a disconnect the server has not seen yet, which keeps the stream's task group open."""

    def __init__(self, fail_at: int | None = None, *, shield: bool = True) -> None:
        self.sent: list[dict[str, Any]] = []
        self.shield = shield
        self.fail_at = fail_at
        self.failed = anyio.Event()
        self.release = anyio.Event()

    async def send(self, message: dict[str, Any]) -> None:
        if self.fail_at is not None and len(self.sent) + 1 >= self.fail_at:
            self.failed.set()
            raise OSError("the client went away")
        self.sent.append(message)

    async def receive(self) -> dict[str, Any]:
        with anyio.CancelScope(shield=self.shield):
            await self.release.wait()
        return {"type": "http.disconnect"}


async def test_a_failed_write_is_the_client_gone() -> None:
    stream, peer = Frames(), Peer(fail_at=3)   # the head, the retry line, then the frame
    peer.release.set()
    await stream({"type": "http"}, peer.receive, peer.send)
    assert stream.disconnected and not stream.finished
    assert stream.ends == ["closed", "after_disconnect"]


async def test_an_oserror_of_the_source_is_not_a_disconnect() -> None:
    stream, peer = Frames(fail=TimeoutError("the store did not answer")), Peer(shield=False)
    with pytest.raises(BaseException) as raised:
        await stream({"type": "http"}, peer.receive, peer.send)
    assert raised.group_contains(TimeoutError) if isinstance(raised.value, BaseExceptionGroup) \
        else isinstance(raised.value, TimeoutError)
    assert not stream.disconnected
    assert stream.ends == ["closed"]          # no after_disconnect: nobody went away


async def test_a_cancel_from_outside_during_a_failed_write_propagates() -> None:
    stream, peer = Frames(), Peer(fail_at=3)
    async with anyio.create_task_group() as tg:
        outer = anyio.CancelScope()

        async def serve() -> None:
            with outer:
                await stream({"type": "http"}, peer.receive, peer.send)
                await anyio.lowlevel.checkpoint()   # trio delivers a scope's cancel here

        tg.start_soon(serve)
        await peer.failed.wait()        # the write failed; the group waits on receive
        outer.cancel()
        peer.release.set()
    assert outer.cancelled_caught
    assert stream.ends[0] == "closed"


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_an_asyncio_task_cancel_during_a_failed_write_is_not_swallowed() -> None:
    """A server's own ``task.cancel()`` (uvicorn's graceful timeout, ``asyncio.run``'s
    end) arriving while the stream's task group unwinds a failed write."""
    stream, peer = Frames(), Peer(fail_at=3)
    task = asyncio.ensure_future(stream({"type": "http"}, peer.receive, peer.send))
    await peer.failed.wait()
    task.cancel()
    peer.release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()
    assert stream.ends == ["closed"]
