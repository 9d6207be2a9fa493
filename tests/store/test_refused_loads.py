"""Prompts admitted while a ``session/load`` waits for the agent, which then refuses it,
on the durable journal over a real SQLite or PostgreSQL store: their rows in
``session_prompts`` go with the undone load, so clients that retry refused loads (a
prompt admitted each time) do not grow the journal for ever.

* An id with no session record: the undo's ``EventsReset`` deletes its prompt rows.
* An id with a record (a live session, or a closed one kept for the retention): its
  prompt rows stay (the purge takes a closed session's with it).
* Rows an undo never reached (the process killed during the load: the prompt's row
  committed, no reset after it) go when the id is made anew (its next load).

    agent = RefusingLoads()          # session/load waits for ``agent.answer``, then refuses
    await refused_load_with_prompt(bridge, agent, "some-id")
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from acp_server.store.sessions import StoreSessionJournal
from bridge import Bridge
from bridge.errors import AgentError, SessionClosedError, SessionNotFoundError
from bridge.journal import EventsReset, PromptAccepted, SessionOpened
from bridge.jsonrpc import RESOURCE_NOT_FOUND
from tests.bridge.helpers import text, wait_until
from tests.bridge.scripted_agent import ScriptedAgent
from tests.store.test_journal_isolation import _store

pytestmark = pytest.mark.anyio


class RefusingLoads(ScriptedAgent):
    """``session/load`` waits until the test sets ``answer``, then refuses (the agent
    does not know the session)."""

    def __init__(self) -> None:
        super().__init__()
        self.answer = anyio.Event()

    async def request(self, method: str, params: Any) -> Any:
        if method != "session/load":
            return await super().request(method, params)
        self.calls.append((method, params))
        await self.answer.wait()
        raise AgentError(RESOURCE_NOT_FOUND, "Session not found")


async def refused_load_with_prompt(bridge: Bridge, agent: RefusingLoads, sid: str, *,
                                   reseeded: bool = False) -> None:
    """Load ``sid``; while the agent has not answered, admit a prompt and wait for its
    row to be committed (its acknowledgement waits for the load's answer too); then
    the agent refuses the load (the prompt fails). ``reseeded``: ``sid`` is a closed
    session the journal keeps, so the load goes on as a new agent session seeded from
    it (``bridge.restore.reseed_closed``) instead of failing."""
    agent.answer = anyio.Event()
    async with anyio.create_task_group() as tg:
        async def load() -> None:
            if reseeded:
                await bridge.load_session(sid)
                return
            with pytest.raises(SessionNotFoundError):
                await bridge.load_session(sid)

        tg.start_soon(load)
        await wait_until(lambda: sid in bridge._sessions)
        ticket = bridge.send_prompt(sid, text("while it loads"))
        await bridge.journal.wait(bridge.journal.appended)   # its row is in the journal
        agent.answer.set()
    with anyio.fail_after(30), pytest.raises(SessionClosedError):
        await ticket


def _prompt_rows(conn: Any) -> dict[str, int]:
    return {sid: int(n) for sid, n in conn.execute(
        "SELECT session_id, COUNT(*) FROM session_prompts GROUP BY session_id").fetchall()}


async def test_refused_loads_leave_no_prompt_rows(tmp_path: Path, store_name: str) -> None:
    store, _ = _store(tmp_path, store_name)
    agent = RefusingLoads()
    async with store:
        async with StoreSessionJournal(store) as journal:
            async with Bridge(agent, workspace_cwd=str(tmp_path), journal=journal) as bridge:
                live = (await bridge.create_session()).session_id
                await bridge.send_prompt(live, text("live")).result()
                closed = (await bridge.create_session()).session_id
                await bridge.send_prompt(closed, text("closed")).result()
                await bridge.close_session(closed, reason="idle_timeout")   # kept, closed
                for n in range(4):
                    await refused_load_with_prompt(bridge, agent, f"retried-{n % 2}")
                await refused_load_with_prompt(bridge, agent, closed, reseeded=True)
                await journal.wait(journal.appended)
                rows = await store._read(_prompt_rows)
                counted = set(journal._untrimmed)   # settle counts kept in memory
    assert rows.get("retried-0", 0) == 0 and rows.get("retried-1", 0) == 0
    assert rows[live] == 1
    assert rows[closed] >= 1   # its own prompt stays with its record (until the purge)
    assert not counted & {"retried-0", "retried-1"}   # nothing kept of them in memory


async def test_a_refused_load_under_write_behind_leaves_no_row(
        tmp_path: Path, store_name: str) -> None:
    """``--session-write-behind``: the refused load's events armed its window (a marker
    row, ``id = 0``); the undo leaves neither that row nor any other of the id."""
    store, _ = _store(tmp_path, store_name)
    agent = RefusingLoads()
    async with store:
        async with StoreSessionJournal(store, write_behind=2) as journal:
            async with Bridge(agent, workspace_cwd=str(tmp_path), journal=journal) as bridge:
                for n in range(2):
                    sid = f"refused-{n}"
                    agent.answer = anyio.Event()
                    async with anyio.create_task_group() as tg:
                        async def load() -> None:
                            with pytest.raises(SessionNotFoundError):
                                await bridge.load_session(sid)

                        tg.start_soon(load)
                        await wait_until(lambda: sid in bridge._sessions)
                        # a prompt open: the window stays open (its marker set)
                        bridge.send_prompt(sid, text("while it loads"))
                        agent.client.session_update(sid, {
                            "sessionId": sid, "update": {
                                "sessionUpdate": "agent_message_chunk",
                                "content": {"type": "text", "text": "replayed"}}})
                        # committed, after its marker (its window opened)
                        await wait_until(lambda: bridge._sessions[sid].bus.released_id
                                         == 1)
                        agent.answer.set()
                await journal.wait(journal.appended)
                rows = await store._read(lambda conn: conn.execute(
                    "SELECT COUNT(*) FROM session_segments").fetchone())
    assert rows[0] == 0


async def test_rows_a_crash_left_during_a_load_go_at_the_ids_next_life(
        tmp_path: Path, store_name: str) -> None:
    """What a ``kill -9`` during a load leaves (the prompt's row, no record, no reset
    after it) goes when the id is made anew (its ``EventsReset``); an id with a record
    keeps its prompts through a reset."""
    store, _ = _store(tmp_path, store_name)
    async with store:
        async with StoreSessionJournal(store) as journal:
            journal.append(SessionOpened(session_id="recorded", agent="a", cwd="/",
                                         created_at=1.0, epoch="e"))
            for n, sid in enumerate(("crashed", "recorded")):
                journal.append(PromptAccepted(session_id=sid, prompt_id=f"p-{sid}",
                                              prompt=text("x"), queued_at_ms=n, seq=n))
            await journal.wait(journal.appended)
            left = await store._read(_prompt_rows)
            for sid in ("crashed", "recorded"):
                journal.append(EventsReset(session_id=sid))
            await journal.wait(journal.appended)
            rows = await store._read(_prompt_rows)
    assert left == {"crashed": 1, "recorded": 1}
    assert rows == {"recorded": 1}
from tests.lmsp.conftest import store_name  # noqa: F401,E402 - the fixture
