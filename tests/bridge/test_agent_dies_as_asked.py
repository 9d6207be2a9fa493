"""An agent that dies as a session is asked of it, made, loaded, or restored after a
restart (it was crashing already, or crashes then): the session is asked once more of
the agent started anew, so the client gets its session, not an error (or a session
refused for good) for a death it had nothing to do with. Real child processes:
``acp-server serve`` and the fixture agent over stdio (``--die-at-new``,
``--die-at-load``)."""

from __future__ import annotations

import sys
from pathlib import Path
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.acp_http.wsclient import ws_connect
from tests.harness import ServeProcess


def _dying(tmp_path: Path, at: str, times: int) -> tuple[str, Path]:
    """The fixture agent as a command dying at ``at`` (``new`` or ``load``) ``times``
    times, and the file counting what it was asked."""
    asked = tmp_path / f"asked-{at}"
    script = tmp_path / f"dying-at-{at}"
    script.write_text(f"#!/bin/sh\nexec {sys.executable} -m tests.agents.fixture_agent "
                      f"--name dying --die-at-{at} {asked} --die-times {times}\n")
    script.chmod(0o755)
    return str(script), asked


def _agent(tmp_path: Path, times: int) -> tuple[str, Path]:
    return _dying(tmp_path, "new", times)


def test_a_session_asked_of_a_dying_agent_is_asked_again_of_a_fresh_one(
        tmp_path: Path) -> None:
    command, asked = _agent(tmp_path, times=1)
    with ServeProcess(tmp_path, "--agent", command) as child:
        made = child.http.post("/session", json={"sessionScope": "thread"})
        assert made.status_code == 200, made.text
        assert made.json()["sessionId"] == "dying-1"   # the second process's first
        assert asked.read_text().count("new") == 2
        said = child.http.post(f"/session/{made.json()['sessionId']}/prompt",
                               json={"prompt": [{"type": "text", "text": "still here"}]})
        assert said.status_code == 202
        agents = child.http.get("/daemon/status").json()["agents"]
        assert [a["state"] for a in agents if a["default"]] == ["running"]


def test_an_agent_that_dies_again_is_asked_only_once_more(tmp_path: Path) -> None:
    command, asked = _agent(tmp_path, times=10)
    with ServeProcess(tmp_path, "--agent", command) as child:
        made = child.http.post("/session", json={"sessionScope": "thread"})
        assert made.status_code == 503, made.text   # no 500: the agent is gone, for now
        assert made.headers["retry-after"] == "5"
        assert made.json()["code"] == "agent_died" and "exit code 3" in made.json()["error"]
        assert asked.read_text().count("new") == 2   # never a loop of restarts
        assert child.returncode is None


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])   # the client side only
async def test_over_acp_a_dying_agent_is_asked_again_then_answers(tmp_path: Path) -> None:
    command, asked = _agent(tmp_path, times=1)
    async with ServeProcess(tmp_path, "--agent", command) as child:
        async with ws_connect(child.base_url, "/acp") as ws:
            await ws.send_json({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                                "params": {"protocolVersion": 1}})
            await ws.receive_json()
            await ws.send_json({"jsonrpc": "2.0", "id": 1, "method": "session/new",
                                "params": {"cwd": str(tmp_path), "mcpServers": []}})
            answer = await ws.wait_for(lambda m: m.get("id") == 1)
    assert answer["result"]["sessionId"] == "dying-1", answer
    assert asked.read_text().count("new") == 2


def _loading_agent(tmp_path: Path, times: int) -> tuple[str, Path]:
    return _dying(tmp_path, "load", times)


def _replayed(history: list[dict[str, Any]]) -> list[str]:
    return [e["data"]["update"]["content"]["text"] for e in history
            if e["type"] == "session_update"
            and e["data"]["update"].get("sessionUpdate") == "agent_message_chunk"]


def _ids(history: list[dict[str, Any]]) -> list[int]:
    return [e["id"] for e in history]


def test_a_session_loaded_of_a_dying_agent_is_loaded_again_of_a_fresh_one(
        tmp_path: Path) -> None:
    """The agent knows the session (its own store: a native load), and dies as it
    replays it: the fresh agent is asked once more, and the history holds the replay
    once (the dead attempt's is dropped with it)."""
    command, asked = _loading_agent(tmp_path, times=1)
    with ServeProcess(tmp_path, "--agent", command) as child:
        loaded = child.http.post("/session/native-7/load", json={})
        assert loaded.status_code == 200, loaded.text
        assert loaded.json()["sessionId"] == "native-7"
        assert asked.read_text().count("load") == 2
        replay = loaded.json()["compactedReplay"]
        assert _replayed(replay) == ["replayed native-7"]
        assert _ids(replay) == list(range(1, len(replay) + 1))   # one life, from 1
        said = child.http.post("/session/native-7/prompt",
                               json={"prompt": [{"type": "text", "text": "still here"}]})
        assert said.status_code == 202, said.text


def test_a_load_of_an_agent_that_dies_again_is_asked_only_once_more(tmp_path: Path) -> None:
    command, asked = _loading_agent(tmp_path, times=10)
    with ServeProcess(tmp_path, "--agent", command) as child:
        loaded = child.http.post("/session/native-7/load", json={})
        assert loaded.status_code == 503, loaded.text   # no 500: the agent is gone, for now
        assert loaded.headers["retry-after"] == "5"
        assert loaded.json()["code"] == "agent_died" and "exit code 3" in loaded.json()["error"]
        assert asked.read_text().count("load") == 2   # never a loop of restarts
        assert child.http.get("/session/native-7/status").status_code == 404
        assert child.returncode is None


def _restarted_with_a_session(tmp_path: Path, times: int) -> tuple[ServeProcess, str, Path]:
    """A server on the loading agent (and an honest one, ``other``), one prompt settled
    in a session, killed (SIGKILL) and started again: the session is restored from the
    journal."""
    command, asked = _loading_agent(tmp_path, times=times)
    other = f"{sys.executable} -m tests.agents.fixture_agent --name other"
    child = ServeProcess(tmp_path, "--agent", command, "--agent", f"other={other}").start()
    with httpx.Client(base_url=child.base_url, timeout=10) as http:
        sid = http.post("/session", json={"sessionScope": "thread"}).json()["sessionId"]
        first = http.post(f"/session/{sid}/prompt",
                          json={"prompt": [{"type": "text", "text": "before"}]})
        assert first.status_code == 202, first.text
        assert _settled(http, sid, first.json()["promptId"]) == "completed"
    child.kill()
    return child.start(), sid, asked


def test_a_restored_session_whose_agent_dies_at_its_load_is_loaded_of_a_fresh_one(
        tmp_path: Path) -> None:
    """After a crash the session's agent side is restored at its first use, by the
    agent's ``session/load``; an agent that dies there is started anew and asked once
    more: neither the session refused for good (409 ``session_not_restorable``) nor
    its prompt failed (``agent_died``) and the session ended for that death."""
    child, sid, asked = _restarted_with_a_session(tmp_path, times=1)
    try:
        with httpx.Client(base_url=child.base_url, timeout=10) as http:
            again = _say(http, sid, "after")
            assert again.status_code == 202, again.text
            assert asked.read_text().count("load") == 2
            assert _settled(http, sid, again.json()["promptId"]) == "completed"
            replay = http.post(f"/session/{sid}/load", json={}).json()["compactedReplay"]
        said = [t for t in _replayed(replay) if t.startswith("dying:")]
        assert said == ["dying: before", "dying: after"]   # no replay published twice
    finally:
        child.stop()


def test_a_restored_session_whose_agent_dies_again_keeps_its_history(
        tmp_path: Path) -> None:
    child, sid, asked = _restarted_with_a_session(tmp_path, times=10)
    try:
        with httpx.Client(base_url=child.base_url, timeout=10) as http:
            again = _say(http, sid, "after")
            assert again.status_code == 409, again.text
            assert again.json()["code"] == "session_not_restorable"
            assert asked.read_text().count("load") == 2   # once more, not a loop
            loaded = http.post(f"/session/{sid}/load", json={})
            assert loaded.status_code == 200, loaded.text
            assert "dying: before" in _replayed(loaded.json()["compactedReplay"])
            # a later death of another agent does not end it
            made = http.post("/session", json={"sessionScope": "thread", "agent": "other"})
            assert made.status_code == 200, made.text
            other = made.json()["sessionId"]
            died = _say(http, other, "die")
            assert died.status_code == 202, died.text
            _until(lambda: http.get(f"/session/{other}/status").status_code == 404,
                   "the other session ended with its agent")
            status = http.get(f"/session/{sid}/status")
            assert status.status_code == 200, status.text
            again = _say(http, sid, "after all")
            assert again.json()["code"] == "session_not_restorable"
        assert child.returncode is None
    finally:
        child.stop()


def _say(http: httpx.Client, sid: str, text: str) -> httpx.Response:
    return http.post(f"/session/{sid}/prompt", json={"prompt": [{"type": "text", "text": text}]})


def _until(check: Callable[[], bool], what: str) -> None:
    """``check`` true within a bounded number of tries (each a round trip)."""
    for _ in range(500):
        if check():
            return
    raise AssertionError(f"never: {what}")


def _settled(http: httpx.Client, sid: str, prompt_id: str) -> str:
    """The prompt's terminal, once the session's ``/load`` lists it (bounded)."""
    for _ in range(500):
        loaded = http.post(f"/session/{sid}/load", json={})
        assert loaded.status_code == 200, loaded.text
        for terminal in loaded.json()["promptTerminals"]:
            if terminal["promptId"] == prompt_id:
                return str(terminal["terminal"])
        http.get("/health")   # a round trip between reads, not a sleep
    raise AssertionError(f"prompt {prompt_id} never settled")
