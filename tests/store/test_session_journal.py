"""The session journal on the store, in process (both anyio backends) and through the
ACP Python SDK against a real process: a failed commit is a 503 that releases the slot
exactly once, a clean stop keeps the sessions, ``DELETE`` removes a session's journal,
closed sessions are purged after the retention on the injected clock (and at start), a
record that cannot be decoded is skipped, and an ``/acp`` client ``session/load``s the
whole history after a ``kill -9``."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from acp_server.rest.workspace import workspace_id
from bridge import BridgeOptions
from bridge.agents.reference import ReferenceAgentFactory
from bridge.errors import JournalUnavailableError
from bridge.journal import EventsReset
from bridge.transcript import seed_of
from tests.acp_http.wsclient import ws_connect
from tests.agents.held import HeldAgent
from tests.bridge.helpers import wait_until
from tests.harness import ServeProcess, local_server
from tests.lmsp import stores
from tests.store.faults import CommitHold, faulty
from tests.store.segment_rows import rewrite_event
from tests.store.test_session_restart import _flags, _is, _prompt, read_events

pytestmark = pytest.mark.anyio


async def _settled(client: httpx.AsyncClient, sid: str, prompt_id: str) -> None:
    await read_events(client, sid, _is("turn_complete", prompt_id), last_event_id=0)


async def test_a_failed_commit_is_503_and_releases_the_slot_once(tmp_path: Path,
                                                                  store_name: str) -> None:
    store = faulty(tmp_path)
    async with local_server(tmp_path, lmsp_store=store,
                            options=BridgeOptions(max_pending_prompts_per_session=1)) as srv:
        client = srv.client
        sid = (await client.post("/session", json={"sessionScope": "thread"})).json()["sessionId"]
        store.faults.on()
        refused = await client.post(f"/session/{sid}/prompt", json=_prompt("lost"))
        assert refused.status_code == 503
        assert refused.json()["code"] == "store_unavailable"
        assert refused.headers["retry-after"]
        assert srv.bridge.session_status(sid).pending_prompts == 0   # the slot is free
        no_session = await client.post("/session", json={"sessionScope": "thread"})
        assert no_session.status_code == 503
        assert no_session.json()["code"] == "store_unavailable"
        assert [s.session_id for s in srv.bridge.list_sessions()] == [sid]
        store.faults.off()
        accepted = await client.post(f"/session/{sid}/prompt", json=_prompt("kept"))
        assert accepted.status_code == 202   # the one slot was released, once
        await _settled(client, sid, accepted.json()["promptId"])
        terminals = (await client.post(f"/session/{sid}/load", json={})).json()[
            "promptTerminals"]
        assert [t["terminal"] for t in terminals] == ["failed", "completed"]
        assert terminals[0]["errorCode"] == "store_unavailable"
        assert srv.bridge.session_status(sid).pending_prompts == 0


async def _a_turn_held(srv: Any, agent: HeldAgent) -> tuple[str, httpx.Response, Any, Any]:
    """A session whose prompt's turn the agent holds, all its events so far committed:
    its id, the 202, the turn, its bus."""
    client = srv.client
    sid = (await client.post("/session", json={"sessionScope": "thread"})).json()["sessionId"]
    accepted = await client.post(f"/session/{sid}/prompt", json=_prompt("/chunks 5 x"))
    assert accepted.status_code == 202
    turn = await agent.arrived(1)
    bus = srv.bridge.get_session(sid).bus
    await wait_until(lambda: bus.released_id == bus.last_event_id)
    return sid, accepted, turn, bus


async def test_status_and_listing_say_the_committed_id_in_an_outage(
        tmp_path: Path, store_name: str) -> None:
    """Events published while the store is down are held (not committed): the status
    and the listing say the last committed id, as ``/load`` and the stream do, so a
    client resuming from it after a restart skips nothing, and a turn that ended
    meanwhile still running, as readers see it (no ``updatedAt`` of its end, no
    terminal in ``/load``); once the store is back and they are committed, the
    newest, and the turn ended."""
    store, agent = faulty(tmp_path), HeldAgent()
    async with local_server(tmp_path, lmsp_store=store, agent_factory=agent) as srv:
        client = srv.client
        sid, accepted, turn, bus = await _a_turn_held(srv, agent)
        committed = bus.released_id   # all of it so far
        store.faults.on()
        turn.release()   # its events are published in the outage, and held
        session = srv.bridge.get_session(sid)
        await wait_until(lambda: session.pending_count == 0)   # it ended, in memory
        assert bus.released_id == committed
        wid = workspace_id(str(tmp_path))
        status = (await client.get(f"/session/{sid}/status")).json()
        listed = (await client.get(f"/workspace/{wid}/sessions")).json()["sessions"]
        loaded = await client.post(f"/session/{sid}/load", json={})
        assert loaded.status_code == 200
        assert status["lastEventId"] == listed[0]["lastEventId"] == committed
        assert loaded.json()["lastEventId"] == committed
        assert srv.bridge.published_event_id(sid) == bus.last_event_id > committed
        prompt_id = accepted.json()["promptId"]
        for shown in (status, listed[0]):   # still running, as its readers see it
            assert shown["hasActivePrompt"] is True
            assert shown["activePromptId"] == prompt_id
            assert shown["activeWorkState"] == "active"
        assert "updatedAt" not in status   # no turn ended, for its readers
        assert status["pendingPrompts"] == 1 and status["queuedPrompts"] == 0
        assert listed[0]["activePromptText"] == "/chunks 5 x"
        assert loaded.json()["promptTerminals"] == []
        store.faults.off()
        await _settled(client, sid, prompt_id)
        await wait_until(lambda: bus.released_id == bus.last_event_id)
        status = (await client.get(f"/session/{sid}/status")).json()
        assert status["lastEventId"] == bus.last_event_id > committed
        assert status["hasActivePrompt"] is False and status["pendingPrompts"] == 0
        assert status["activeWorkState"] == "unsupported" and "updatedAt" in status
        assert session.held_turns is None


def _journal_url(tmp_path: Path, store_name: str) -> dict[str, Any]:
    if store_name == "postgres":
        return {"store": stores.postgres_url_for(tmp_path, "journal")}
    return {}


async def test_a_clean_stop_keeps_sessions_delete_and_retention_remove_them(
        tmp_path: Path, store_name: str) -> None:
    now = [1_000_000.0]
    settings: dict[str, Any] = {**_journal_url(tmp_path, store_name),
                                "session_retention_ms": 60_000, "session_clock": lambda: now[0]}
    async with local_server(tmp_path, **settings) as srv:
        ids = []
        for _ in range(3):
            created = await srv.client.post("/session", json={"sessionScope": "thread"})
            ids.append(created.json()["sessionId"])
        accepted = await srv.client.post(f"/session/{ids[0]}/prompt", json=_prompt("hi"))
        await _settled(srv.client, ids[0], accepted.json()["promptId"])
        epoch = srv.bridge.session_status(ids[0]).event_epoch
        assert (await srv.client.delete(f"/session/{ids[1]}")).status_code == 204
        await srv.bridge.reap_idle_sessions()   # nothing idle yet
        await srv.bridge.close_session(ids[2], reason="idle_timeout")   # closed, kept
    async with local_server(tmp_path, **settings) as srv:
        live = [s.session_id for s in srv.bridge.list_sessions()]
        assert live == [ids[0]]   # deleted and closed sessions are not live again
        assert srv.bridge.session_status(ids[0]).event_epoch == epoch
        assert await srv.server.purge_sessions() == 0   # within the retention
        now[0] += 61   # the injected clock: past the retention
        assert await srv.server.purge_sessions() == 1
        if store_name == "sqlite":
            with sqlite3.connect(tmp_path / "state" / "lmsp.sqlite3") as db:
                rows = {r[0] for r in db.execute("SELECT id FROM sessions")}
                events = {r[0] for r in db.execute("SELECT DISTINCT session_id "
                                                   "FROM session_segments")}
            assert rows == {ids[0]} and events == {ids[0]}


async def test_the_retention_bounds_the_closed_sessions_bytes(
        tmp_path: Path, store_name: str) -> None:
    """Closed sessions within the time retention are purged, the longest closed first,
    once their journaled events take more than ``session_retention_bytes`` in all; the
    live ones are never counted (before, only time purged: sessions left to close, up
    to 80 MiB each, filled the disk within the seven days)."""
    now = [1_000_000.0]
    settings: dict[str, Any] = {**_journal_url(tmp_path, store_name),
                                "session_retention_ms": 3_600_000,
                                "session_retention_bytes": 500_000,
                                "session_clock": lambda: now[0]}
    async with local_server(tmp_path, **settings) as srv:
        ids = [(await srv.client.post("/session", json={"sessionScope": "thread"})
                ).json()["sessionId"] for _ in range(4)]
        for sid in ids:   # ~200 kB of events each: the prompt's echo and the reply
            accepted = await srv.client.post(f"/session/{sid}/prompt",
                                             json=_prompt("x" * 100_000))
            await _settled(srv.client, sid, accepted.json()["promptId"])
        for sid in ids[:3]:
            now[0] += 1
            await srv.bridge.close_session(sid, reason="idle_timeout")   # closed, kept
        assert await srv.server.purge_sessions() == 1   # the longest closed: 600 kB > 500 kB
        ended = f"/workspace/{workspace_id(str(tmp_path))}/ended-sessions"
        kept = [s["sessionId"] for s in (await srv.client.get(ended)).json()["sessions"]]
        assert sorted(kept) == sorted(ids[1:3])
        assert await srv.bridge.journal.record_of(ids[0]) is None   # its rows are gone
        assert await srv.bridge.journal.record_of(ids[1]) is not None
        assert [s.session_id for s in srv.bridge.list_sessions()] == [ids[3]]
        assert await srv.server.purge_sessions() == 0


async def test_the_retention_is_applied_at_start(tmp_path: Path, store_name: str) -> None:
    """A server restarted more often than the purge interval purges all the same: the
    first purge runs at start (the injected clock: past the retention between runs)."""
    now = [1_000_000.0]
    settings: dict[str, Any] = {**_journal_url(tmp_path, store_name),
                                "session_retention_ms": 60_000, "session_clock": lambda: now[0]}
    async with local_server(tmp_path, **settings) as srv:
        ids = [(await srv.client.post("/session", json={"sessionScope": "thread"})
                ).json()["sessionId"] for _ in range(2)]
        await srv.bridge.close_session(ids[1], reason="idle_timeout")   # closed, kept
    async with local_server(tmp_path, **settings) as srv:   # within the retention: kept
        ended = f"/workspace/{workspace_id(str(tmp_path))}/ended-sessions"
        assert [s["sessionId"] for s in (await srv.client.get(ended)).json()["sessions"]
                ] == [ids[1]]
    now[0] += 61
    async with local_server(tmp_path, **settings) as srv:
        with anyio.fail_after(10):
            while (await srv.client.get(ended)).json()["sessions"]:
                await anyio.sleep(0.01)
        assert (await srv.client.post(f"/session/{ids[1]}/load", json={})).status_code == 404
        assert [s.session_id for s in srv.bridge.list_sessions()] == [ids[0]]


async def test_an_undecodable_record_is_skipped(tmp_path: Path) -> None:
    async with local_server(tmp_path) as srv:
        good = (await srv.client.post("/session", json={"sessionScope": "thread"})).json()
        bad = (await srv.client.post("/session", json={"sessionScope": "thread"})).json()
        for sid in (good["sessionId"], bad["sessionId"]):
            accepted = await srv.client.post(f"/session/{sid}/prompt", json=_prompt("/chunks 4 x"))
            await _settled(srv.client, sid, accepted.json()["promptId"])
    with sqlite3.connect(tmp_path / "state" / "lmsp.sqlite3") as db:
        db.execute("UPDATE sessions SET record = x'c1ff' WHERE id = ?", (bad["sessionId"],))
        rewrite_event(db.execute, good["sessionId"], lambda e: e[0] == 2, b"{{")
    async with local_server(tmp_path) as srv:
        assert [s.session_id for s in srv.bridge.list_sessions()] == [good["sessionId"]]
        status = srv.bridge.session_status(good["sessionId"])
        assert status.event_epoch != good["eventEpoch"]   # an event is lost: a new epoch
        frames = await read_events(srv.client, good["sessionId"],
                                   lambda e: e["type"] == "replay_complete",
                                   last_event_id=1, epoch=good["eventEpoch"])
        assert frames[0]["type"] == "state_resync_required"   # never a silent gap
        assert frames[0]["data"]["reason"] == "epoch_reset"


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("transport", ["http", "websocket"])
async def test_an_acp_sdk_client_loads_the_history_after_kill_9(tmp_path: Path,
                                                                store_name: str,
                                                                transport: str) -> None:
    """The ACP Python SDK makes the session over Streamable HTTP and, after the kill,
    ``session/load``s it on a fresh connection (Streamable HTTP or WebSocket) and gets
    the whole history before its answer, then prompts on."""
    acp = pytest.importorskip("acp")
    from acp import PROTOCOL_VERSION, Client, connect_to_agent, text_block
    from acp.http import create_http_stream
    from acp.ws import create_websocket_stream
    from acp.schema import AgentMessageChunk, ClientCapabilities, UserMessageChunk

    class Recording(Client):   # type: ignore[misc]
        def __init__(self) -> None:
            self.said: list[tuple[str, str]] = []

        async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
            if isinstance(update, (AgentMessageChunk, UserMessageChunk)):
                self.said.append((type(update).__name__, update.content.text))

    class Arrivals:
        """The SDK's transport, recording what reaches the client in order (the SDK
        runs each notification's handler as its own task, so a handler may run after
        the answer that followed it on the wire)."""

        def __init__(self, inner: Any) -> None:
            self.inner, self.seen = inner, []

        async def send(self, message: dict[str, Any]) -> None:
            await self.inner.send(message)

        async def receive(self) -> dict[str, Any] | None:
            message = await self.inner.receive()
            self.seen.append(message)
            return message

        async def close(self) -> None:
            await self.inner.close()

    child = ServeProcess(tmp_path, *_flags(tmp_path, store_name)).start()
    try:
        async with httpx.AsyncClient(timeout=httpx.Timeout(None)) as http:
            first = Recording()
            conn = connect_to_agent(first, create_http_stream(f"{child.base_url}/acp",
                                                              client=http))
            await conn.initialize(protocol_version=PROTOCOL_VERSION,
                                  client_capabilities=ClientCapabilities())
            session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
            for text in ("one", "two"):
                result = await conn.prompt(session_id=session.session_id,
                                           prompt=[text_block(text)])
                assert result.stop_reason == "end_turn"
        child.kill()   # the connection dies with the process
        child.start()
        async with httpx.AsyncClient(timeout=httpx.Timeout(None)) as http:
            second = Recording()
            stream = (create_http_stream(f"{child.base_url}/acp", client=http)
                      if transport == "http" else await create_websocket_stream(
                          child.base_url.replace("http://", "ws://") + "/acp"))
            arrivals = Arrivals(stream)
            conn = connect_to_agent(second, arrivals)
            await conn.initialize(protocol_version=PROTOCOL_VERSION,
                                  client_capabilities=ClientCapabilities())
            await conn.load_session(session_id=session.session_id, cwd=str(tmp_path),
                                    mcp_servers=[])
            answered = next(n for n, m in enumerate(arrivals.seen)
                            if m is not None and "result" in m and m.get("id") != 0)
            before = [m["params"]["update"] for m in arrivals.seen[:answered]
                      if m is not None and m.get("method") == "session/update"]
            assert [u["content"]["text"] for u in before
                    if u["sessionUpdate"] == "user_message_chunk"] == ["one", "two"]
            assert "".join(u["content"]["text"] for u in before
                           if u["sessionUpdate"] == "agent_message_chunk") == "Echo: oneEcho: two"
            # and the client's handlers got them all (each in its own task)
            await wait_until(lambda: sum(kind == "UserMessageChunk"
                                         for kind, _ in second.said) == 2, timeout=10)
            users = [text for kind, text in second.said if kind == "UserMessageChunk"]
            agent = "".join(text for kind, text in second.said if kind == "AgentMessageChunk")
            assert users == ["one", "two"]
            assert agent == "Echo: oneEcho: two"
            with anyio.fail_after(20):
                result = await conn.prompt(session_id=session.session_id,
                                           prompt=[text_block("three")])
            assert result.stop_reason == "end_turn"
            later = "".join(text for kind, text in second.said if kind == "AgentMessageChunk")
            assert later == "Echo: oneEcho: twoEcho: three"   # the history once, then the turn
            await conn.close()
    finally:
        child.stop()


class _Forgetful(ReferenceAgentFactory):
    """The reference agent, minus what restores a session: no load, ids not honoured."""

    async def connect(self, client: Any, task_group: Any) -> Any:
        conn = await super().connect(client, task_group)
        original = conn.request

        async def request(method: str, params: Any) -> Any:
            if method == "session/new":
                params = {k: v for k, v in params.items() if k != "_meta"}
            return await original(method, params)

        conn.request = request  # type: ignore[method-assign]
        return conn


async def test_a_session_its_agent_cannot_restore_keeps_its_history(tmp_path: Path) -> None:
    async with local_server(tmp_path) as srv:
        sid = (await srv.client.post("/session", json={"sessionScope": "thread"})
               ).json()["sessionId"]
        accepted = await srv.client.post(f"/session/{sid}/prompt", json=_prompt("kept"))
        await _settled(srv.client, sid, accepted.json()["promptId"])
    async with local_server(tmp_path, agent_factory=_Forgetful()) as srv:
        assert [s.session_id for s in srv.bridge.list_sessions()] == [sid]
        loaded = await srv.client.post(f"/session/{sid}/load", json={})
        assert loaded.status_code == 200
        said = [e["data"]["update"]["content"]["text"] for e in loaded.json()["compactedReplay"]
                if e["type"] == "session_update"]
        assert said == ["kept", "Echo: kept"]
        refused = await srv.client.post(f"/session/{sid}/prompt", json=_prompt("more"))
        assert refused.status_code == 409
        assert refused.json()["code"] == "session_not_restorable"


async def test_acp_a_failed_commit_is_a_json_rpc_store_error(tmp_path: Path,
                                                             store_name: str) -> None:
    """``/acp``: a prompt whose commit fails ends with ``errorKind: store_unavailable``
    and never runs; a ``session/new`` whose record cannot commit is refused the same way."""
    store = faulty(tmp_path)
    async with local_server(tmp_path, lmsp_store=store) as srv, \
            ws_connect(srv.base_url) as ws:
        await ws.send_json({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                            "params": {"protocolVersion": 1}})
        await ws.wait_for(lambda m: m.get("id") == 0)
        new = {"cwd": str(tmp_path), "mcpServers": []}
        await ws.send_json({"jsonrpc": "2.0", "id": 1, "method": "session/new", "params": new})
        sid = (await ws.wait_for(lambda m: m.get("id") == 1))["result"]["sessionId"]
        store.faults.on()
        await ws.send_json({"jsonrpc": "2.0", "id": 2, "method": "session/prompt", "params": {
            "sessionId": sid, "prompt": [{"type": "text", "text": "lost"}]}})
        error = (await ws.wait_for(lambda m: m.get("id") == 2))["error"]
        assert error["data"]["errorKind"] == "store_unavailable"
        await ws.send_json({"jsonrpc": "2.0", "id": 3, "method": "session/new", "params": new})
        refused = (await ws.wait_for(lambda m: m.get("id") == 3))["error"]
        assert refused["data"]["errorKind"] == "store_unavailable"
        assert srv.bridge.session_status(sid).pending_prompts == 0
        store.faults.off()
        await ws.send_json({"jsonrpc": "2.0", "id": 4, "method": "session/prompt", "params": {
            "sessionId": sid, "prompt": [{"type": "text", "text": "kept"}]}})
        done = await ws.wait_for(lambda m: m.get("id") == 4)
        assert done["result"]["stopReason"] == "end_turn"


async def test_a_restored_session_adopts_its_clients_ids(tmp_path: Path) -> None:
    """A client id issued before the restart is accepted after it (the SDKs send theirs
    on every request); on a session never restored an unknown id stays a 400."""
    async with local_server(tmp_path) as srv:
        created = (await srv.client.post("/session", json={"sessionScope": "thread"})).json()
    async with local_server(tmp_path) as srv:
        headers = {"X-Qwen-Client-Id": created["clientId"]}
        accepted = await srv.client.post(f"/session/{created['sessionId']}/prompt",
                                         json=_prompt("again"), headers=headers)
        assert accepted.status_code == 202
        await _settled(srv.client, created["sessionId"], accepted.json()["promptId"])
        fresh = (await srv.client.post("/session", json={"sessionScope": "thread"})).json()
        refused = await srv.client.post(f"/session/{fresh['sessionId']}/prompt",
                                        json=_prompt("x"), headers=headers)
        assert refused.status_code == 400


@pytest.mark.parametrize("anyio_backend", ["asyncio"])   # the server is its own process
async def test_a_prompt_msgpack_cannot_hold_is_journaled(tmp_path: Path,
                                                         store_name: str) -> None:
    """A prompt block with an integer past 64 bits (valid JSON, which msgpack cannot
    hold) is accepted like any other (202, never 503 ``store_unavailable``), survives a
    ``kill -9`` queued, and reaches the agent and the stream unchanged after it."""
    big = 2**70 + 1
    child = ServeProcess(tmp_path, *_flags(tmp_path, store_name)).start()
    try:
        async with httpx.AsyncClient(base_url=child.base_url, timeout=10) as client:
            sid = (await client.post("/session", json={"sessionScope": "thread"})
                   ).json()["sessionId"]
            long = (await client.post(f"/session/{sid}/prompt",
                                      json=_prompt("/sleep 30s long"))).json()["promptId"]
            queued = await client.post(
                f"/session/{sid}/prompt", headers={"content-type": "application/json"},
                content='{"prompt": [{"type": "text", "text": "queued", "x": %d}]}' % big)
            assert queued.status_code == 202, queued.text
            seen = await read_events(client, sid, _is("session_update", long), last_event_id=0)
        child.kill()   # the big prompt still queued: it comes back from the journal
        child.start()
        async with httpx.AsyncClient(base_url=child.base_url, timeout=10) as client:
            after = await read_events(client, sid,
                                      _is("turn_complete", queued.json()["promptId"]),
                                      last_event_id=seen[-1]["id"])
        echo = [e["data"]["update"]["content"] for e in after
                if e["type"] == "session_update" and e["promptId"] == queued.json()["promptId"]
                and e["data"]["update"]["sessionUpdate"] == "user_message_chunk"]
        assert echo == [{"type": "text", "text": "queued", "x": big}]
    finally:
        child.stop()


async def test_a_clean_stop_in_an_outage_shows_readers_nothing_uncommitted(
        tmp_path: Path, store_name: str) -> None:
    """The stop's last commit fails (the store is down): the events held meanwhile and
    the drain's own (the prompt's end, ``session_closed``) never reach the reader; its
    stream ends after the last committed event (where the next start numbers on from:
    no id it saw is taken again)."""
    store, agent = faulty(tmp_path), HeldAgent()
    async with local_server(tmp_path, lmsp_store=store, agent_factory=agent) as srv:
        client = srv.client
        sid, accepted, turn, bus = await _a_turn_held(srv, agent)
        committed = bus.released_id   # all of it so far
        seen: list[int] = []
        ended = anyio.Event()

        async def read() -> None:
            async with client.stream("GET", f"/session/{sid}/events",
                                     headers={"Last-Event-ID": "0"}) as response:
                async for line in response.aiter_lines():
                    if line.startswith("id: "):
                        seen.append(int(line[4:]))
            ended.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            await wait_until(lambda: seen and seen[-1] == committed)
            store.faults.on()
            turn.release()   # its events are published in the outage, and held
            await wait_until(lambda: bus.last_event_id > committed)
            await srv.bridge.aclose()   # the stop: its last commit fails
            with anyio.fail_after(10):
                await ended.wait()
        assert seen == list(range(1, committed + 1))   # nothing past the committed


async def test_a_turn_past_its_deadline_held_is_counted_once(
        tmp_path: Path, store_name: str) -> None:
    """A prompt past its deadline settles while its agent still runs the turn (the
    cancel's grace): its end, held in an outage, is reported as the one running prompt,
    not also counted queued (it was both the held turn and the session's active one)."""
    store = faulty(tmp_path)
    agent = HeldAgent(hold=lambda text: text.startswith("held"))
    options = BridgeOptions(prompt_deadline_ms=2000, cancel_grace_ms=60_000)
    async with local_server(tmp_path, lmsp_store=store, agent_factory=agent,
                            options=options) as srv:
        client = srv.client
        sid = (await client.post("/session", json={"sessionScope": "thread"})
               ).json()["sessionId"]
        accepted = await client.post(f"/session/{sid}/prompt", json=_prompt("held x"))
        assert accepted.status_code == 202
        turn = await agent.arrived(1)   # its start committed, the agent holds it
        session = srv.bridge.get_session(sid)
        bus = session.bus
        await wait_until(lambda: bus.released_id == bus.last_event_id)
        store.faults.on()
        await wait_until(lambda: session.pending_count == 0)   # past its deadline
        assert session.active is not None   # the agent still runs it
        status = (await client.get(f"/session/{sid}/status")).json()
        assert status["activePromptId"] == accepted.json()["promptId"]
        assert status["pendingPrompts"] == 1 and status["queuedPrompts"] == 0, status
        store.faults.off()
        turn.release()
        await wait_until(lambda: session.active is None
                         and bus.released_id == bus.last_event_id)
        status = (await client.get(f"/session/{sid}/status")).json()
        assert status["pendingPrompts"] == 0 and status["queuedPrompts"] == 0


async def test_nothing_is_acknowledged_while_a_clean_stop_ends_the_journal(
        tmp_path: Path, store_name: str) -> None:
    """A prompt or a session made while the stop's last commit is in flight (the REST
    door still serves) cannot be journaled any more: it is refused with a 503
    ``store_unavailable`` (sent again after the restart), never a 202 or a 200 that the
    next start knows nothing of."""
    store = faulty(tmp_path)
    hold = CommitHold(store)   # the journal's commit in flight until the test releases it
    async with local_server(tmp_path, lmsp_store=store) as srv:
        client = srv.client
        sid = (await client.post("/session", json={"sessionScope": "thread"})
               ).json()["sessionId"]
        answers: dict[str, httpx.Response] = {}

        async def post(name: str, path: str, body: dict[str, Any]) -> None:
            answers[name] = await client.post(path, json=body)

        try:
            async with anyio.create_task_group() as tg:
                hold.arm()
                tg.start_soon(post, "first", f"/session/{sid}/prompt", _prompt("first"))
                await wait_until(hold.entered.is_set)   # its commit is in flight, held
                tg.start_soon(srv.bridge.aclose)   # the stop: waits for that commit
                await wait_until(lambda: srv.bridge._closed)
                await post("late", f"/session/{sid}/prompt", _prompt("late"))
                await post("new", "/session", {"sessionScope": "thread"})
                hold.release()
        finally:
            hold.release()
        assert answers["first"].status_code == 202   # committed before the stop ended
        for name in ("late", "new"):
            assert answers[name].status_code == 503, (name, answers[name].status_code, answers[name].text)
            assert answers[name].json()["code"] == "store_unavailable"


async def test_a_session_whose_journal_a_stop_ended_admits_no_prompt(
        tmp_path: Path, store_name: str) -> None:
    """Between the journal's end and the session's close (the stop's next step), a
    prompt is refused (``JournalUnavailableError``: 503), no slot taken, never admitted
    unjournaled."""
    async with local_server(tmp_path, lmsp_store=faulty(tmp_path)) as srv:
        sid = (await srv.client.post("/session", json={"sessionScope": "thread"})
               ).json()["sessionId"]
        await srv.bridge._stop_journaling()   # the stop's first step, alone
        with pytest.raises(JournalUnavailableError):
            srv.bridge.send_prompt(sid, [{"type": "text", "text": "late"}])
        assert srv.bridge.session_status(sid).pending_prompts == 0


async def test_a_branch_taken_as_its_parents_turn_commits_keeps_that_turn(
        tmp_path: Path, store_name: str) -> None:
    """A branch made while its parent's last turn has ended but is not committed yet
    (held: its readers do not see it yet) keeps that turn in its seed, the conversation
    it is restored with after a restart: its agent forked it with that turn, and the
    branch's record commits after the turn's events."""
    store, agent = faulty(tmp_path), HeldAgent()
    hold = CommitHold(store)
    async with local_server(tmp_path, lmsp_store=store, agent_factory=agent) as srv:
        client = srv.client
        try:
            sid, accepted, turn, bus = await _a_turn_held(srv, agent)
            session = srv.bridge.get_session(sid)
            hold.arm()
            turn.release()   # its reply and its end: the first in a commit held, the rest after
            await wait_until(lambda: session.pending_count == 0)
            await wait_until(hold.entered.is_set)
            assert bus.released_id < bus.last_event_id
            branched: list[httpx.Response] = []

            async def branch() -> None:
                branched.append(await client.post(f"/session/{sid}/branch", json={}))

            async with anyio.create_task_group() as tg:
                tg.start_soon(branch)
                await wait_until(lambda: len(srv.bridge.list_sessions()) == 2)
                hold.release()
        finally:
            hold.release()
        assert branched[0].status_code == 201, branched[0].text
        fork = srv.bridge.get_session(branched[0].json()["sessionId"])
        await wait_until(lambda: bus.released_id == bus.last_event_id)
        assert fork.seed == seed_of(None, bus.ring_events())   # the parent's whole turn


async def test_a_load_undone_ends_its_readers_streams(tmp_path: Path,
                                                      store_name: str) -> None:
    """A load of a closed session whose record fails to commit is undone (503): a
    reader that subscribed meanwhile sees nothing uncommitted (the closed life's
    conversation the load published again, held) and its stream ends, not left open
    on a bus no commit will ever release."""
    store = faulty(tmp_path)
    journal: list[Any] = []
    # the load's first commit: its new life's events reset (the journal's batch)
    hold = CommitHold(store, lambda batch: any(isinstance(record, EventsReset)
                                               for _, record in journal[0]._batch))
    async with local_server(tmp_path, lmsp_store=store) as srv:
        journal.append(srv.bridge.journal)
        client = srv.client
        sid = (await client.post("/session", json={"sessionScope": "thread"})
               ).json()["sessionId"]
        accepted = await client.post(f"/session/{sid}/prompt", json=_prompt("hello"))
        await _settled(client, sid, accepted.json()["promptId"])
        await srv.bridge.close_session(sid, reason="idle_timeout")   # closed, kept
        loaded: list[httpx.Response] = []
        lines: list[str] = []
        ended = anyio.Event()

        async def load() -> None:
            loaded.append(await client.post(f"/session/{sid}/load", json={}))

        async def read() -> None:
            async with client.stream("GET", f"/session/{sid}/events", timeout=None,
                                     headers={"Last-Event-ID": "0"}) as response:
                lines.append(str(response.status_code))
                async for line in response.aiter_lines():
                    lines.append(line)
            ended.set()

        try:
            async with anyio.create_task_group() as tg:
                hold.arm()
                tg.start_soon(load)
                await wait_until(lambda: hold.entered.is_set() and srv.bridge.has_session(sid))
                session = srv.bridge.get_session(sid)
                tg.start_soon(read)
                await wait_until(lambda: session.bus.subscriber_count == 1)
                held = session.bus.last_event_id > session.bus.released_id
                store.faults.on()
                hold.release()   # the load's commits fail: the session is undone
                await wait_until(lambda: bool(loaded))
                with anyio.move_on_after(10):   # a hang bound
                    await ended.wait()
                hung = not ended.is_set()
                tg.cancel_scope.cancel()
        finally:
            hold.release()
            store.faults.off()
    assert loaded[0].status_code == 503, loaded[0].text
    assert held   # (what makes the case: events the journal holds)
    assert not hung, lines
    assert not [line for line in lines if line.startswith("id: ")]
