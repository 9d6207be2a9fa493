"""A message the server answers 503 waits its ``Retry-After`` before it goes again; the
editor's cancel must not wait behind it. A real adapter process over Streamable HTTP
to a server (an ASGI app on a loopback port) that answers every ``session/prompt``
503 with ``Retry-After: 30``: five retries are 150 s, far past the guard, so a cancel
held behind them fails the test; none of it waits on time."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest

from tests.connect.endpoint import lifespan, read_body
from tests.connect.harness import spawn_adapter
from tests.harness.local import serving

pytestmark = pytest.mark.anyio

INIT = {"protocolVersion": 1, "clientCapabilities": {}}
GUARD_S = 20.0   # far below the 30 s Retry-After: a hang fails the test, no timing
BUSY = {"jsonrpc": "2.0", "id": None,
        "error": {"code": -32603, "message": "Reply buffer full: open the stream"}}


@dataclass
class Busy:
    """What the server was sent (every POST after ``initialize``, in order)."""

    posts: list[dict[str, Any]] = field(default_factory=list)
    arrived: anyio.Event = field(default_factory=anyio.Event)

    def methods(self, method: str) -> list[dict[str, Any]]:
        return [p for p in self.posts if p.get("method") == method]

    async def until(self, method: str) -> dict[str, Any]:
        with anyio.fail_after(GUARD_S):
            while not self.methods(method):
                self.arrived = anyio.Event()
                await self.arrived.wait()
        return self.methods(method)[0]

    def asgi(self) -> Any:
        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            await self.serve(scope, receive, send)
        return app   # a function: uvicorn takes a bound method for ASGI2

    async def serve(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if await lifespan(scope, receive, send):
            return

        async def answer(status: int, body: bytes = b"",
                         headers: list[tuple[bytes, bytes]] | None = None) -> None:
            await send({"type": "http.response.start", "status": status,
                        "headers": [(b"content-type", b"application/json"),
                                    *(headers or [])]})
            await send({"type": "http.response.body", "body": body})

        if scope["method"] == "GET":   # a stream that stays open, silent
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")]})
            await send({"type": "http.response.body", "body": b": hi\n\n",
                        "more_body": True})
            while (await receive())["type"] != "http.disconnect":
                pass   # until the client goes away
            return
        if scope["method"] != "POST":
            await answer(202)
            return
        msg = json.loads(await read_body(receive))
        if msg.get("method") == "initialize":
            result = {"jsonrpc": "2.0", "id": msg["id"],
                      "result": {"protocolVersion": 1, "agentCapabilities": {}}}
            await answer(200, json.dumps(result).encode(), [(b"acp-connection-id", b"c1")])
            return
        self.posts.append(msg)
        self.arrived.set()
        if msg.get("method") == "session/prompt":
            await answer(503, json.dumps({**BUSY, "id": msg["id"]}).encode(),
                         [(b"retry-after", b"30")])
            return
        await answer(202)


def prompt(session_id: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 2, "method": "session/prompt",
            "params": {"sessionId": session_id, "prompt": [{"type": "text", "text": "hi"}]}}


async def test_a_cancel_of_the_prompt_answered_503_goes_at_once_and_withdraws_it() -> None:
    """The prompt the server refused for now is never sent again: the editor's
    ``session/cancel`` reaches the server during the wait, and the prompt ends
    ``cancelled``, as the agent would have ended it."""
    busy = Busy()
    async with serving(busy.asgi()) as base, \
            spawn_adapter(f"{base}/acp", "--transport", "http1") as adapter:
        assert "result" in await adapter.request("initialize", INIT)
        await adapter.send(prompt("s1"))
        await busy.until("session/prompt")
        await adapter.send({"jsonrpc": "2.0", "method": "session/cancel",
                            "params": {"sessionId": "s1"}})
        cancel = await busy.until("session/cancel")
        assert cancel["params"] == {"sessionId": "s1"}
        answer = await adapter.response(2, timeout=GUARD_S)
        assert answer["result"] == {"stopReason": "cancelled"}, answer
        assert len(busy.methods("session/prompt")) == 1   # withdrawn, not sent again


async def test_a_cancel_of_another_session_does_not_wait_behind_a_503() -> None:
    busy = Busy()
    async with serving(busy.asgi()) as base, \
            spawn_adapter(f"{base}/acp", "--transport", "http1") as adapter:
        assert "result" in await adapter.request("initialize", INIT)
        await adapter.send(prompt("s1"))
        await busy.until("session/prompt")
        await adapter.send({"jsonrpc": "2.0", "method": "session/cancel",
                            "params": {"sessionId": "s2"}})
        assert (await busy.until("session/cancel"))["params"] == {"sessionId": "s2"}
        # the prompt of s1 is still waiting to go again: nothing answered it
        assert len(busy.methods("session/prompt")) == 1
        assert not [m for m in adapter.received if m.get("id") == 2]


async def test_cancel_request_of_the_prompt_answered_503_withdraws_it() -> None:
    """``$/cancel_request`` of a request the server has not taken: ``-32800`` at once,
    and nothing about it reaches the server (it never had that request)."""
    busy = Busy()
    async with serving(busy.asgi()) as base, \
            spawn_adapter(f"{base}/acp", "--transport", "http1") as adapter:
        assert "result" in await adapter.request("initialize", INIT)
        await adapter.send(prompt("s1"))
        await busy.until("session/prompt")
        await adapter.send({"jsonrpc": "2.0", "method": "$/cancel_request",
                            "params": {"requestId": 2}})
        answer = await adapter.response(2, timeout=GUARD_S)
        assert answer["error"]["code"] == -32800, answer
        # a marker after it: everything the editor sent before has been dealt with
        await adapter.send({"jsonrpc": "2.0", "method": "session/cancel",
                            "params": {"sessionId": "s9"}})
        await busy.until("session/cancel")
        assert busy.methods("$/cancel_request") == []
        assert len(busy.methods("session/prompt")) == 1
