"""A session id made anew (a ``session/load`` after one the agent refused, or after the
session was closed) on the durable journal, over a real SQLite or PostgreSQL store:
the new life's bus numbers its events from 1 again, under a new epoch.

* A refused load whose events are still in the journal's commit when the same id is
  loaded again: that late commit releases nothing of the new bus (its events reach
  readers only once committed), and the new life's events are the ones journaled
  (a restart gives them back, not the refused load's).
* A session closed (kept in the journal for the retention) and loaded again: the
  journal holds the new life's events, not the old ones under the new epoch.
* With ``--session-write-behind``, that late commit (the refused load's marker and
  events) neither opens the new life's window (its own marker is still to commit) nor
  counts for its committed events: the new life's events stay held until then.

The commits are held by a gate in the journal's own commit (a threading condition,
opened one commit at a time by the test), never by a sleep.

    gates = CommitGates(journal)   # every commit of ``journal`` waits for its turn
    gates.allow(1)                 # the first one runs
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from acp_server.store.sessions import StoreSessionJournal
from bridge import Bridge
from bridge.errors import AgentError, SessionNotFoundError
from bridge.journal import EventRecord
from bridge.jsonrpc import RESOURCE_NOT_FOUND
from tests.bridge.helpers import drain, text, wait_until
from tests.bridge.scripted_agent import ScriptedAgent
from tests.store.test_journal_isolation import _store

pytestmark = pytest.mark.anyio


class ReplayingAgent(ScriptedAgent):
    """``session/load`` replays ``replay`` (agent message chunks), then answers, or
    refuses (``refuse``: the agent does not know the session)."""

    def __init__(self) -> None:
        super().__init__()
        self.replay: list[str] = []
        self.refuse = False

    async def request(self, method: str, params: Any) -> Any:
        if method != "session/load":
            return await super().request(method, params)
        self.calls.append((method, params))
        sid = params["sessionId"]
        for said in self.replay:
            self.client.session_update(sid, {"sessionId": sid, "update": {
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": said}}})
        if self.refuse:
            raise AgentError(RESOURCE_NOT_FOUND, "Session not found")
        return {}


class CommitGates:
    """Every commit of ``journal`` (its ``_commit_in``, on the writer's thread) waits
    until the test allowed that many; ``entered`` counts those that started."""

    def __init__(self, journal: StoreSessionJournal) -> None:
        self.entered = 0
        self._allowed = 0
        self._cond = threading.Condition()
        inner = journal._commit_in

        def gated(conn: Any, out: Any, *state: Any) -> Any:
            with self._cond:
                self.entered += 1
                mine = self.entered
                self._cond.wait_for(lambda: self._allowed >= mine, timeout=10)
            return inner(conn, out, *state)

        journal._commit_in = gated   # type: ignore[method-assign]

    def allow(self, count: int) -> None:
        with self._cond:
            self._allowed += count
            self._cond.notify_all()


def _texts(events: list[Any]) -> list[str]:
    said = []
    for event in events:
        if event.type == "session_update":
            data = event.data
            if isinstance(data, msgspec.Raw):
                data = msgspec.json.decode(data)
            said.append(data["update"]["content"]["text"])
    return said


async def test_a_refused_loads_late_commit_releases_nothing_of_the_next_load(
        tmp_path: Path, store_name: str) -> None:
    store, _ = _store(tmp_path, store_name)
    agent = ReplayingAgent()
    sid = "loaded-twice"
    async with store:
        async with StoreSessionJournal(store) as journal:
            async with Bridge(agent, workspace_cwd=str(tmp_path), journal=journal) as bridge:
                gates = CommitGates(journal)
                try:
                    await _load_twice(bridge, agent, journal, gates, sid)
                finally:
                    gates.allow(100)   # a failure never leaves the writer held
                epoch = bridge.get_session(sid).bus.epoch
        async with StoreSessionJournal(store) as journal:
            [found] = await journal.restore()
    assert found.record.epoch == epoch
    assert [e.id for e in found.events] == [1, 2, 3]
    assert _texts(found.events) == ["new one", "new two", "new three"]   # not the old ones


async def _load_twice(bridge: Bridge, agent: ReplayingAgent, journal: StoreSessionJournal,
                      gates: CommitGates, sid: str) -> None:
    agent.replay, agent.refuse = ["old one", "old two"], True
    with pytest.raises(SessionNotFoundError):
        await bridge.load_session(sid)
    # hold the refused load's two events in a commit in flight
    held = 1
    while True:
        await wait_until(lambda: gates.entered == held)
        if [r.event_id for _, r in journal._batch if isinstance(r, EventRecord)] == [1, 2]:
            break
        gates.allow(1)   # an earlier commit (the record reset): let it land
        held += 1
    agent.replay, agent.refuse = ["new one", "new two", "new three"], False
    loaded: list[Any] = []
    async with anyio.create_task_group() as tg:
        async def load_again() -> None:
            loaded.append(await bridge.load_session(sid))

        tg.start_soon(load_again)
        await wait_until(lambda: sid in bridge._sessions
                         and bridge._sessions[sid].bus.last_event_id == 3)
        bus = bridge._sessions[sid].bus
        reader = bus.subscribe(last_event_id=0, epoch=bus.epoch)
        gates.allow(1)   # the refused load's events land
        await wait_until(lambda: gates.entered == held + 1)   # the next commit runs
        # none of the new bus's events is committed yet: none is released
        assert bus.released_id == 0
        assert [f.id for f in drain(reader) if f.id is not None] == []
        gates.allow(100)
    assert bus.released_id == 3
    epoch = loaded[0].event_epoch
    assert epoch == bus.epoch
    got = bridge.get_session(sid).bus.ring_events()
    assert _texts(got) == ["new one", "new two", "new three"]
    assert list(bridge._held) == [(sid, bus.epoch)]   # the refused load's bus went


async def test_a_closed_session_loaded_again_journals_its_new_life(
        tmp_path: Path, store_name: str) -> None:
    store, _ = _store(tmp_path, store_name)
    agent = ReplayingAgent()
    async with store:
        async with StoreSessionJournal(store) as journal:
            async with Bridge(agent, workspace_cwd=str(tmp_path), journal=journal) as bridge:
                sid = (await bridge.create_session()).session_id
                await bridge.send_prompt(sid, text("first life")).result()
                await bridge.close_session(sid, reason="idle_timeout")   # kept, closed
                agent.replay = ["replayed"]
                loaded = await bridge.load_session(sid)
                await bridge.send_prompt(sid, text("second life")).result()
                await journal.wait(journal.appended)   # all of it released
                live = [(e.id, e.type) for e in bridge.get_session(sid).bus.ring_events()]
        async with StoreSessionJournal(store) as journal:
            [found] = await journal.restore()
    assert found.record.epoch == loaded.event_epoch
    assert [(e.id, e.type) for e in found.events] == live   # what readers saw, no other
    assert _texts(found.events)[0] == "replayed"
    assert "session_closed" not in [e.type for e in found.events]


async def test_a_refused_loads_late_commit_neither_arms_nor_advances_the_next_life(
        tmp_path: Path, store_name: str) -> None:
    """``--session-write-behind``: the refused load's commit (its marker and its events)
    lands once the same id is loaded again, the new life's marker still to commit. It
    must not count for the new life: the new life's events stay held until its own
    marker commits (the old marker shares its generation number, the old events its
    ids), and never more than the window of them is seen before its commit."""
    store, _ = _store(tmp_path, store_name)
    agent = ReplayingAgent()
    sid = "loaded-twice"
    async with store:
        async with StoreSessionJournal(store, write_behind=2) as journal:
            async with Bridge(agent, workspace_cwd=str(tmp_path), journal=journal) as bridge:
                gates = CommitGates(journal)
                try:
                    await _reload_behind(bridge, agent, journal, gates, sid)
                finally:
                    gates.allow(100)
                epoch = bridge.get_session(sid).bus.epoch
        async with StoreSessionJournal(store) as journal:
            [found] = await journal.restore()
    assert found.record.epoch == epoch
    assert _texts(found.events) == ["new one", "new two", "new three", "new four"]


async def _reload_behind(bridge: Bridge, agent: ReplayingAgent, journal: StoreSessionJournal,
                         gates: CommitGates, sid: str) -> None:
    agent.replay, agent.refuse = ["old one", "old two"], True
    with pytest.raises(SessionNotFoundError):
        await bridge.load_session(sid)
    held = 1   # hold the commit of the refused load's marker and events
    while True:
        await wait_until(lambda: gates.entered == held)
        if [r.event_id for _, r in journal._batch if isinstance(r, EventRecord)] == [1, 2]:
            break
        gates.allow(1)
        held += 1
    agent.replay, agent.refuse = ["new one", "new two", "new three"], False
    async with anyio.create_task_group() as tg:
        tg.start_soon(bridge.load_session, sid)
        await wait_until(lambda: sid in bridge._sessions
                         and bridge._sessions[sid].bus.last_event_id == 3)
        bus = bridge._sessions[sid].bus
        reader = bus.subscribe(last_event_id=0, epoch=bus.epoch)
        gates.allow(1)   # the refused load's commit lands
        await wait_until(lambda: gates.entered == held + 1)   # the new life's runs, held
        agent.client.session_update(sid, {"sessionId": sid, "update": {
            "sessionUpdate": "agent_message_chunk",
            "content": {"type": "text", "text": "new four"}}})
        await wait_until(lambda: bus.last_event_id == 4)
        # the new life's marker is not committed: none of its events is seen yet
        assert bus.released_id == 0
        assert [f.id for f in drain(reader) if f.id is not None] == []
        gates.allow(100)
    await journal.wait(journal.appended)
    assert bus.released_id == 4


async def test_a_closed_sessions_failed_reload_keeps_it_retained(
        tmp_path: Path, store_name: str) -> None:
    """The load of a closed, retained session whose new record the store refuses is
    undone; the closed session stays as it was (its record and its prompt terminals
    for a later load), not deleted with the undone life."""
    from bridge.errors import JournalUnavailableError
    from tests.store.triggers import refuse_rows

    store, url = _store(tmp_path, store_name)
    agent = ReplayingAgent()
    async with store:
        async with StoreSessionJournal(store) as journal:
            async with Bridge(agent, workspace_cwd=str(tmp_path), journal=journal) as bridge:
                sid = (await bridge.create_session()).session_id
                await bridge.send_prompt(sid, text("first life")).result()
                await bridge.close_session(sid, reason="idle_timeout")   # kept, closed
                await journal.wait(journal.appended)
                refuse_rows(url=url, sqlite_path=tmp_path / "state" / "lmsp.sqlite3",
                            name="refuse_reopen", table="sessions", when="1 = 1")
                with pytest.raises(JournalUnavailableError):
                    await bridge.load_session(sid)
                await journal.wait(journal.appended)
        async with StoreSessionJournal(store) as journal:
            found = {f.record.session_id: f for f in await journal.restore()}
    assert sid in found, "the retained closed session was deleted by the undone reload"
    assert found[sid].closed_at is not None
    assert [t.terminal for t in found[sid].terminals] == ["completed"]
