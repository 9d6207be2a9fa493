"""A closed session the journal keeps, loaded again when its agent cannot load it
(``bridge.restore.reseed_closed``), over a real SQLite or PostgreSQL store.

An agent that keeps its sessions in memory forgets them when it dies: before, a cold
``load`` of a session closed by its agent's death (or an idle timeout) was a 404 for
good, though the journal kept the whole conversation. Now the server makes a fresh
``session/new`` under the same id, seeded with the journal's transcript, as it does at
a restart; the new life (a new epoch, ids from 1) starts with the closed life's
conversation published again, as an agent's own ``session/load`` replays it.

* The agent refuses the load (it does not know the session) or does not offer
  ``session/load`` at all: reseeded, prompt terminals kept, the new life journaled.
* Not reseeded (404 as before): a session deleted (``client_close``: its journal is
  gone), an id the journal never had, a closed session of another agent.
* Through a real ``acp-server serve`` with the reference agent over stdio: ``/crash``
  kills it mid-turn, the server is killed too, and after the restart ``/load`` brings
  the session back and the agent's ``/history`` has the conversation.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx
import msgspec
import pytest

from acp_server.store.sessions import StoreSessionJournal
from bridge import Bridge
from bridge.errors import AgentError, NotSupportedError, SessionNotFoundError
from tests.bridge.helpers import text, wait_until
from tests.acp_http.wsclient import ws_connect
from tests.harness import ServeProcess
from tests.store.test_journal_isolation import _store
from tests.store.test_refused_loads import RefusingLoads
from tests.store.test_reloads import ReplayingAgent
from tests.store.test_session_restart import _flags, _prompt, read_events

pytestmark = pytest.mark.anyio


def _said(events: list[Any]) -> list[tuple[str, str]]:
    out = []
    for event in events:
        if event.type != "session_update":
            continue
        data = event.data
        if isinstance(data, msgspec.Raw):
            data = msgspec.json.decode(data)
        update = data["update"]
        out.append((update["sessionUpdate"], update["content"]["text"]))
    return out


class NoLoadAgent(ReplayingAgent):
    """An agent that does not offer ``session/load`` at all."""

    async def request(self, method: str, params: Any) -> Any:
        answer = await super().request(method, params)
        if method == "initialize":
            answer["agentCapabilities"]["loadSession"] = False
        return answer


@pytest.mark.parametrize("offers_load", [True, False], ids=["refused", "not-offered"])
async def test_a_closed_session_its_agent_forgot_is_reseeded(
        tmp_path: Path, store_name: str, offers_load: bool) -> None:
    store, _ = _store(tmp_path, store_name)
    agent = ReplayingAgent() if offers_load else NoLoadAgent()
    agent.refuse = True   # it does not know the session any more
    async with store:
        async with StoreSessionJournal(store) as journal:
            async with Bridge(agent, workspace_cwd=str(tmp_path), journal=journal) as bridge:
                made = await bridge.create_session()
                sid = made.session_id
                first = bridge.send_prompt(sid, text("apricot"))
                await first.result()
                await bridge.close_session(sid, reason="idle_timeout")   # kept, closed
                await journal.wait(journal.appended)
                kept = await journal.read(sid)
                assert kept is not None and kept.closed_at is not None
                before = _said(kept.events)
                assert before == [("user_message_chunk", "apricot"),
                                  ("agent_message_chunk", "apricot")]
                agent.calls.clear()
                loaded = await bridge.load_session(sid)
                history = loaded.history
                assert history is not None
                assert _said(history.compacted_replay) == before
                assert [t.prompt_id for t in history.prompt_terminals] == [first.prompt_id]
                assert loaded.event_epoch != made.event_epoch
                [(method, params)] = [c for c in agent.calls if c[0] == "session/new"]
                assert params["_meta"]["acp-server/requestedSessionId"] == sid
                assert params["_meta"]["acp-server/transcript"] == [
                    {"role": "user", "text": "apricot"}, {"role": "agent", "text": "apricot"}]
                await bridge.send_prompt(sid, text("plum")).result()
                await journal.wait(journal.appended)
                live = _said(bridge.get_session(sid).bus.ring_events())
        async with StoreSessionJournal(store) as journal:
            [found] = await journal.restore()
    assert found.closed_at is None and found.record.epoch == loaded.event_epoch
    assert _said(found.events) == live == before + [("user_message_chunk", "plum"),
                                                    ("agent_message_chunk", "plum")]


async def test_concurrent_loads_of_a_forgotten_session_make_one(tmp_path: Path,
                                                                store_name: str) -> None:
    """Loads of one id make one session, the others attach to it: so too when the
    agent refuses the first one's load and it goes on reseeded. A second load arrives
    while the agent holds the first (it waits on that load), a third once the agent
    refused it (it waits on the reseed)."""
    store, _ = _store(tmp_path, store_name)
    agent = RefusingLoads()
    async with store:
        async with StoreSessionJournal(store) as journal:
            async with Bridge(agent, workspace_cwd=str(tmp_path), journal=journal) as bridge:
                sid = (await bridge.create_session()).session_id
                await bridge.send_prompt(sid, text("apricot")).result()
                await bridge.close_session(sid, reason="idle_timeout")
                await journal.wait(journal.appended)
                agent.calls.clear()
                loaded: list[Any] = []
                agent.hang_new = anyio.Event()   # the reseed's session/new waits too

                async def load() -> None:
                    loaded.append(await bridge.load_session(sid))

                async with anyio.create_task_group() as tg:
                    tg.start_soon(load)
                    await wait_until(lambda: sid in bridge._sessions)   # the agent's load
                    tg.start_soon(load)
                    await wait_until(lambda: bridge._sessions[sid].agent_side is not None)
                    agent.answer.set()   # refused: the first goes on to reseed
                    await wait_until(lambda: any(m == "session/new" for m, _ in agent.calls))
                    tg.start_soon(load)
                    agent.hang_new.set()
    assert len(loaded) == 3
    assert len({info.event_epoch for info in loaded}) == 1
    assert sorted(info.attached for info in loaded) == [False, True, True]
    assert [m for m, _ in agent.calls if m in ("session/load", "session/new")] == [
        "session/load", "session/new"]


async def test_what_the_journal_does_not_keep_is_not_reseeded(tmp_path: Path,
                                                              store_name: str) -> None:
    store, _ = _store(tmp_path, store_name)
    agent, other = ReplayingAgent(), NoLoadAgent()
    other.name = "other"
    agent.refuse = other.refuse = True
    async with store:
        async with StoreSessionJournal(store) as journal:
            async with Bridge(agent, workspace_cwd=str(tmp_path), journal=journal,
                              agents={"other": other}) as bridge:
                deleted = (await bridge.create_session()).session_id
                await bridge.send_prompt(deleted, text("gone")).result()
                await bridge.close_session(deleted)   # client_close: the journal goes
                acp_deleted = (await bridge.create_session()).session_id
                await bridge.send_prompt(acp_deleted, text("gone too")).result()
                # /acp session/delete: its journal goes as well
                await bridge.close_session(acp_deleted, reason="deleted")
                closed = (await bridge.create_session()).session_id
                await bridge.send_prompt(closed, text("kept")).result()
                await bridge.close_session(closed, reason="idle_timeout")
                await journal.wait(journal.appended)
                for gone in (deleted, acp_deleted):
                    assert await journal.read(gone) is None
                    with pytest.raises(SessionNotFoundError):
                        await bridge.load_session(gone)
                with pytest.raises(SessionNotFoundError):
                    await bridge.load_session("never-made")
                # another agent never takes the closed session's conversation over
                with pytest.raises(NotSupportedError):
                    await bridge.load_session(closed, agent="other")
                assert not [c for c in other.calls if c[0] == "session/new"]
                assert not bridge.has_session(closed)
                await bridge.load_session(closed)   # its own agent: reseeded
                assert bridge.has_session(closed)


async def _acp_load(base_url: str, sid: str, cwd: str) -> tuple[list[str], str]:
    """``session/load`` over ``/acp`` (WebSocket), then a ``/history`` prompt on the
    same connection (its end closes the sessions it loaded): the texts the load
    streamed, and the prompt's reply."""
    async with ws_connect(base_url, "/acp") as ws:
        await ws.send_json({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                            "params": {"protocolVersion": 1}})
        await ws.receive_json()
        await ws.send_json({"jsonrpc": "2.0", "id": 1, "method": "session/load", "params": {
            "sessionId": sid, "cwd": cwd, "mcpServers": []}})
        said: list[list[str]] = [[], []]
        turn = 0
        while True:
            message = await ws.receive_json()
            if message.get("id") in (1, 2):
                assert "result" in message, message
                if message["id"] == 2:
                    return said[0], "".join(said[1][1:])   # after its own echo
                turn = 1
                await ws.send_json({"jsonrpc": "2.0", "id": 2, "method": "session/prompt",
                                    "params": {"sessionId": sid, "prompt": [
                                        {"type": "text", "text": "/history"}]}})
            elif message.get("method") == "session/update":
                said[turn].append(message["params"]["update"]["content"]["text"])


# Each door once, the client side (the servers are child processes) on one backend each.
DOORS = pytest.mark.parametrize(("door", "anyio_backend"), [("rest", "asyncio"), ("acp", "trio")])


@contextlib.asynccontextmanager
async def _stdio_session(tmp_path: Path, store_name: str
                         ) -> AsyncIterator[tuple[ServeProcess, str]]:
    """A real server whose agent is the reference agent over stdio (it keeps its
    sessions in memory, so its ``/crash`` forgets them), and a session made on it;
    stopped at the end."""
    child = ServeProcess(tmp_path, *_flags(tmp_path, store_name), "--agent",
                         f"{sys.executable} -m bridge.agents.reference")
    try:
        await anyio.to_thread.run_sync(child.start)
        async with httpx.AsyncClient(base_url=child.base_url, timeout=20) as client:
            made = await client.post("/session", json={"sessionScope": "thread"})
            assert made.status_code == 200, made.text
        yield child, made.json()["sessionId"]
    finally:
        await anyio.to_thread.run_sync(child.stop)


@DOORS
async def test_a_stdio_agent_that_died_and_a_restart_lose_no_conversation(
        tmp_path: Path, store_name: str, door: str) -> None:
    async with _stdio_session(tmp_path, store_name) as (child, sid):
        async with httpx.AsyncClient(base_url=child.base_url, timeout=20) as client:
            done = await client.post(f"/session/{sid}/prompt", json=_prompt("apricot"))
            crash = await client.post(f"/session/{sid}/prompt", json=_prompt("/crash"))
            assert (done.status_code, crash.status_code) == (202, 202)
            with anyio.fail_after(20):   # the agent died, and the session with it
                while (await client.get(f"/session/{sid}/status")).status_code != 404:
                    await anyio.sleep(0.02)
            gone = await client.post(f"/session/{sid}/prompt", json=_prompt("hello?"))
            assert gone.status_code == 404
        child.kill()   # the closed session is the journal's alone now
        await anyio.to_thread.run_sync(child.start)
        async with httpx.AsyncClient(base_url=child.base_url, timeout=20) as client:
            if door == "acp":
                said, reply = await _acp_load(child.base_url, sid, str(tmp_path))
            else:
                loaded = await client.post(f"/session/{sid}/load", json={})
                assert loaded.status_code == 200, loaded.text
                body = loaded.json()
                said = [e["data"]["update"]["content"]["text"]
                        for e in body["compactedReplay"] if e["type"] == "session_update"]
                assert [t["terminal"] for t in body["promptTerminals"]] == [
                    "completed", "failed"]
                reply = await _rest_history(client, sid)
            # the conversation, as sent: /acp streams the chunks, REST compacts them
            assert "".join(said).startswith("apricotEcho: apricot/crash"), said
    # the agent's new session was seeded with it
    assert reply.splitlines()[:3] == ["History:", "user: apricot", "assistant: Echo: apricot"]


async def _rest_history(client: httpx.AsyncClient, sid: str) -> str:
    asked = await client.post(f"/session/{sid}/prompt", json=_prompt("/history"))
    assert asked.status_code == 202, asked.text
    pid = asked.json()["promptId"]
    seen = await read_events(client, sid, lambda e: e.get("promptId") == pid
                             and e["type"] in ("turn_complete", "turn_error"),
                             last_event_id=asked.json()["lastEventId"])
    assert seen[-1]["type"] == "turn_complete", seen[-1]
    return "".join(e["data"]["update"]["content"]["text"] for e in seen
                   if e["type"] == "session_update" and e.get("promptId") == pid
                   and e["data"]["update"]["sessionUpdate"] == "agent_message_chunk")


async def test_a_cold_load_while_the_store_is_down_is_503_then_loads(
        tmp_path: Path, store_name: str) -> None:
    """A cold load reads the journal before it asks the agent (what a reseed needs):
    with the store down, ``/load`` of an ended session is 503 ``store_unavailable``
    (never a 404 that would tell the client the conversation is gone), and the same
    load once the store is back goes through."""
    from tests.lmsp.server import running_lmsp
    from tests.store.faults import faulty

    store = faulty(tmp_path)
    async with running_lmsp(tmp_path, store=store) as server:
        made = await server.client.post("/session", json={"sessionScope": "thread"})
        sid = made.json()["sessionId"]
        said = await server.client.post(f"/session/{sid}/prompt", json=_prompt("rowan"))
        assert said.status_code == 202
        await read_events(server.client, sid, lambda e: e["type"] == "turn_complete",
                          last_event_id=0)
        bridge = server.server.bridge
        await bridge.close_session(sid, reason="agent_exited")
        wid = (await server.client.get("/capabilities")).json()["workspaces"][0]["id"]
        with anyio.fail_after(20):   # the close committed
            while not (await server.client.get(f"/workspace/{wid}/ended-sessions")
                       ).json()["sessions"]:
                await anyio.sleep(0.01)
        store.faults.on()
        refused = await server.client.post(f"/session/{sid}/load", json={})
        assert refused.status_code == 503, refused.text
        assert refused.json()["code"] == "store_unavailable"
        assert refused.headers["retry-after"] == "5"
        store.faults.off()
        loaded = await server.client.post(f"/session/{sid}/load", json={})
        assert loaded.status_code == 200, loaded.text
        assert loaded.json()["sessionId"] == sid


@DOORS
async def test_an_ended_session_deleted_does_not_come_back(tmp_path: Path, store_name: str,
                                                           door: str) -> None:
    """A stdio agent died (it forgot the session): the journal keeps it, listed as
    ended; deleted (REST ``DELETE`` or ``/acp`` ``session/delete``), nothing can load it
    again, even after a ``kill -9`` right after the answer."""
    async with _stdio_session(tmp_path, store_name) as (child, sid):
        async with httpx.AsyncClient(base_url=child.base_url, timeout=20) as client:
            assert (await client.post(f"/session/{sid}/prompt", json=_prompt("/crash"))
                    ).status_code == 202
            wid = (await client.get("/capabilities")).json()["workspaces"][0]["id"]
            with anyio.fail_after(20):   # ended, its end committed
                while not (await client.get(f"/workspace/{wid}/ended-sessions")
                           ).json()["sessions"]:
                    await anyio.sleep(0.02)
            if door == "rest":
                assert (await client.delete(f"/session/{sid}")).status_code == 204
            else:
                async with ws_connect(child.base_url, "/acp") as ws:
                    await ws.send_json({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                                        "params": {"protocolVersion": 1}})
                    await ws.receive_json()
                    await ws.send_json({"jsonrpc": "2.0", "id": 1, "method": "session/delete",
                                        "params": {"sessionId": sid}})
                    answer = await ws.wait_for(lambda m: m.get("id") == 1)
                    assert answer == {"jsonrpc": "2.0", "id": 1, "result": {}}, answer
        child.kill()   # right after the answer
        await anyio.to_thread.run_sync(child.start)
        async with httpx.AsyncClient(base_url=child.base_url, timeout=20) as client:
            assert (await client.get(f"/workspace/{wid}/ended-sessions")).json() \
                == {"sessions": []}
            loaded = await client.post(f"/session/{sid}/load", json={})
            assert loaded.status_code == 404, loaded.text


class FailingOnceLoads(ReplayingAgent):
    """``session/load`` fails once with an internal error (a transient fault, not "no
    such session"), then refuses as an agent that forgot the session."""

    def __init__(self) -> None:
        super().__init__()
        self.refuse = True
        self.failed = False

    async def request(self, method: str, params: Any) -> Any:
        if method == "session/load" and not self.failed:
            self.failed = True
            raise AgentError(-32603, "Internal error: try again")
        return await super().request(method, params)


async def test_a_load_that_fails_otherwise_keeps_the_conversation(tmp_path: Path,
                                                                  store_name: str) -> None:
    """A cold load of an ended session whose agent fails it for another reason than "no
    such session" (an internal error, a death, a timeout) answers that error and keeps
    the journal's conversation: the next load reseeds it whole."""
    store, _ = _store(tmp_path, store_name)
    agent = FailingOnceLoads()
    async with store:
        async with StoreSessionJournal(store) as journal:
            async with Bridge(agent, workspace_cwd=str(tmp_path), journal=journal) as bridge:
                sid = (await bridge.create_session()).session_id
                await bridge.send_prompt(sid, text("apricot")).result()
                await bridge.close_session(sid, reason="idle_timeout")   # kept, closed
                await journal.wait(journal.appended)
                before = _said((await journal.read(sid)).events)   # type: ignore[union-attr]
                with pytest.raises(AgentError):
                    await bridge.load_session(sid)
                await journal.wait(journal.appended)
                kept = await journal.read(sid)
                assert kept is not None and _said(kept.events) == before
                loaded = await bridge.load_session(sid)
                assert loaded.history is not None
                assert _said(loaded.history.compacted_replay) == before


async def test_a_load_naming_no_agent_restores_the_session_on_its_own(tmp_path: Path,
                                                                     store_name: str) -> None:
    """A closed session of a non-default agent, loaded with no agent named (the console's
    "Load again", a qwen client): its own agent is asked (the journal names it), not the
    default one, which would not know it (before: a 404, as another agent never takes a
    conversation over)."""
    store, _ = _store(tmp_path, store_name)
    default, other = ReplayingAgent(), ReplayingAgent()
    other.name = "other"
    default.refuse = other.refuse = True   # neither knows it any more: reseeded
    async with store:
        async with StoreSessionJournal(store) as journal:
            async with Bridge(default, workspace_cwd=str(tmp_path), journal=journal,
                              agents={"other": other}) as bridge:
                sid = (await bridge.create_session(agent="other")).session_id
                await bridge.send_prompt(sid, text("quince")).result()
                await bridge.close_session(sid, reason="idle_timeout")
                await journal.wait(journal.appended)
                default.calls.clear()
                loaded = await bridge.load_session(sid)
                assert bridge.get_session(sid).agent_name == "other"
                assert loaded.history is not None
                assert ("agent_message_chunk", "quince") in _said(
                    loaded.history.compacted_replay)
                assert not [c for c in default.calls
                            if c[0] in ("session/load", "session/new")]
                # named, the caller's choice stands: the default refuses it
                await bridge.close_session(sid, reason="idle_timeout")
                await journal.wait(journal.appended)
                with pytest.raises(SessionNotFoundError):
                    await bridge.load_session(sid, agent="scripted")


async def _said_to(client: httpx.AsyncClient, sid: str, text_: str) -> str:
    """The agent's answer to ``text_`` on ``sid``."""
    asked = await client.post(f"/session/{sid}/prompt", json=_prompt(text_))
    assert asked.status_code == 202, asked.text
    pid = asked.json()["promptId"]
    seen = await read_events(client, sid, lambda e: e.get("promptId") == pid
                             and e["type"] in ("turn_complete", "turn_error"),
                             last_event_id=asked.json()["lastEventId"])
    assert seen[-1]["type"] == "turn_complete", seen[-1]
    return "".join(e["data"]["update"]["content"]["text"] for e in seen
                   if e["type"] == "session_update" and e.get("promptId") == pid
                   and e["data"]["update"]["sessionUpdate"] == "agent_message_chunk")


async def test_a_closed_branch_loaded_cold_keeps_what_it_was_made_from(
        tmp_path: Path, store_name: str) -> None:
    """A branch whose agent died (so it is closed, kept) and that is loaded again is
    reseeded with the conversation it was made from (its record's seed), then its own
    turns: the reference agent over stdio forgets its sessions when it dies, and
    ``/history`` says what the reseeded session was given. The new life's record keeps
    the seed, so a restart after it restores the branch with it too."""
    async with _stdio_session(tmp_path, store_name) as (child, sid):
        async with httpx.AsyncClient(base_url=child.base_url, timeout=20) as client:
            await _said_to(client, sid, "remember banana")
            made = await client.post(f"/session/{sid}/branch", json={})
            assert made.status_code == 201, made.text
            bid = made.json()["sessionId"]
            await _said_to(client, bid, "hello")
            crash = await client.post(f"/session/{bid}/prompt", json=_prompt("/crash"))
            assert crash.status_code == 202
            with anyio.fail_after(20):   # the agent died, and the branch with it
                while (await client.get(f"/session/{bid}/status")).status_code != 404:
                    await anyio.sleep(0.02)
            loaded = await client.post(f"/session/{bid}/load", json={})
            assert loaded.status_code == 200, loaded.text
            said = await _said_to(client, bid, "/history")
            assert "user: remember banana" in said, said
            assert said.index("user: remember banana") < said.index("user: hello"), said
        child.kill()
        await anyio.to_thread.run_sync(child.start)
        async with httpx.AsyncClient(base_url=child.base_url, timeout=20) as client:
            said = await _said_to(client, bid, "/history")
    assert said.index("user: remember banana") < said.index("user: hello"), said


@pytest.mark.parametrize("how", ["loaded", "reseeded"])
async def test_a_closed_branch_loaded_cold_stays_a_branch(tmp_path: Path, store_name: str,
                                                          how: str) -> None:
    """A branch closed (the idle timeout) and loaded again, by its agent's own load or
    reseeded (the agent forgot it): its new life still says what it was forked from,
    in the load's answer, the live session, its record (the ended-sessions listing's
    ``forkedFrom``), and after a restart; it got none before, a branch no more."""
    store, _ = _store(tmp_path, store_name)
    agent = ReplayingAgent()
    agent.refuse = how == "reseeded"
    async with store:
        async with StoreSessionJournal(store) as journal:
            async with Bridge(agent, workspace_cwd=str(tmp_path), journal=journal) as bridge:
                sid = (await bridge.create_session()).session_id
                await bridge.send_prompt(sid, text("apricot")).result()
                bid = (await bridge.branch_session(sid)).session_id
                await bridge.close_session(bid, reason="idle_timeout")   # kept, closed
                await journal.wait(journal.appended)
                kept = await journal.read(bid, seed=True)
                assert kept is not None and kept.record.forked_from == sid
                seed = kept.record.seed
                assert seed is not None   # the conversation it was made from
                agent.calls.clear()
                loaded = await bridge.load_session(bid)
                assert [m for m, _ in agent.calls if m in ("session/load", "session/new")] \
                    == (["session/load"] if how == "loaded" else ["session/load",
                                                                  "session/new"])
                assert loaded.forked_from == sid
                assert bridge.get_session(bid).forked_from == sid
                await bridge.close_session(bid, reason="idle_timeout")   # ended again
                await journal.wait(journal.appended)
                again = await journal.read(bid, seed=True)
                assert again is not None and again.record.epoch == loaded.event_epoch
                assert (again.record.forked_from, again.record.seed) == (sid, seed)
                await bridge.load_session(bid)   # live again, then a restart
        async with StoreSessionJournal(store) as journal:
            found = {f.record.session_id: f for f in await journal.restore()}
    assert found[bid].record.forked_from == sid
    assert found[bid].record.seed == seed
