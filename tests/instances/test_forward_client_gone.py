"""The forwarder when its client goes away (helper-47's review): before the owner
answered, mid-stream, or mid-body (then nothing is forwarded: the owner never acts on
half a request). The owner is httpx's mock transport; the client's side is ASGI
messages the test scripts."""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import pytest

from acp_server.fleet.forward import Forwarder

pytestmark = pytest.mark.anyio


def _scope(method: str, path: str) -> dict[str, Any]:
    return {"type": "http", "method": method, "path": path, "raw_path": path.encode(),
            "query_string": b"", "headers": [], "client": ("127.0.0.1", 1)}


def _client(messages: list[dict[str, Any]], gone: anyio.Event) -> Any:
    """``receive``: the scripted messages, then the disconnect once ``gone`` is set."""
    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await gone.wait()
        return {"type": "http.disconnect"}
    return receive


async def test_gone_before_the_owner_answers() -> None:
    gone, asked = anyio.Event(), anyio.Event()

    async def owner(request: httpx.Request) -> httpx.Response:
        asked.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    forwarder = Forwarder(instance="me", max_body_bytes=1000)
    forwarder._client = httpx.AsyncClient(transport=httpx.MockTransport(owner))
    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    async with anyio.create_task_group() as tg:
        tg.start_soon(forwarder.relay, "http://owner", _scope("POST", "/session/s/prompt"),
                      _client([{"type": "http.request", "body": b"{}"}], gone), send)
        await asked.wait()
        gone.set()   # the relay ends quietly (it raised UnboundLocalError before)
    assert sent == []


async def test_gone_mid_body_forwards_nothing() -> None:
    asked: list[httpx.Request] = []

    async def owner(request: httpx.Request) -> httpx.Response:
        asked.append(request)
        return httpx.Response(200)

    forwarder = Forwarder(instance="me", max_body_bytes=1000)
    forwarder._client = httpx.AsyncClient(transport=httpx.MockTransport(owner))
    gone = anyio.Event()
    gone.set()
    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    await forwarder.relay("http://owner", _scope("POST", "/session/s/cancel"),
                          _client([{"type": "http.request", "body": b'{"a"',
                                    "more_body": True}], gone), send)
    assert asked == [] and sent == []
