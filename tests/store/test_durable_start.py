"""A prompt reaches its agent only once its start is committed (issue #23: an
acknowledged prompt runs once). Its echo is the journal's proof that it started:
before it is committed a crash would leave the prompt "never started", run again after
the restart, so an agent with effects outside the session (any but a ``contained``
one: ``bridge.agents.base``) is not handed it before. On the real daemon over
loopback, the real SQLite or PostgreSQL store told to refuse commits
(``tests.store.faults``): the turn waits through the outage, a cancel ends it there
unseen by the agent, and work resumes by itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest

from bridge import BridgeOptions
from bridge.agents.base import AgentClient
from bridge.agents.reference import ReferenceAgentFactory
from acp_server.store import sessions
from tests.harness import local_server
from tests.sdk.harness import wait_until
from tests.store.faults import faulty

pytestmark = pytest.mark.anyio


class _Uncontained:
    """The reference agent as an agent with effects of its own: not ``contained``;
    records the text of every prompt it is handed."""

    def __init__(self, inner: Any, prompts: list[str]) -> None:
        self._inner = inner
        self._prompts = prompts
        self.contained = False   # a test may make its next turns contained

    @property
    def closed(self) -> bool:
        return bool(self._inner.closed)

    async def request(self, method: str, params: Any) -> Any:
        if method == "session/prompt":
            self._prompts.append(params["prompt"][0]["text"])
        return await self._inner.request(method, params)

    async def notify(self, method: str, params: Any) -> None:
        await self._inner.notify(method, params)

    async def aclose(self) -> None:
        await self._inner.aclose()


class _Recording(ReferenceAgentFactory):
    def __init__(self) -> None:
        super().__init__()
        self.prompts: list[str] = []
        self.connection: _Uncontained | None = None

    async def connect(self, client: AgentClient, task_group: anyio.abc.TaskGroup) -> Any:
        self.connection = _Uncontained(await super().connect(client, task_group), self.prompts)
        return self.connection


def _body(text: str, **extra: Any) -> dict[str, Any]:
    return {"prompt": [{"type": "text", "text": text}], **extra}


async def _started_in_an_outage(srv: Any, store: Any, agent: _Recording,
                                text: str) -> tuple[str, str, Any]:
    """A prompt ``text`` committed behind a running one; the store refuses commits and
    the running one is cancelled, so ``text``'s turn starts in the outage: (session id,
    its prompt id, the session)."""
    client = srv.client
    sid = (await client.post("/session", json={"sessionScope": "thread"})).json()["sessionId"]
    first = await client.post(f"/session/{sid}/prompt", json=_body("/permission a"))
    queued = await client.post(f"/session/{sid}/prompt", json=_body(text))
    assert first.status_code == queued.status_code == 202   # both committed
    queued_id = queued.json()["promptId"]
    await wait_until(lambda: agent.prompts[-1:] == ["/permission a"])
    store.faults.on()
    assert (await client.post(f"/session/{sid}/cancel")).status_code == 204
    session = srv.bridge.get_session(sid)
    await wait_until(lambda: session.active is not None
                     and session.active.prompt_id == queued_id)
    return sid, queued_id, session


def _ended(session: Any, prompt_id: str, terminal: str) -> bool:
    return any(t.prompt_id == prompt_id and t.terminal == terminal
               for t in session.prompt_terminals)


async def test_a_turn_whose_start_cannot_be_committed_never_reaches_the_agent(
        tmp_path: Path) -> None:
    store = faulty(tmp_path)
    agent = _Recording()
    async with local_server(tmp_path, lmsp_store=store, agent_factory=agent) as srv:
        sid, late_id, session = await _started_in_an_outage(srv, store, agent,
                                                             "/chunks 1 unseen")
        # running, echoed, and waiting for a commit that cannot land
        assert agent.prompts == ["/permission a"]
        cancelled = await srv.client.delete(f"/session/{sid}/pending-prompts/{late_id}")
        assert cancelled.status_code in (200, 204), cancelled.text
        await wait_until(lambda: _ended(session, late_id, "cancelled"))
        assert agent.prompts == ["/permission a"]   # the agent never got it
        store.faults.off()
        after = await srv.client.post(f"/session/{sid}/prompt", json=_body("/chunks 1 after"))
        assert after.status_code == 202
        await wait_until(lambda: _ended(session, after.json()["promptId"], "completed"))
        assert agent.prompts == ["/permission a", "/chunks 1 after"]


async def test_a_turn_held_by_an_outage_runs_once_the_store_is_back(tmp_path: Path) -> None:
    store = faulty(tmp_path)
    agent = _Recording()
    async with local_server(tmp_path, lmsp_store=store, agent_factory=agent) as srv:
        _, queued_id, session = await _started_in_an_outage(srv, store, agent,
                                                            "/chunks 1 held")
        store.faults.off()   # no manual step: the commit lands, the turn goes on
        await wait_until(lambda: _ended(session, queued_id, "completed"))
        assert agent.prompts == ["/permission a", "/chunks 1 held"]


async def test_a_stop_in_the_outage_does_not_hand_the_waiting_turn_to_its_agent(
        tmp_path: Path) -> None:
    """The stop lets held events through (nothing more is journaled): that is no
    commit, and the turn that waited for one is not sent; the close settles it."""
    store = faulty(tmp_path)
    agent = _Recording()
    async with local_server(tmp_path, lmsp_store=store, agent_factory=agent) as srv:
        _, waiting_id, session = await _started_in_an_outage(srv, store, agent,
                                                             "/chunks 1 never sent")
    assert agent.prompts == ["/permission a"]
    assert not _ended(session, waiting_id, "completed")


async def test_a_cancel_of_a_turn_waiting_for_its_commit_ends_it_at_once(
        tmp_path: Path) -> None:
    """Its agent does not have the prompt: no ``session/cancel``, no grace to wait out
    (the next prompt is not held for it)."""
    store = faulty(tmp_path)
    agent = _Recording()
    async with local_server(tmp_path, lmsp_store=store, agent_factory=agent,
                            options=BridgeOptions(cancel_grace_ms=600_000)) as srv:
        sid, waiting_id, session = await _started_in_an_outage(srv, store, agent,
                                                               "/chunks 1 cancelled")
        assert (await srv.client.post(f"/session/{sid}/cancel")).status_code == 204
        with anyio.fail_after(30):   # a bound: the grace is ten minutes
            await wait_until(lambda: _ended(session, waiting_id, "cancelled")
                             and session.active is None)
        store.faults.off()


async def test_a_turn_waiting_for_its_commit_is_not_shed_past_the_journals_bound(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Past ``MAX_PENDING`` queued records the journal lets the oldest events through
    uncommitted (``_shed``); those of a session whose turn waits for its start's commit
    stay (``SessionJournal.hold``): the turn is not handed over uncommitted."""
    monkeypatch.setattr(sessions, "MAX_PENDING", 40)
    store = faulty(tmp_path)
    agent = _Recording()
    async with local_server(tmp_path, lmsp_store=store, agent_factory=agent) as srv:
        client = srv.client
        other = (await client.post("/session", json={"sessionScope": "thread"})
                 ).json()["sessionId"]
        held = await client.post(f"/session/{other}/prompt", json=_body("/permission b"))
        burst = await client.post(f"/session/{other}/prompt", json=_body("/chunks 120 x"))
        assert held.status_code == burst.status_code == 202
        await wait_until(lambda: agent.prompts == ["/permission b"])
        _, waiting_id, session = await _started_in_an_outage(srv, store, agent,
                                                             "/chunks 1 held")
        assert agent.connection is not None
        agent.connection.contained = True   # the next turn runs without a commit
        assert (await client.post(f"/session/{other}/cancel")).status_code == 204
        other_session = srv.bridge.get_session(other)
        await wait_until(lambda: _ended(other_session, burst.json()["promptId"], "completed"))
        assert "let through unjournaled" in caplog.text   # the bound was passed
        assert agent.prompts == ["/permission b", "/permission a", "/chunks 120 x"]
        store.faults.off()   # the echo commits: the turn goes on, once
        await wait_until(lambda: _ended(session, waiting_id, "completed"))
        assert agent.prompts[3:] == ["/chunks 1 held"]


async def test_the_reference_agent_is_contained() -> None:
    """It runs a turn at once: nothing of a turn whose start a crash lost was seen."""
    connection = await ReferenceAgentFactory().connect(None, None)  # type: ignore[arg-type]
    assert connection.contained is True
