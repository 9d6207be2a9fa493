"""The WebSocket keep-alive of ``acp-server connect``'s link, over real sockets: a peer
that goes silent (a TCP relay that holds every byte, the sockets open) is found lost;
a consumer that does not read for many ping intervals (an editor that does not read
the adapter's stdout) is not declared dead for it, and gets every message after."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
import trio.testing

from acp_server.connect.link import LinkLost, Target, WebSocketLink, open_link
from tests.acp_http.server import running_acp_server
from tests.bridge.helpers import wait_until
from tests.connect.harness import port_of, tcp_relay

pytestmark = pytest.mark.anyio

PING_S = 0.2
READING_PING_S = 1.0
INIT = json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                   "params": {"protocolVersion": 1}}).encode()


def message(rpc_id: int, method: str, params: dict[str, object]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": rpc_id, "method": method,
                       "params": params}).encode()


async def test_a_silent_peer_is_found_lost(tmp_path: Path) -> None:
    async with running_acp_server(tmp_path) as srv, tcp_relay(port_of(srv.base_url)) as relay:
        target = Target(f"http://127.0.0.1:{relay.port}/acp", transport="websocket",
                        ping_s=PING_S)
        async with open_link(target, INIT) as (link, _answer):
            relay.freeze()
            with anyio.fail_after(20), pytest.raises(LinkLost) as lost:
                await link.receive()
            relay.thaw()
    assert "keep-alive" in str(lost.value)


async def test_a_consumer_that_does_not_read_is_not_declared_dead(tmp_path: Path) -> None:
    async with running_acp_server(tmp_path) as srv:
        # a longer interval than the silent peer's test: once the consumer reads again,
        # a loaded machine may not run this process for a moment, and a pong unread for
        # a whole interval then is taken for a lost peer (a CI run saw it at 0.2 s)
        target = Target(f"{srv.base_url}/acp", transport="websocket", ping_s=READING_PING_S)
        async with open_link(target, INIT) as (link, _answer):
            assert isinstance(link, WebSocketLink)
            await link.send(message(1, "session/new", {"cwd": srv.workspace,
                                                       "mcpServers": []}))
            sid = json.loads(await link.receive())["result"]["sessionId"]
            await link.send(message(2, "session/prompt", {
                "sessionId": sid, "prompt": [{"type": "text", "text": "/chunks 300 hello"}]}))
            # nothing read for several ping intervals (the keep-alive checks four times
            # an interval): the frames, and the pong behind them, wait unread
            with anyio.fail_after(30):
                await wait_until(lambda: link.excused >= 4 * 3, timeout=30)
            got: list[dict[str, object]] = []
            with anyio.fail_after(20):
                while not any(m.get("id") == 2 for m in got):
                    got.append(json.loads(await link.receive()))
            assert got[-1]["result"] == {"stopReason": "end_turn"}
            chunks = [m for m in got if m.get("method") == "session/update"
                      and m["params"]["update"]["sessionUpdate"] == "agent_message_chunk"]
            assert len(chunks) == 300


class _SilentPongs:
    """A WebSocket stand-in whose pings are never answered; the test hands the reader
    frames (``frames``)."""

    def __init__(self) -> None:
        self.frames, self._inbox = anyio.create_memory_object_stream[str](8)
        self.pinged = anyio.Event()

    async def ping(self) -> anyio.Event:
        self.pinged.set()
        return anyio.Event()   # never set

    async def receive_text(self) -> str:
        return await self._inbox.receive()

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self._inbox.close()


@pytest.mark.parametrize("anyio_backend", [
    pytest.param(("trio", {"clock": trio.testing.MockClock(autojump_threshold=0)}),
                 id="trio-mock-clock")])
async def test_a_frame_read_just_past_the_deadline_is_taken_for_life() -> None:
    """The keep-alive looks twice past the pong's deadline, a quarter interval apart,
    before it calls the peer gone: what the reader takes in between (a busy machine
    had not run it at the first look) shows the link alive. Virtual time (trio's
    MockClock): nothing here depends on how fast the machine runs."""
    fake = _SilentPongs()
    link = WebSocketLink(fake)
    got: list[bytes] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(link.keep_alive, 1.0)
        await fake.pinged.wait()
        sent = anyio.current_time()

        async def reader() -> None:
            with pytest.raises(LinkLost):
                while True:
                    got.append(await link.receive())

        tg.start_soon(reader)
        await anyio.sleep_until(sent + 1.1)   # past the deadline (a look at +1.0)
        await fake.frames.send("late but alive")
        await anyio.sleep_until(sent + 1.4)   # the look at +1.25 saw it
        assert got == [b"late but alive"] and link._dead is None
        with anyio.fail_after(10):            # silent from then on: found gone
            while link._dead is None:
                await anyio.sleep(0.25)
        tg.cancel_scope.cancel()
    assert "keep-alive" in (link._dead or "")
