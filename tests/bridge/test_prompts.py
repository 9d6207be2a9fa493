"""Cancel, deadlines, removal, branch, and the events of a turn."""

from __future__ import annotations

import anyio
import pytest

from bridge.errors import (
    AgentDiedError,
    BranchWhilePromptActiveError,
    PromptDeadlineExceededError,
    PromptNotFoundError,
    SessionClosedError,
)
from tests.bridge.helpers import drain, envelope, open_bridge, text, wait_until

pytestmark = pytest.mark.anyio


def types(frames):
    return [f.type for f in frames]


async def test_turn_events_in_order(tmp_path):
    async with open_bridge(tmp_path) as (bridge, agent):
        sid = (await bridge.create_session()).session_id
        sub = bridge.subscribe(sid)
        first = bridge.send_prompt(sid, text("hold a"))
        await wait_until(lambda: bridge.get_session(sid).active is not None)
        second = bridge.send_prompt(sid, text("ok"))
        agent.release("a")
        await first
        await second
        frames = drain(sub)
        assert types(frames) == [
            "session_update", "session_update",            # echo + agent chunk of the first
            "pending_prompt_added",                         # second had to wait
            "turn_complete",
            "pending_prompt_started", "session_update", "session_update",
            "turn_complete", "pending_prompt_completed",
        ]
        echo = envelope(frames[0])
        assert echo.data["update"]["_meta"] == {"source": "bridge-echo"}
        assert echo.promptId == first.prompt_id
        done = envelope(frames[3])
        assert done.data == {"sessionId": sid, "stopReason": "end_turn", "promptId": first.prompt_id}
        assert [f.id for f in frames] == list(range(1, 10))
        assert envelope(frames[-1]).data["state"] == "completed"


async def test_cancel_stops_only_the_active_prompt(tmp_path):
    async with open_bridge(tmp_path) as (bridge, agent):
        sid = (await bridge.create_session()).session_id
        active = bridge.send_prompt(sid, text("hold a"))
        queued = bridge.send_prompt(sid, text("ok"))
        await wait_until(lambda: ("session/prompt", {"sessionId": sid, "prompt": text("hold a")}) in agent.calls)
        sub = bridge.subscribe(sid)
        assert await bridge.cancel_session(sid) is True
        assert (await active).stop_reason == "cancelled"
        assert (await queued).stop_reason == "end_turn"
        assert ("session/cancel", {"sessionId": sid}) in agent.calls
        assert types(drain(sub))[:4] == ["prompt_cancelled", "turn_complete",
                                         "pending_prompt_started", "session_update"]
        assert await bridge.cancel_session(sid) is False


async def test_cancel_of_an_agent_that_ignores_it_is_bounded(tmp_path):
    async with open_bridge(tmp_path, cancel_grace_ms=50) as (bridge, agent):
        sid = (await bridge.create_session()).session_id
        ticket = bridge.send_prompt(sid, text("stubborn s"))
        await wait_until(lambda: bridge.get_session(sid).active is not None)
        await anyio.sleep(0.01)
        await bridge.cancel_session(sid)
        with anyio.fail_after(30):
            assert (await ticket).stop_reason == "cancelled"
        assert (await bridge.send_prompt(sid, text("ok"))).stop_reason == "end_turn"


async def test_deadline_while_running_and_while_queued(tmp_path):
    async with open_bridge(tmp_path, prompt_deadline_ms=5000, cancel_grace_ms=100) as (bridge, agent):
        sid = (await bridge.create_session()).session_id
        sub = bridge.subscribe(sid)
        running = bridge.send_prompt(sid, text("stubborn r"), deadline_ms=100)
        queued = bridge.send_prompt(sid, text("ok"), deadline_ms=50)
        with anyio.fail_after(30):
            with pytest.raises(PromptDeadlineExceededError) as info:
                await queued
            assert info.value.deadline_ms == 50
            with pytest.raises(PromptDeadlineExceededError, match="prompt exceeded the 100ms deadline"):
                await running
        assert bridge.get_session(sid).pending_count == 0
        await wait_until(lambda: ("session/cancel", {"sessionId": sid}) in agent.calls)
        errors = [envelope(f).data for f in drain(sub) if f.type == "turn_error"]
        assert [e["code"] for e in errors] == ["prompt_deadline_exceeded"] * 2
        assert "ok" not in agent.prompts()
        agent.release("r")
        assert (await bridge.send_prompt(sid, text("ok"))).stop_reason == "end_turn"


async def test_request_deadline_ignored_without_server_deadline(tmp_path):
    async with open_bridge(tmp_path) as (bridge, agent):
        sid = (await bridge.create_session()).session_id
        ticket = bridge.send_prompt(sid, text("hold x"), deadline_ms=10)
        await anyio.sleep(0.1)
        assert not ticket.done
        agent.release("x")
        assert (await ticket).stop_reason == "end_turn"


async def test_remove_pending_prompt(tmp_path):
    async with open_bridge(tmp_path) as (bridge, agent):
        sid = (await bridge.create_session()).session_id
        active = bridge.send_prompt(sid, text("hold a"))
        queued = bridge.send_prompt(sid, text("never"))
        await wait_until(lambda: bridge.get_session(sid).active is not None)
        assert bridge.remove_pending_prompt(sid, queued.prompt_id) == "queued"
        assert (await queued).stop_reason == "cancelled"
        assert bridge.get_session(sid).pending_count == 1
        with pytest.raises(PromptNotFoundError):
            bridge.remove_pending_prompt(sid, queued.prompt_id)
        assert bridge.remove_pending_prompt(sid, active.prompt_id) == "running"
        assert (await active).stop_reason == "cancelled"
        assert "never" not in agent.prompts()


async def test_branch_takes_no_slot_and_fails_fast_while_pending(tmp_path):
    async with open_bridge(tmp_path, max_pending_prompts_per_session=1) as (bridge, agent):
        sid = (await bridge.create_session()).session_id
        ticket = bridge.send_prompt(sid, text("hold a"))
        with pytest.raises(BranchWhilePromptActiveError):
            await bridge.branch_session(sid)
        agent.release("a")
        await ticket
        info = await bridge.branch_session(sid)
        assert info.forked_from == sid and info.session_id != sid
        assert bridge.get_session(sid).pending_count == 0
        assert ("session/fork", {"cwd": bridge.workspace_cwd, "mcpServers": [], "sessionId": sid}) in agent.calls
        # the slot is still free for a prompt
        assert (await bridge.send_prompt(sid, text("ok"))).stop_reason == "end_turn"


async def test_branch_runs_behind_the_fifo(tmp_path):
    async with open_bridge(tmp_path) as (bridge, agent):
        sid = (await bridge.create_session()).session_id
        session = bridge.get_session(sid)
        results = []

        async def branch() -> None:
            results.append(await bridge.branch_session(sid))

        async with anyio.create_task_group() as tg:
            tg.start_soon(branch)
            await wait_until(lambda: bool(session._work) or session.forked_from is not None
                             or any(m == "session/fork" for m, _ in agent.calls))
            ticket = bridge.send_prompt(sid, text("ok"))   # admitted behind the branch
            assert session.pending_count == 1
        await ticket
        methods = [m for m, _ in agent.calls if m in ("session/fork", "session/prompt")]
        assert methods == ["session/fork", "session/prompt"]
        assert results[0].forked_from == sid


async def test_close_settles_everything(tmp_path):
    async with open_bridge(tmp_path) as (bridge, agent):
        sid = (await bridge.create_session()).session_id
        sub = bridge.subscribe(sid)
        active = bridge.send_prompt(sid, text("hold a"))
        queued = bridge.send_prompt(sid, text("never"))
        await wait_until(lambda: bridge.get_session(sid).active is not None)
        await bridge.close_session(sid)
        for ticket in (active, queued):
            with pytest.raises(SessionClosedError):
                await ticket
        frames = [f async for f in sub]   # the stream ends after session_closed
        assert frames[-1].type == "session_closed"
        assert envelope(frames[-1]).data == {"sessionId": sid, "reason": "client_close"}
        assert ("session/close", {"sessionId": sid}) in agent.calls


async def test_agent_death_fails_prompts_and_publishes_session_died(tmp_path):
    async with open_bridge(tmp_path) as (bridge, agent):
        sid = (await bridge.create_session()).session_id
        sub = bridge.subscribe(sid)
        active = bridge.send_prompt(sid, text("hold a"))
        queued = bridge.send_prompt(sid, text("never"))
        await wait_until(lambda: bridge.get_session(sid).active is not None)
        agent.die()
        for ticket in (active, queued):
            with pytest.raises(AgentDiedError):
                await ticket
        frames = [f async for f in sub]   # the stream ends after session_died
        assert frames[-1].type == "session_died"   # after the turns' ends, as on a close
        assert [envelope(f).data["code"] for f in frames if f.type == "turn_error"] == ["agent_died"] * 2
        assert bridge.sessions() == []
        # a new session restarts the agent
        sid2 = (await bridge.create_session()).session_id
        assert (await bridge.send_prompt(sid2, text("ok"))).stop_reason == "end_turn"


def test_display_name_is_the_first_text_as_qwen_cuts_it() -> None:
    """``bridge.pending.display_name``: the first text block that is not empty (an
    image, an empty text skipped), cut to 200 code points then ``...`` (qwen's
    ``truncatePromptForDisplay``); ``None`` without text."""
    from bridge.pending import display_name
    image = {"type": "image", "data": "…", "mimeType": "image/png"}
    assert display_name([image, {"type": "text", "text": ""},
                         {"type": "text", "text": "fix the bug"},
                         {"type": "text", "text": "later"}]) == "fix the bug"
    assert display_name([{"type": "text", "text": "😀" * 200}]) == "😀" * 200
    assert display_name([{"type": "text", "text": "😀" * 201}]) == "😀" * 200 + "..."
    assert display_name([image]) is None and display_name([]) is None
    assert display_name([{"type": "text", "text": 7}]) is None
