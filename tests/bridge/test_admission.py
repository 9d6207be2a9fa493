"""Prompt admission backpressure: the synchronous cap, exactly-once release, FIFO health."""

from __future__ import annotations

import math

import anyio
import msgspec
import pytest

from bridge import BridgeOptions, CancelToken
from bridge.errors import MAX_AGENT_MESSAGE, AgentError, InvalidOptionError, PromptCancelledError, PromptQueueFullError
from tests.bridge.helpers import open_bridge, text, wait_until

pytestmark = pytest.mark.anyio


async def test_sixth_prompt_is_refused_synchronously_and_counter_unchanged(tmp_path):
    async with open_bridge(tmp_path) as (bridge, agent):
        sid = (await bridge.create_session()).session_id
        tickets = [bridge.send_prompt(sid, text(f"hold k{i}")) for i in range(5)]
        session = bridge.get_session(sid)
        assert session.pending_count == 5
        with pytest.raises(PromptQueueFullError) as info:
            bridge.send_prompt(sid, text("hold extra"))
        err = info.value
        assert (err.session_id, err.limit, err.pending_count) == (sid, 5, 5)
        assert str(err) == f'Prompt queue full for session "{sid}" (5/5 pending)'
        assert session.pending_count == 5
        assert len(bridge.pending_prompts(sid)) == 5
        for i in range(5):
            agent.release(f"k{i}")
        results = [await t for t in tickets]
        assert [r.stop_reason for r in results] == ["end_turn"] * 5
        assert session.pending_count == 0


async def test_pre_cancelled_request_takes_no_slot(tmp_path):
    async with open_bridge(tmp_path, max_pending_prompts_per_session=1) as (bridge, agent):
        sid = (await bridge.create_session()).session_id
        token = CancelToken()
        token.cancel("gone")
        with pytest.raises(PromptCancelledError):
            bridge.send_prompt(sid, text("ok"), cancel=token)
        assert bridge.get_session(sid).pending_count == 0
        assert (await bridge.send_prompt(sid, text("ok"))).stop_reason == "end_turn"
        assert agent.prompts() == ["ok"]


@pytest.mark.parametrize("first", ["ok", "fail"])
async def test_release_then_recover(tmp_path, first):
    async with open_bridge(tmp_path, max_pending_prompts_per_session=1) as (bridge, agent):
        sid = (await bridge.create_session()).session_id
        ticket = bridge.send_prompt(sid, text(first))
        with pytest.raises(PromptQueueFullError):
            bridge.send_prompt(sid, text("ok"))
        try:
            await ticket
        except AgentError:
            assert first == "fail"
        assert bridge.get_session(sid).pending_count == 0
        assert (await bridge.send_prompt(sid, text("ok"))).stop_reason == "end_turn"


async def test_failure_does_not_poison_the_fifo(tmp_path):
    async with open_bridge(tmp_path) as (bridge, agent):
        sid = (await bridge.create_session()).session_id
        hold = bridge.send_prompt(sid, text("hold a"))
        failing = bridge.send_prompt(sid, text("fail"))
        after = bridge.send_prompt(sid, text("ok"))
        agent.release("a")
        assert (await hold).stop_reason == "end_turn"
        with pytest.raises(AgentError) as info:
            await failing
        assert info.value.rpc_code == -32603
        assert (await after).stop_reason == "end_turn"
        assert agent.prompts() == ["hold a", "fail", "ok"]
        assert bridge.get_session(sid).pending_count == 0


async def test_an_embedders_agent_error_is_bounded(tmp_path):
    """An ``AgentError`` raised by an embedder's own ``AgentConnection`` (not one of our
    connections, which bounded theirs) is bounded as it is made: its message cut, its
    big ``data`` replaced by the marker that keeps its ``errorKind``."""
    async with open_bridge(tmp_path) as (bridge, agent):
        sid = (await bridge.create_session()).session_id
        with pytest.raises(AgentError) as info:
            await bridge.send_prompt(sid, text("hostile"))
        assert info.value.message == "r" * MAX_AGENT_MESSAGE
        assert info.value.data["errorKind"] == "k" and info.value.data["truncated"] is True
        assert len(msgspec.json.encode(info.value.data)) < 100


@pytest.mark.parametrize("limit", [0, math.inf])
async def test_unlimited_accepts_fifty(tmp_path, limit):
    async with open_bridge(tmp_path, max_pending_prompts_per_session=limit) as (bridge, agent):
        assert bridge.options.pending_prompt_limit is None
        sid = (await bridge.create_session()).session_id
        tickets = [bridge.send_prompt(sid, text("hold gate" if i == 0 else f"p{i}")) for i in range(50)]
        assert bridge.get_session(sid).pending_count == 50
        agent.release("gate")
        results = [await t for t in tickets]
        assert len(results) == 50
        assert agent.prompts()[1:] == [f"p{i}" for i in range(1, 50)]


@pytest.mark.parametrize("option", ["max_pending_prompts_per_session", "max_sessions"])
@pytest.mark.parametrize("value", [-1, 1.5, math.nan, True, "5", None])
def test_invalid_count_limits_rejected(option, value):
    with pytest.raises(InvalidOptionError) as info:
        BridgeOptions(**{option: value})
    message = str(info.value)
    assert message.startswith(f"Invalid {option}: ")
    assert "Must be a non-negative integer (0 / inf = unlimited)." in message


def test_invalid_option_message_is_exact():
    with pytest.raises(InvalidOptionError, match=r"^Invalid max_pending_prompts_per_session: -1\. "
                       r"Must be a non-negative integer \(0 / inf = unlimited\)\.$"):
        BridgeOptions(max_pending_prompts_per_session=-1)


@pytest.mark.parametrize(("option", "value"), [
    ("prompt_deadline_ms", 0), ("prompt_deadline_ms", -5), ("prompt_deadline_ms", 1.5),
    ("event_ring_size", 0), ("event_ring_size", 1_000_001), ("event_ring_size", True),
    ("session_idle_timeout_ms", -1), ("session_reap_interval_ms", 2.5),
    ("permission_response_timeout_ms", -1), ("initialize_timeout_ms", 0),
    ("max_subscribers_per_session", 0), ("subscriber_max_queued", 8),
    ("session_on_restart", "retry"), ("session_on_restart", None),
])
def test_invalid_other_options_rejected(option, value):
    with pytest.raises(InvalidOptionError, match=f"Invalid {option}: "):
        BridgeOptions(**{option: value})


def test_valid_options_accepted():
    options = BridgeOptions(max_pending_prompts_per_session=12, max_sessions=math.inf,
                            prompt_deadline_ms=1000, event_ring_size=1, session_idle_timeout_ms=0)
    assert options.pending_prompt_limit == 12
    assert options.session_limit is None


async def test_cancelled_token_cancels_queued_prompt_without_reaching_agent(tmp_path):
    async with open_bridge(tmp_path) as (bridge, agent):
        sid = (await bridge.create_session()).session_id
        hold = bridge.send_prompt(sid, text("hold a"))
        token = CancelToken()
        queued = bridge.send_prompt(sid, text("never"), cancel=token)
        assert bridge.get_session(sid).pending_count == 2
        token.cancel("caller gone")
        assert (await queued).stop_reason == "cancelled"
        assert bridge.get_session(sid).pending_count == 1
        agent.release("a")
        await hold
        await anyio.sleep(0.01)
        assert "never" not in agent.prompts()


async def test_admission_in_concurrent_tasks_never_exceeds_limit(tmp_path):
    async with open_bridge(tmp_path, max_pending_prompts_per_session=3) as (bridge, agent):
        sid = (await bridge.create_session()).session_id
        accepted, refused = [], []

        async def submit(i: int) -> None:
            await anyio.sleep(0)
            try:
                accepted.append(bridge.send_prompt(sid, text(f"hold c{i}")))
            except PromptQueueFullError:
                refused.append(i)

        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(submit, i)
        assert len(accepted) == 3 and len(refused) == 17
        await wait_until(lambda: bridge.get_session(sid).active is not None)
        for i in range(20):
            agent.release(f"c{i}")
        for ticket in accepted:
            await ticket
        assert bridge.get_session(sid).pending_count == 0
