"""The prompt's echo (the shielded start of a turn): a cancel, a deadline or a fault
that comes while the prompt is echoed settles it once, and the agent never sees a
prompt that was cancelled before it was sent."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from bridge.errors import PromptDeadlineExceededError
from tests.bridge.helpers import open_bridge, text, wait_until

pytestmark = pytest.mark.anyio


def _stall_echo(session: Any) -> tuple[anyio.Event, list[int]]:
    """Hold the echo in its wait for readers until the returned event is set."""
    gate, entered = anyio.Event(), []
    real = session.bus.wait_for_readers

    async def wait() -> None:
        entered.append(1)
        await gate.wait()
        await real()

    session.bus.wait_for_readers = wait
    return gate, entered


@pytest.mark.parametrize("how", ["cancel_session", "remove_running"])
async def test_a_cancel_during_the_echo_never_reaches_the_agent_as_a_prompt(
        tmp_path: Any, how: str) -> None:
    async with open_bridge(tmp_path, cancel_grace_ms=60_000) as (bridge, agent):
        sid = (await bridge.create_session()).session_id
        session = bridge.get_session(sid)
        gate, entered = _stall_echo(session)
        ticket = bridge.send_prompt(sid, text("hold h"))
        await wait_until(lambda: bool(entered))
        if how == "cancel_session":
            assert await bridge.cancel_session(sid) is True
        else:
            assert bridge.remove_pending_prompt(sid, ticket.prompt_id) == "running"
        assert not ticket.done   # the cancel waits for the echo (shielded)
        gate.set()
        with anyio.fail_after(10):   # not the 60 s grace: no prompt was sent
            assert (await ticket).stop_reason == "cancelled"
        assert "hold h" not in agent.prompts()
        assert session.pending_count == 0
        with anyio.fail_after(10):
            assert (await bridge.send_prompt(sid, text("ok"))).stop_reason == "end_turn"
        assert agent.prompts()[-1] == "ok"


async def test_a_deadline_during_the_echo_never_reaches_the_agent_as_a_prompt(
        tmp_path: Any) -> None:
    async with open_bridge(tmp_path, cancel_grace_ms=60_000,
                           prompt_deadline_ms=60_000) as (bridge, agent):
        sid = (await bridge.create_session()).session_id
        session = bridge.get_session(sid)
        gate, entered = _stall_echo(session)
        ticket = bridge.send_prompt(sid, text("hold h"), deadline_ms=50)
        with anyio.fail_after(10), pytest.raises(PromptDeadlineExceededError):
            await ticket
        assert session.pending_count == 0
        gate.set()
        with anyio.fail_after(10):
            assert (await bridge.send_prompt(sid, text("ok"))).stop_reason == "end_turn"
        assert agent.prompts() == ["ok"]


async def test_a_fault_while_echoing_settles_the_prompt_and_the_fifo_goes_on(
        tmp_path: Any) -> None:
    async with open_bridge(tmp_path) as (bridge, agent):
        sid = (await bridge.create_session()).session_id
        session = bridge.get_session(sid)
        real, calls = session.bus.wait_for_readers, []

        async def broken() -> None:
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("echo fault")
            await real()

        session.bus.wait_for_readers = broken
        ticket = bridge.send_prompt(sid, text("first"))
        with anyio.fail_after(10), pytest.raises(Exception, match="echo fault"):
            await ticket
        assert session.pending_count == 0 and agent.prompts() == []
        with anyio.fail_after(10):
            assert (await bridge.send_prompt(sid, text("ok"))).stop_reason == "end_turn"
