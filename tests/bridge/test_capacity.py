"""The session cap, each agent's share of it, and the deadline of agent requests
(``bridge.capacity``, ``Bridge``)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from bridge import Bridge, BridgeOptions
from bridge.capacity import SessionCapacity
from bridge.errors import AgentRequestTimeoutError, SessionLimitExceededError
from tests.bridge.helpers import wait_until
from tests.bridge.scripted_agent import ScriptedAgent

pytestmark = pytest.mark.anyio


def test_each_agent_keeps_its_reserve() -> None:
    capacity = SessionCapacity(32, ["a", "b"])
    assert capacity.reserve == 8 and capacity.share("a") == 24
    for _ in range(24):
        capacity.take("a")
    with pytest.raises(SessionLimitExceededError) as refused:
        capacity.take("a")
    assert (refused.value.scope, refused.value.agent, refused.value.limit) == ("agent", "a", 24)
    for _ in range(8):
        capacity.take("b")            # b's reserve was kept for it
    with pytest.raises(SessionLimitExceededError) as full:
        capacity.take("b")
    assert full.value.scope == "workspace" and full.value.limit == 32
    capacity.release("a")
    capacity.take("b")                # b may grow past its reserve into free room
    assert capacity.share("a") == 32 - 9 and capacity.held("b") == 9


def test_one_agent_uses_the_whole_cap_and_no_cap_means_no_share() -> None:
    alone = SessionCapacity(4, ["a"])
    for _ in range(4):
        alone.take("a")
    assert not alone.available("a")
    unlimited = SessionCapacity(None, ["a", "b"])
    for _ in range(1000):
        unlimited.take("a")
    assert unlimited.available("b") and unlimited.share("b") is None


def test_many_agents_get_no_reserve_when_the_cap_is_small() -> None:
    capacity = SessionCapacity(4, [f"agent-{i}" for i in range(10)])
    assert capacity.reserve == 0
    for _ in range(4):
        capacity.take("agent-0")
    assert not capacity.available("agent-1")


def test_an_agent_added_later_gets_a_reserve_and_keeps_the_slots_held() -> None:
    capacity = SessionCapacity(16, ["a", "b"])
    for _ in range(12):
        capacity.take("a")
    capacity.add("c")                 # a model listed later: k = 3
    capacity.add("c")                 # once only
    assert capacity.reserve == 16 // 6 and capacity.held("a") == 12
    assert capacity.share("a") == 16 - 2 * 2 and capacity.available("c")
    capacity.take("c")
    capacity.take("c")
    assert capacity.share("b") == 16 - 12 - 2


def test_a_slot_held_under_a_name_that_is_no_agent_yet() -> None:
    """A restored session whose model is not listed holds its slot on its own name:
    it counts against the others, gets no reserve, and keeps it once listed."""
    capacity = SessionCapacity(8, ["a", "b"])
    capacity.take("gone")
    assert capacity.reserve == 2 and capacity.held("gone") == 1
    assert capacity.share("a") == 8 - 2 - 1   # b's reserve, gone's one slot
    capacity.add("gone")
    assert capacity.reserve == 1 and capacity.held("gone") == 1
    assert capacity.share("a") == 8 - 1 - 1
    capacity.release("gone")
    assert capacity.taken == 0


async def test_a_hung_agent_holds_only_its_share(tmp_path: Path) -> None:
    hung, other = ScriptedAgent("hung"), ScriptedAgent("other")
    hung.hang_new = anyio.Event()
    async with Bridge(hung, workspace_cwd=str(tmp_path), agents={"other": other},
                      options=BridgeOptions(max_sessions=8)) as bridge:
        async with anyio.create_task_group() as tg:
            for _ in range(6):
                tg.start_soon(bridge.create_session)
            await wait_until(lambda: bridge.stats().admission_in_flight == 6)
            with pytest.raises(SessionLimitExceededError) as refused:
                await bridge.create_session()
            assert refused.value.scope == "agent"
            info = await bridge.create_session(agent="other")   # its reserve: 8 // 4 = 2
            await bridge.create_session(agent="other")
            with pytest.raises(SessionLimitExceededError):
                await bridge.create_session(agent="other")       # all 8 slots taken
            tg.cancel_scope.cancel()                             # the callers give up
        assert bridge.stats().admission_in_flight == 0 and bridge.capacity.taken == 2
        await bridge.close_session(info.session_id)
        assert bridge.capacity.taken == 1


async def test_agent_requests_time_out_and_give_the_slot_back(tmp_path: Path) -> None:
    hung = ScriptedAgent("hung")
    hung.hang_new = anyio.Event()
    async with Bridge(hung, workspace_cwd=str(tmp_path),
                      options=BridgeOptions(agent_request_timeout_ms=50)) as bridge:
        with pytest.raises(AgentRequestTimeoutError) as timed_out:
            await bridge.create_session()
        assert (timed_out.value.code, timed_out.value.phase) == ("agent_request_timeout",
                                                                 "session/new")
        assert bridge.stats().admission_in_flight == 0 and bridge.capacity.taken == 0
        hung.hang_new.set()
        assert (await bridge.create_session()).session_id


async def test_wait_for_session_slot_returns_when_one_frees(tmp_path: Path) -> None:
    agent = ScriptedAgent()
    async with Bridge(agent, workspace_cwd=str(tmp_path),
                      options=BridgeOptions(max_sessions=1)) as bridge:
        info = await bridge.create_session()
        with pytest.raises(SessionLimitExceededError):
            await bridge.create_session()
        freed: list[bool] = []

        async def waiter() -> None:
            await bridge.wait_for_session_slot()
            freed.append(True)

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            assert freed == []
            await bridge.close_session(info.session_id)
        assert freed == [True]
        await bridge.create_session()
