"""A hostile stdio agent (``tests.agents.hostile_agent``) behind the real
``acp-server serve``, over real HTTP, beside the reference agent: whatever it does, the
server stays up and bounded (its RSS measured), the session's clients get a clear end in
the door's shape, the other agent's sessions keep working, and the server stops.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from httpx_sse import aconnect_sse

from tests.harness import ServeProcess
from tests.hostile.test_hung_agents import create

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]

MIB = 1024 * 1024


def hostile(*flags: str) -> list[str]:
    command = [sys.executable, "-m", "tests.agents.hostile_agent", *flags]
    return ["--agent", f"hostile={shlex.join(command)}"]


def rss(pid: int) -> int:
    """The process's resident set, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def turn(client: httpx.AsyncClient, sid: str, text: str, *, cancel_on: str | None = None,
               timeout: float = 60) -> list[dict[str, Any]]:
    """Prompt ``sid``; its events to the turn's end (or the session's). With
    ``cancel_on``, ``POST /cancel`` once an event of that type came."""
    status = (await client.get(f"/session/{sid}/status")).json()
    events: list[dict[str, Any]] = []
    async with aconnect_sse(client, "GET", f"/session/{sid}/events", headers={
            "Last-Event-ID": str(status["lastEventId"]),
            "X-Qwen-Event-Epoch": status["eventEpoch"]}) as source:
        posted = await client.post(f"/session/{sid}/prompt", json={
            "prompt": [{"type": "text", "text": text}]})
        assert posted.status_code == 202, posted.text
        with anyio.fail_after(timeout):
            async for sse in source.aiter_sse():
                if not sse.data:
                    continue
                event = json.loads(sse.data)
                events.append(event)
                if event["type"] == cancel_on:
                    cancel_on = None
                    assert (await client.post(f"/session/{sid}/cancel")).status_code < 300
                if event["type"] in ("turn_complete", "turn_error", "session_died",
                                     "session_closed"):
                    return events
    return events


def ends(events: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    return [(e["type"], e["data"].get("code") or e["data"].get("stopReason")
             or e["data"].get("reason")) for e in events
            if e["type"] in ("turn_complete", "turn_error", "session_died")]


def said(events: list[dict[str, Any]], prefix: str) -> Any:
    for e in events:
        if e["type"] == "session_update":
            text = e["data"]["update"].get("content", {}).get("text", "")
            if text.startswith(prefix):
                return json.loads(text.removeprefix(prefix))
    raise AssertionError(f"no {prefix!r} in {events[-5:]}")


async def still_served(daemon: ServeProcess, timeout: float = 30) -> None:
    """The reference agent's sessions keep working (``timeout`` bounds a hang, each
    request's: a loaded machine may not run the child server for seconds)."""
    async with httpx.AsyncClient(base_url=daemon.base_url, timeout=timeout) as client:
        sid = (await create(client, "reference")).json()["sessionId"]
        assert ends(await turn(client, sid, "hi")) == [("turn_complete", "end_turn")]


@pytest.mark.parametrize("init", ["never", "exit", "close-stdout"])
async def test_an_agent_that_never_completes_initialize(tmp_path: Path, init: str) -> None:
    async with ServeProcess(tmp_path, "--agent", "reference", *hostile("--init", init),
                            "--initialize-timeout-ms", "1500") as daemon:
        for _ in range(2):   # and again: started anew, refused alike
            refused = await create(daemon.client, "hostile")
            assert refused.status_code in (503, 504), refused.text
            assert refused.json()["code"] in ("agent_unavailable", "init_timeout")
        await still_served(daemon)
    assert daemon.returncode == 0


async def test_garbage_ids_and_lines_are_ignored(tmp_path: Path) -> None:
    async with ServeProcess(tmp_path, "--agent", "reference", *hostile()) as daemon:
        sid = (await create(daemon.client, "hostile")).json()["sessionId"]
        assert ends(await turn(daemon.client, sid, "ids")) == [("turn_complete", "end_turn")]
        assert ends(await turn(daemon.client, sid, "again")) == [("turn_complete", "end_turn")]
        await still_served(daemon)
    assert daemon.returncode == 0


async def test_hostile_fs_and_terminal_requests_are_refused(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    async with ServeProcess(workspace, "--agent", "reference", *hostile(),
                            cwd=workspace) as daemon:
        sid = (await create(daemon.client, "hostile")).json()["sessionId"]
        events = await turn(daemon.client, sid, "fs")
        assert ends(events) == [("turn_complete", "end_turn")]
        seen = said(events, "fs: ")
        refused = {name: code for name, code in seen.items() if not code.startswith("ok")}
        assert set(refused) == set(seen) - {"bad_line", "huge_line"}, seen
        assert seen["terminal_create"] == seen["terminal_output"] == "-32601"
        assert seen["huge_line"] == 'ok:15'   # {"content": ""}
        assert not (tmp_path / "outside.txt").exists()
        assert Path("/etc/hostname").read_text() != "pwned"
    assert daemon.returncode == 0


async def test_ten_thousand_permission_requests_are_bounded(tmp_path: Path) -> None:
    async with ServeProcess(tmp_path, "--agent", "reference", *hostile()) as daemon:
        sid = (await create(daemon.client, "hostile")).json()["sessionId"]
        before = rss(daemon.pid)
        events = await turn(daemon.client, sid, "perms 10000", cancel_on="permission_request")
        assert ends(events) == [("turn_complete", "cancelled")] or \
            ends(events) == [("turn_complete", "end_turn")], ends(events)
        asked = [e for e in events if e["type"] == "permission_request"]
        assert 0 < len(asked) <= 1024
        assert rss(daemon.pid) - before < 200 * MIB
        await still_served(daemon)
    assert daemon.returncode == 0


async def test_a_cancel_ends_the_turn_of_an_agent_that_ignores_it(tmp_path: Path) -> None:
    """The turn ends ``cancelled`` past ``--cancel-grace-ms``; what the agent still says
    of it is dropped, and the next prompt goes out only once the agent ended it."""
    async with ServeProcess(tmp_path, "--agent", "reference", *hostile(),
                            "--cancel-grace-ms", "300", cwd=tmp_path) as daemon:
        client = daemon.client
        sid = (await create(client, "hostile")).json()["sessionId"]
        events = await turn(client, sid, "stall gate", cancel_on="session_update")
        assert ends(events) == [("turn_complete", "cancelled")]
        last = events[-1]["id"]
        # The next prompt waits for the agent; it is held, not sent.
        async with aconnect_sse(client, "GET", f"/session/{sid}/events",
                                headers={"Last-Event-ID": str(last)}) as source:
            posted = await client.post(f"/session/{sid}/prompt", json={
                "prompt": [{"type": "text", "text": "next"}]})
            assert posted.status_code == 202, posted.text
            seen: list[dict[str, Any]] = []
            with anyio.fail_after(30):
                async for sse in source.aiter_sse():
                    if not sse.data:
                        continue
                    seen.append(json.loads(sse.data))
                    if seen[-1]["type"] == "session_update" and not (tmp_path / "gate").exists():
                        (tmp_path / "gate").write_text("")   # its echo came: let the agent go
                    if seen[-1]["type"] in ("turn_complete", "turn_error"):
                        break
        assert ends(seen) == [("turn_complete", "end_turn")], seen
        said_text = [e["data"]["update"]["content"]["text"] for e in seen
                     if e["type"] == "session_update"]
        assert said_text == ["next", "hostile: next"], said_text   # no LATE
        assert not [e for e in seen if e["type"].startswith("permission")], seen
        await still_served(daemon)
    assert daemon.returncode == 0


async def test_an_agent_flooding_a_turn_given_up_on(tmp_path: Path) -> None:
    """The flood of a turn given up on is dropped; the next prompt, held behind it,
    ends at its cancel; the session closes and the server stops."""
    async with ServeProcess(tmp_path, "--agent", "reference", *hostile(),
                            "--cancel-grace-ms", "300") as daemon:
        client = daemon.client
        sid = (await create(client, "hostile")).json()["sessionId"]
        before = rss(daemon.pid)
        events = await turn(client, sid, "flood", cancel_on="session_update")
        assert ends(events) == [("turn_complete", "cancelled")]
        last = (await client.get(f"/session/{sid}/status")).json()["lastEventId"]
        held = await turn(client, sid, "next", cancel_on="session_update")
        assert ends(held) == [("turn_complete", "cancelled")], ends(held)
        status = (await client.get(f"/session/{sid}/status")).json()
        assert status["lastEventId"] - last < 10, status   # the flood is not published
        assert rss(daemon.pid) - before < 100 * MIB
        await still_served(daemon)
        assert (await client.delete(f"/session/{sid}")).status_code < 300
    assert daemon.returncode == 0


@pytest.mark.parametrize("text", ["exit", "noeol", "bigline 40", "stderr 64"])
async def test_an_agent_that_breaks_mid_turn(tmp_path: Path, text: str) -> None:
    async with ServeProcess(tmp_path, "--agent", "reference", *hostile()) as daemon:
        sid = (await create(daemon.client, "hostile")).json()["sessionId"]
        before = rss(daemon.pid)
        events = await turn(daemon.client, sid, text)
        after = rss(daemon.pid)
        print(text, ends(events), before // MIB, after // MIB)
        assert after - before < 300 * MIB, (before, after)
        await still_served(daemon)
    assert daemon.returncode == 0


async def test_an_agent_that_closes_its_stdout_mid_turn(tmp_path: Path) -> None:
    """An agent that closes its stdout and lives on is seen to close it: its turn ends
    ``agent_died``. Under uvloop's spawn (``anyio.open_process`` on ``serve``'s loop)
    the child kept a duplicate of its stdout pipe, so the turn waited for ever."""
    async with ServeProcess(tmp_path, "--agent", "reference", *hostile()) as daemon:
        sid = (await create(daemon.client, "hostile")).json()["sessionId"]
        events = await turn(daemon.client, sid, "closeout", timeout=30)   # a hang bound
        assert ends(events) == [("turn_error", "agent_died")], ends(events)
    assert daemon.returncode == 0


async def test_a_flood_during_a_turn_keeps_the_server_bounded(tmp_path: Path) -> None:
    """100 MiB of updates in one turn (1 KiB each, nobody reading): the agent's reader
    waits for the journal (flow control), so the server's memory stays within the
    session's ring (64 MiB; measured: +64 MiB at 200,000 updates, where the journal's
    backlog took it to +780 MiB before), and other sessions' commits go on."""
    async with ServeProcess(tmp_path, "--agent", "reference", *hostile(),
                            "--cancel-grace-ms", "300") as daemon:
        client = daemon.client
        sid = (await create(client, "hostile")).json()["sessionId"]
        before = peak = rss(daemon.pid)
        posted = await client.post(f"/session/{sid}/prompt", json={
            "prompt": [{"type": "text", "text": "flood"}]})
        assert posted.status_code == 202
        with anyio.fail_after(120):
            while (await client.get(f"/session/{sid}/status")).json()["lastEventId"] < 100_000:
                peak = max(peak, rss(daemon.pid))
                await anyio.sleep(0.2)   # a sampling period, not a wait for a condition
        assert peak - before < 256 * MIB, (before // MIB, peak // MIB)
        await still_served(daemon)   # meanwhile: its commits wait behind no backlog
        assert (await client.post(f"/session/{sid}/cancel")).status_code < 300
        assert (await client.delete(f"/session/{sid}")).status_code < 300
    assert daemon.returncode == 0
    # The agent waited for the journal: nothing was let through unjournaled.
    assert "unjournaled" not in daemon.stderr_text()
