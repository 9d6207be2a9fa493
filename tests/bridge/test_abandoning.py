"""An agent that never ends a cancelled turn does not hold its session for ever
(``bridge.abandoning``): a real stdio child (``tests.agents.fixture_agent``, whose
``gate <file>`` prompt ignores ``session/cancel`` and never ends while the file is
missing), on both anyio backends."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from bridge import Bridge, BridgeOptions
from bridge.agents.stdio import StdioAgentConnection, StdioAgentFactory
from tests.bridge.helpers import drain, envelope, text, wait_until

pytestmark = pytest.mark.anyio
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GRACE_MS, BOUND_MS = 100, 400
MIB = 1024 * 1024


def gated(workspace: Path, record: Path) -> StdioAgentFactory:
    env = {"PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return StdioAgentFactory([sys.executable, "-m", "tests.agents.fixture_agent",
                              "--name", "gated", "--record-prompts", str(record)],
                             cwd=str(workspace), env=env, name="gated", shutdown_grace_s=0.5)


def options(**more: Any) -> BridgeOptions:
    return BridgeOptions(cancel_grace_ms=GRACE_MS, abandoned_turn_timeout_ms=BOUND_MS, **more)


def agent_of(bridge: Bridge, sid: str) -> StdioAgentConnection:
    agent = bridge.get_session(sid).agent
    assert isinstance(agent, StdioAgentConnection)
    return agent


def said(events: list[Any]) -> list[str]:
    return [envelope(e).data["update"]["content"]["text"] for e in events
            if e.type == "session_update"
            and envelope(e).data["update"]["sessionUpdate"] == "agent_message_chunk"]


async def hang_and_cancel(bridge: Bridge, sid: str, record: Path, mark: str) -> Any:
    """A turn the agent never ends (its gate never opens), cancelled; a prompt queued
    behind it. The queued prompt's ticket."""
    ticket = bridge.send_prompt(sid, text(f"gate {record.parent / 'never'}-{mark}"))
    await wait_until(lambda: record.exists() and f"never-{mark}" in record.read_text())
    queued = bridge.send_prompt(sid, text(f"next {mark}"))
    await bridge.cancel_session(sid)
    with anyio.fail_after(30):
        assert (await ticket).stop_reason == "cancelled"
    return queued


def rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def test_the_sole_user_stops_the_agent_and_its_next_prompt_runs(tmp_path: Path) -> None:
    """The session is its agent's only user: past the bound the process is stopped and
    reaped, ``agent_abandoned`` (``agent_stopped``) is published, and the queued prompt
    runs on a fresh process that loaded the session. Again and again: descriptors and
    memory stay bounded; the bridge stops."""
    record = tmp_path / "prompts.txt"
    with anyio.fail_after(120):
        async with Bridge(gated(tmp_path, record), workspace_cwd=str(tmp_path),
                          options=options()) as bridge:
            sid = (await bridge.create_session()).session_id
            sub = bridge.subscribe(sid)
            fds: list[int] = []
            memory: list[int] = []
            for round_ in range(4):
                pid = agent_of(bridge, sid).pid
                queued = await hang_and_cancel(bridge, sid, record, str(round_))
                with anyio.fail_after(30):
                    assert (await queued).stop_reason == "end_turn"
                events = drain(sub)
                abandoned = [envelope(e).data for e in events if e.type == "agent_abandoned"]
                assert len(abandoned) == 1, [e.type for e in events]
                assert abandoned[0]["action"] == "agent_stopped"
                assert abandoned[0]["sessionId"] == sid
                assert abandoned[0]["waitedMs"] >= BOUND_MS - 50
                assert said(events) == [f"gated: next {round_}"]
                assert agent_of(bridge, sid).pid != pid   # on a new process
                assert gone(pid)                          # the old one stopped and reaped
                fds.append(len(os.listdir("/proc/self/fd")))
                memory.append(rss())
            assert fds[-1] <= fds[0] + 2, fds
            assert memory[-1] - memory[0] < 32 * MIB, memory
            assert (await bridge.send_prompt(sid, text("after"))).stop_reason == "end_turn"
    assert "gated: after" in said(drain(sub))


async def test_a_shared_agent_is_kept_and_only_the_session_detached(tmp_path: Path) -> None:
    """Another session uses the same process: it is not stopped; the session lets go of
    it (``session_detached``), is loaded again on it, and its queued prompt runs; the
    other session's turns go on, on the same process."""
    record = tmp_path / "prompts.txt"
    with anyio.fail_after(120):
        async with Bridge(gated(tmp_path, record), workspace_cwd=str(tmp_path),
                          options=options()) as bridge:
            sid = (await bridge.create_session()).session_id
            other = (await bridge.create_session()).session_id
            pid = agent_of(bridge, sid).pid
            assert agent_of(bridge, other).pid == pid
            sub = bridge.subscribe(sid)
            queued = await hang_and_cancel(bridge, sid, record, "shared")
            with anyio.fail_after(30):
                assert (await queued).stop_reason == "end_turn"
            events = drain(sub)
            abandoned = [envelope(e).data for e in events if e.type == "agent_abandoned"]
            assert [a["action"] for a in abandoned] == ["session_detached"]
            assert said(events) == ["gated: next shared"]
            assert agent_of(bridge, sid).pid == agent_of(bridge, other).pid == pid
            assert not gone(pid)
            assert (await bridge.send_prompt(other, text("still"))).stop_reason == "end_turn"


async def test_an_agent_that_answers_in_time_is_not_given_up_on(tmp_path: Path) -> None:
    """The turn's late answer, before the bound, releases the session as before: no
    ``agent_abandoned``, the same process."""
    record = tmp_path / "prompts.txt"
    gate = tmp_path / "gate-open"
    with anyio.fail_after(60):
        async with Bridge(gated(tmp_path, record), workspace_cwd=str(tmp_path),
                          options=BridgeOptions(cancel_grace_ms=GRACE_MS,
                                                abandoned_turn_timeout_ms=600_000)) as bridge:
            sid = (await bridge.create_session()).session_id
            sub = bridge.subscribe(sid)
            pid = agent_of(bridge, sid).pid
            ticket = bridge.send_prompt(sid, text(f"gate {gate}"))
            await wait_until(lambda: record.exists() and "gate" in record.read_text())
            queued = bridge.send_prompt(sid, text("next"))
            await bridge.cancel_session(sid)
            assert (await ticket).stop_reason == "cancelled"
            gate.touch()
            assert (await queued).stop_reason == "end_turn"
            assert not [e for e in drain(sub) if e.type == "agent_abandoned"]
            assert agent_of(bridge, sid).pid == pid


def test_the_bound_is_validated() -> None:
    from bridge.errors import InvalidOptionError
    for bad in (0, -1, 1.5, "10"):
        with pytest.raises(InvalidOptionError, match="abandoned_turn_timeout_ms"):
            BridgeOptions(abandoned_turn_timeout_ms=bad)
    assert BridgeOptions().abandoned_turn_timeout_ms == 60_000


def hostile(workspace: Path) -> StdioAgentFactory:
    """``tests.agents.hostile_agent``: no ``session/load``, its ``session/new`` ignores
    the id asked for (``hostile-<n>``), ``ignore`` prompts never answered."""
    env = {"PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return StdioAgentFactory([sys.executable, "-m", "tests.agents.hostile_agent"],
                             cwd=str(workspace), env=env, name="hostile", shutdown_grace_s=0.5)


async def test_a_session_that_cannot_be_restored_refuses_prompts(tmp_path: Path) -> None:
    """Detached from a shared agent that can neither load it nor make it again under
    its id: the queued prompt fails ``session_not_restorable``, later ones are refused
    at admission; the other session goes on."""
    from bridge.errors import SessionNotRestorableError

    with anyio.fail_after(60):
        async with Bridge(hostile(tmp_path), workspace_cwd=str(tmp_path),
                          options=options()) as bridge:
            other = (await bridge.create_session()).session_id
            sid = (await bridge.create_session()).session_id
            sub = bridge.subscribe(sid)
            ticket = bridge.send_prompt(sid, text("ignore"))
            await wait_until(lambda: (active := bridge.get_session(sid).active) is not None
                             and active.sent)
            queued = bridge.send_prompt(sid, text("next"))
            await bridge.cancel_session(sid)
            assert (await ticket).stop_reason == "cancelled"
            with pytest.raises(SessionNotRestorableError):
                await queued
            events = drain(sub)
            assert [envelope(e).data["action"] for e in events
                    if e.type == "agent_abandoned"] == ["session_detached"]
            errors = [envelope(e).data["code"] for e in events if e.type == "turn_error"]
            assert errors == ["session_not_restorable"], errors
            with pytest.raises(SessionNotRestorableError):
                bridge.send_prompt(sid, text("again"))
            assert (await bridge.send_prompt(other, text("hi"))).stop_reason == "end_turn"
