"""``SessionChannel``: bus events translated as the reader takes them, in arrival
order with the direct replies, with nothing between the bus subscription and the
reader (#22 section 4)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from acp_server.acp_http.connection import AcpConnection
from bridge.jsonrpc import encode_result
from tests.bridge.helpers import open_bridge, text, wait_until

pytestmark = pytest.mark.anyio


def _drain(channel: Any) -> list[dict[str, Any]]:
    out = []
    while (frame := channel.pop()) is not None:
        out.append(json.loads(frame.payload))
    channel.sent(len(out))
    return out


def _kind(message: dict[str, Any]) -> str:
    if "id" in message and "method" not in message:
        return f"reply {message['id']}"
    params = message.get("params", {})
    return params.get("kind") or params.get("update", {}).get("sessionUpdate") or message["method"]


async def test_replies_and_events_leave_in_the_order_they_arrived(tmp_path: Path) -> None:
    async with open_bridge(tmp_path) as (bridge, agent):
        sid = (await bridge.create_session()).session_id
        conn = AcpConnection("c", bridge)
        channel = conn.channel(sid)
        channel.push(encode_result(1, {"first": True}))      # before any event
        ticket = bridge.send_prompt(sid, text("hold k"))      # echo, then the agent's chunk
        await wait_until(lambda: "hold k" in agent.prompts())   # the echo is queued
        channel.push(encode_result(2, {"second": True}))
        agent.release("k")
        await ticket
        channel.push(encode_result(3, {"third": True}))      # after the turn ended
        kinds = [_kind(m) for m in _drain(channel)]
        assert kinds.index("reply 1") < kinds.index("user_message_chunk") < kinds.index(
            "reply 2") < kinds.index("turn_complete") < kinds.index("reply 3")
        assert channel.written_id == bridge.session_status(sid).last_event_id


async def test_the_channel_resubscribes_after_an_eviction_and_misses_nothing(
        tmp_path: Path) -> None:
    async with open_bridge(tmp_path, subscriber_max_queued=16) as (bridge, _agent):
        sid = (await bridge.create_session()).session_id
        conn = AcpConnection("c", bridge)
        channel = conn.channel(sid)
        for i in range(20):   # nobody reads: the subscription overflows and is evicted
            await bridge.send_prompt(sid, text(f"turn {i}"))
        assert channel.subscription is not None and channel.subscription.evicted_reason
        frames: list[dict[str, Any]] = []
        while await channel.wait_ready():
            batch = _drain(channel)
            frames.extend(batch)
            if channel.written_id == bridge.session_status(sid).last_event_id:
                break
        users = [m for m in frames if _kind(m) == "user_message_chunk"]
        assert [u["params"]["update"]["content"]["text"] for u in users] == [
            f"turn {i}" for i in range(20)]
        assert not [m for m in frames if _kind(m) == "client_evicted"]
