"""The agent side of a journaled session is restored on first use, never at start
(issue #23): start-up with many journaled sessions asks the agent nothing, while list,
history and status are there at once; the first prompt (or a load) restores it, once
even when several ask together; one that cannot be restored answers the prompt that
found out with 409 ``session_not_restorable``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from bridge.agents.reference import ReferenceAgentFactory
from tests.harness import local_server
from tests.store.test_session_journal import _settled
from tests.store.test_session_restart import _prompt

pytestmark = pytest.mark.anyio

RESTORING = ("session/load", "session/new", "session/resume")


class _Counting(ReferenceAgentFactory):
    """The reference agent, recording the session requests it gets; ``forget``: it
    does not honour the requested id (cannot restore a session)."""

    def __init__(self, *, forget: bool = False) -> None:
        super().__init__()
        self.asked: list[tuple[str, str | None]] = []
        self.forget = forget

    async def connect(self, client: Any, task_group: Any) -> Any:
        conn = await super().connect(client, task_group)
        original = conn.request

        async def request(method: str, params: Any) -> Any:
            if method in RESTORING:
                meta = params.get("_meta") or {}
                self.asked.append((method, params.get("sessionId")
                                   or meta.get("acp-server/requestedSessionId")))
                if self.forget and method == "session/new":
                    params = {k: v for k, v in params.items() if k != "_meta"}
            return await original(method, params)

        conn.request = request  # type: ignore[method-assign]
        return conn


async def _journaled_sessions(tmp_path: Path, count: int) -> list[str]:
    """``count`` sessions with one finished turn each, journaled by a server now gone."""
    async with local_server(tmp_path) as srv:
        sids = []
        for n in range(count):
            sid = (await srv.client.post("/session", json={"sessionScope": "thread"})
                   ).json()["sessionId"]
            accepted = await srv.client.post(f"/session/{sid}/prompt", json=_prompt(f"n{n}"))
            await _settled(srv.client, sid, accepted.json()["promptId"])
            sids.append(sid)
    return sids


async def test_start_asks_no_agent_and_the_first_use_restores_once(tmp_path: Path) -> None:
    sids = await _journaled_sessions(tmp_path, 5)
    agent = _Counting()
    async with local_server(tmp_path, agent_factory=agent) as srv:
        assert [s.session_id for s in srv.bridge.list_sessions()] == sids
        assert agent.asked == []   # start-up: the bridge side only
        listed = await srv.client.get(f"/session/{sids[0]}/pending-prompts")
        assert listed.status_code == 200
        assert srv.bridge.session_status(sids[0]).last_event_id > 0
        assert agent.asked == []
        target = sids[2]
        answers: list[Any] = []

        async def load() -> None:
            answers.append(await srv.client.post(f"/session/{target}/load", json={}))

        async def prompt() -> None:
            answers.append(await srv.client.post(f"/session/{target}/prompt",
                                                 json=_prompt("/history")))

        async with anyio.create_task_group() as tg:   # two first users, one restore
            tg.start_soon(load)
            tg.start_soon(prompt)
        assert sorted(a.status_code for a in answers) == [200, 202]
        assert agent.asked == [("session/load", target), ("session/new", target)]
        accepted = next(a for a in answers if a.status_code == 202)
        await _settled(srv.client, target, accepted.json()["promptId"])
        replay = (await srv.client.post(f"/session/{target}/load", json={})).json()
        said = [e["data"]["update"]["content"]["text"] for e in replay["compactedReplay"]
                if e["type"] == "session_update" and e["promptId"] == accepted.json()[
                    "promptId"] and e["data"]["update"]["sessionUpdate"] ==
                "agent_message_chunk"]
        assert said == ["History:\nuser: n2\nassistant: Echo: n2\nEcho: "]
        assert len(agent.asked) == 2   # the other sessions were never asked


async def test_the_prompt_that_finds_it_not_restorable_is_a_409(tmp_path: Path) -> None:
    (sid,) = await _journaled_sessions(tmp_path, 1)
    agent = _Counting(forget=True)
    async with local_server(tmp_path, agent_factory=agent) as srv:
        assert agent.asked == []
        for _ in range(2):   # the first finds out, the next is refused at admission
            refused = await srv.client.post(f"/session/{sid}/prompt", json=_prompt("more"))
            assert refused.status_code == 409, refused.text
            assert refused.json()["code"] == "session_not_restorable"
        assert agent.asked == [("session/load", sid), ("session/new", sid)]
        loaded = await srv.client.post(f"/session/{sid}/load", json={})
        assert loaded.status_code == 200   # the history stays readable
        assert srv.bridge.session_status(sid).pending_prompts == 0


async def test_a_default_session_its_agent_cannot_restore_is_replaced_on_attach(
        tmp_path: Path) -> None:
    """``POST /session`` without a scope attaches the workspace's default session. One
    restored after a restart whose agent cannot restore it would refuse every prompt
    (409): the attach makes a new default instead, the old one keeps its history. At the
    next start the newest default is the default."""
    async with local_server(tmp_path) as srv:
        made = (await srv.client.post("/session", json={})).json()
        old = made["sessionId"]
        accepted = await srv.client.post(f"/session/{old}/prompt", json=_prompt("kept"))
        await _settled(srv.client, old, accepted.json()["promptId"])
    async with local_server(tmp_path, agent_factory=_Counting(forget=True)) as srv:
        attached = (await srv.client.post("/session", json={})).json()
        new = attached["sessionId"]
        assert new != old and attached["attached"] is False
        again = (await srv.client.post("/session", json={})).json()
        assert (again["sessionId"], again["attached"]) == (new, True)
        turn = await srv.client.post(f"/session/{new}/prompt", json=_prompt("works"))
        assert turn.status_code == 202, turn.text
        await _settled(srv.client, new, turn.json()["promptId"])
        refused = await srv.client.post(f"/session/{old}/prompt", json=_prompt("more"))
        assert refused.json()["code"] == "session_not_restorable"
        history = (await srv.client.post(f"/session/{old}/load", json={})).json()
        assert "kept" in str(history["compactedReplay"])   # still readable
    async with local_server(tmp_path, agent_factory=_Counting()) as srv:
        attached = (await srv.client.post("/session", json={})).json()
        assert (attached["sessionId"], attached["attached"]) == (new, True)
        turn = await srv.client.post(f"/session/{new}/prompt", json=_prompt("after"))
        assert turn.status_code == 202, turn.text
