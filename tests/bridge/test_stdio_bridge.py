"""The bridge over a real stdio child: the reference agent as `python -m bridge.agents.reference`."""

from __future__ import annotations

import os
import sys

import anyio
import pytest

from bridge import Bridge, BridgeOptions
from bridge.agents.stdio import StdioAgentFactory
from bridge.errors import AgentDiedError, AgentError
from tests.bridge.helpers import drain, envelope, text, wait_until

pytestmark = pytest.mark.anyio
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def reference_child(workspace) -> StdioAgentFactory:
    env = {"PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return StdioAgentFactory([sys.executable, "-m", "bridge.agents.reference"],
                             cwd=str(workspace), env=env, name="reference")


async def test_turns_permissions_and_fs_over_stdio(tmp_path):
    async with Bridge(reference_child(tmp_path), workspace_cwd=str(tmp_path)) as bridge:
        sid = (await bridge.create_session()).session_id
        sub = bridge.subscribe(sid)
        result = await bridge.send_prompt(sid, text("/chunks 4 hello world"))
        assert result.stop_reason == "end_turn"
        chunks = [envelope(f).data["update"] for f in drain(sub) if f.type == "session_update"]
        agent_text = "".join(u["content"]["text"] for u in chunks
                             if u["sessionUpdate"] == "agent_message_chunk")
        assert agent_text == "Echo: hello world"
        assert sum(u["sessionUpdate"] == "agent_message_chunk" for u in chunks) == 4

        ticket = bridge.send_prompt(sid, text("/tool write notes/out.txt written"))
        await wait_until(lambda: bridge.permissions.pending_count == 1)
        request = envelope([f for f in drain(sub) if f.type == "permission_request"][0]).data
        bridge.respond_to_permission(request["requestId"],
                                     {"outcome": "selected", "optionId": "allow_once"})
        assert (await ticket).stop_reason == "end_turn"
        assert (tmp_path / "notes" / "out.txt").read_text() == "written\n"

        with pytest.raises(AgentError) as info:
            await bridge.send_prompt(sid, text("/fail"))
        assert info.value.rpc_code == -32603
        assert (await bridge.send_prompt(sid, text("/max_tokens x"))).stop_reason == "max_tokens"


async def test_write_outside_workspace_is_refused(tmp_path):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    async with Bridge(reference_child(workspace), workspace_cwd=str(workspace)) as bridge:
        sid = (await bridge.create_session()).session_id
        sub = bridge.subscribe(sid)
        ticket = bridge.send_prompt(sid, text("/tool write ../escape.txt nope"))
        await wait_until(lambda: bridge.permissions.pending_count == 1)
        request = envelope([f for f in drain(sub) if f.type == "permission_request"][0]).data
        bridge.respond_to_permission(request["requestId"],
                                     {"outcome": "selected", "optionId": "allow_once"})
        assert (await ticket).stop_reason == "end_turn"
        assert not (tmp_path / "escape.txt").exists()
        updates = [envelope(f).data["update"] for f in drain(sub) if f.type == "session_update"]
        assert any(u.get("status") == "failed" for u in updates)


async def test_cancel_mid_turn_over_stdio(tmp_path):
    async with Bridge(reference_child(tmp_path), workspace_cwd=str(tmp_path)) as bridge:
        sid = (await bridge.create_session()).session_id
        ticket = bridge.send_prompt(sid, text("/sleep 30s slow"))
        queued = bridge.send_prompt(sid, text("next"))
        await wait_until(lambda: (active := bridge.get_session(sid).active) is not None
                         and active.run_scope is not None)   # session/prompt is being sent
        await bridge.cancel_session(sid)
        with anyio.fail_after(30):
            assert (await ticket).stop_reason == "cancelled"
            assert (await queued).stop_reason == "end_turn"


async def test_crash_mid_turn_settles_everything_and_recovers(tmp_path):
    options = BridgeOptions(max_pending_prompts_per_session=3)
    async with Bridge(reference_child(tmp_path), workspace_cwd=str(tmp_path), options=options) as bridge:
        sid = (await bridge.create_session()).session_id
        sub = bridge.subscribe(sid)
        crashing = bridge.send_prompt(sid, text("/crash going down"))
        queued = [bridge.send_prompt(sid, text(f"q{i}")) for i in range(2)]
        with anyio.fail_after(10):
            for ticket in (crashing, *queued):
                with pytest.raises(AgentDiedError):
                    await ticket
            frames = [f async for f in sub]
        kinds = [f.type for f in frames]
        assert "session_died" in kinds
        died = envelope([f for f in frames if f.type == "session_died"][0]).data
        assert died["exitCode"] == 3
        assert kinds.count("turn_error") == 3
        assert bridge.sessions() == []
        # the agent is restarted for the next session; the slot accounting is clean
        sid2 = (await bridge.create_session()).session_id
        assert (await bridge.send_prompt(sid2, text("again"))).stop_reason == "end_turn"


async def test_initialize_timeout(tmp_path):
    script = tmp_path / "silent.py"
    script.write_text("import sys, time\nsys.stdin.read()\n")
    factory = StdioAgentFactory([sys.executable, str(script)], cwd=str(tmp_path))
    options = BridgeOptions(initialize_timeout_ms=200)
    async with Bridge(factory, workspace_cwd=str(tmp_path), options=options) as bridge:
        from bridge.errors import AgentTimeoutError
        with pytest.raises(AgentTimeoutError) as info:
            await bridge.create_session()
        assert info.value.phase == "initialize"
        assert bridge.stats().admission_in_flight == 0


async def test_death_message_carries_the_stderr_tail(tmp_path):
    script = tmp_path / "dies.py"
    script.write_text("import sys\nsys.stderr.write('boom: missing credentials\\n')\nsys.exit(4)\n")
    factory = StdioAgentFactory([sys.executable, str(script)], cwd=str(tmp_path))
    async with Bridge(factory, workspace_cwd=str(tmp_path)) as bridge:
        with pytest.raises(AgentDiedError) as info:
            await bridge.create_session()
        assert info.value.exit_code == 4
        assert "last stderr: boom: missing credentials" in str(info.value)


async def test_sigkill_of_the_agent_mid_turn(tmp_path):
    import os
    import signal

    async with Bridge(reference_child(tmp_path), workspace_cwd=str(tmp_path)) as bridge:
        sid = (await bridge.create_session()).session_id
        sub = bridge.subscribe(sid)
        running = bridge.send_prompt(sid, text("/sleep 30s long"))
        queued = bridge.send_prompt(sid, text("next"))
        await wait_until(lambda: bridge.get_session(sid).active is not None)
        os.kill(bridge.get_session(sid).agent.pid, signal.SIGKILL)
        with anyio.fail_after(10):
            for ticket in (running, queued):
                with pytest.raises(AgentDiedError) as info:
                    await ticket
                assert info.value.exit_code == -signal.SIGKILL
            kinds = [f.type async for f in sub]
        assert "session_died" in kinds and kinds.count("turn_error") == 2
        assert bridge.stats().pending_prompts == 0
        sid2 = (await bridge.create_session()).session_id
        assert (await bridge.send_prompt(sid2, text("back"))).stop_reason == "end_turn"
