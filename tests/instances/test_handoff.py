"""The hand-off of an idle session (issue #24, contract 5), two instances in process on
one PostgreSQL store: an ``/acp`` ``session/load`` on B of a session A runs, idle, gets
it (A lets it go through the store, B adopts it: token + 1) with its whole history,
prompts on, and nothing is written twice; a busy session stays where it runs and the
load gets the retryable ``session_busy_elsewhere`` at once; a caller who may not see
the session causes no hand-off (nor, once the lease expired, an adoption)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
import pytest

from bridge.agents.stdio import StdioAgentFactory
from tests.agents import ROOT, fixture_command
from tests.agents.held import HeldAgent
from tests.bridge.helpers import wait_until
from tests.acp_http.wsclient import ws_connect
from tests.harness.local import LocalServer
from tests.instances.test_forward_adopt import _pair
from tests.instances.test_leases import _session
from tests.principals.helpers import bearer, mint
from tests.store.faults import CommitHold
from tests.store.test_session_restart import _is, _prompt, read_events

pytestmark = pytest.mark.anyio
INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}


def _load(tmp_path: Path, sid: str, rpc_id: int = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rpc_id, "method": "session/load",
            "params": {"cwd": str(tmp_path), "mcpServers": [], "sessionId": sid}}


async def _initialize(ws: Any) -> None:
    await ws.send_json(INIT)
    await ws.wait_for(lambda m: m.get("id") == 0)


async def _load_refused(ws: Any, tmp_path: Path, sid: str, rpc_id: int = 1) -> dict[str, Any]:
    """``session/load`` of ``sid``; the error it is answered with."""
    await ws.send_json(_load(tmp_path, sid, rpc_id))
    return (await ws.wait_for(lambda m: m.get("id") == rpc_id, timeout=20))["error"]


@contextlib.asynccontextmanager
async def _alpha_and_beta(tmp_path: Path, now: list[float]
                          ) -> AsyncIterator[tuple[LocalServer, LocalServer, str, str, str]]:
    """Two instances with principals; alpha's session on a; the two tokens."""
    boot = "boot-" + "x" * 32
    async with _pair(tmp_path, now, token=boot, headers=bearer(boot)) as (a, b):
        alpha = await mint(a.server, "alpha", "prompt", "read")
        beta = await mint(a.server, "beta", "prompt", "read")
        made = await a.client.post("/session", json={"sessionScope": "thread"},
                                   headers=bearer(alpha))
        yield a, b, alpha, beta, made.json()["sessionId"]


async def test_an_idle_session_is_handed_over_to_the_instance_that_loads_it(
        tmp_path: Path) -> None:
    now = [0.0]
    async with _pair(tmp_path, now) as (a, b):
        sid = await _session(a.client)
        first = (await a.client.post(f"/session/{sid}/prompt",
                                     json=_prompt("/chunks 3 before"))).json()["promptId"]
        await read_events(a.client, sid, _is("turn_complete", first), last_event_id=0)
        token = a.server.fleet.journal.fence[sid]
        async with ws_connect(b.base_url) as ws:
            await _initialize(ws)
            await ws.send_json(_load(tmp_path, sid))
            history = []
            while True:
                message = await ws.receive_json(10)
                if message.get("id") == 1:
                    break
                if message.get("method") == "session/update":
                    history.append(message["params"]["update"])
            assert "result" in message, message
            assert any("before" in str(u) for u in history)   # the whole history
            assert b.bridge.has_session(sid) and not a.bridge.has_session(sid)
            assert b.server.fleet.journal.fence[sid] == token + 1
            assert a.server.fleet.handoffs.given == 1
            assert b.server.fleet.stats.handoffs_taken == 1
            await ws.send_json({"jsonrpc": "2.0", "id": 2, "method": "session/prompt",
                                "params": {"sessionId": sid,
                                           "prompt": [{"type": "text", "text": "after"}]}})
            answered = await ws.wait_for(lambda m: m.get("id") == 2, timeout=10)
            assert answered["result"]["stopReason"] == "end_turn"
        # A's reads of it now come from the journal (or B): every event once, in order
        status = await a.client.get(f"/session/{sid}/status")
        assert status.status_code == 200, status.text
        last = status.json()["lastEventId"]
        frames = await read_events(a.client, sid, lambda e: e.get("id") == last,
                                   last_event_id=0)
        ids = [f["id"] for f in frames if f.get("id") is not None]
        assert ids == list(range(1, last + 1))
        report = (await b.client.get("/daemon/status")).json()["runtime"]["instances"]
        assert report["handOffsTaken"] == 1
        text = (await a.client.get("/metrics")).text
        assert "acp_server_session_handoffs_given_total 1.0" in text


async def test_a_busy_session_stays_and_the_load_is_refused_at_once(tmp_path: Path) -> None:
    now = [0.0]
    async with _pair(tmp_path, now) as (a, b):
        sid = await _session(a.client)
        pid = (await a.client.post(f"/session/{sid}/prompt",
                                   json=_prompt("/sleep 30s x"))).json()["promptId"]
        assert a.bridge.session_status(sid).pending_prompts == 1   # accepted: busy
        async with ws_connect(b.base_url) as ws:
            await _initialize(ws)
            # A answers "busy" through the store: long before B's bound (100 s here)
            refused = await _load_refused(ws, tmp_path, sid)
        assert refused["data"]["errorKind"] == "session_busy_elsewhere", refused
        assert refused["data"]["retryable"] is True
        assert refused["data"]["retryAfterSeconds"] >= 1
        assert a.bridge.has_session(sid) and not b.bridge.has_session(sid)
        status = a.bridge.session_status(sid)   # untouched: still its only prompt
        assert status.pending_prompts == 1 and status.active_prompt_id in (None, pid)
        assert a.server.fleet.handoffs.given == 0
        assert b.server.fleet.stats.handoffs_refused == 1
        await a.client.post(f"/session/{sid}/cancel")


async def test_a_caller_who_may_not_see_the_session_causes_no_handoff(
        tmp_path: Path) -> None:
    now = [0.0]
    async with _alpha_and_beta(tmp_path, now) as (a, b, alpha, beta, sid):
        async with ws_connect(b.base_url, headers=bearer(beta)) as ws:
            await _initialize(ws)
            refused = await _load_refused(ws, tmp_path, sid)
            assert refused["code"] == -32602   # as an unknown session
            assert a.bridge.has_session(sid) and not b.bridge.has_session(sid)
            assert a.server.fleet.handoffs.given == 0
            assert b.server.fleet.stats.handoffs_refused == 0
            now[0] += 61   # a's lease expired: still not beta's to adopt
            again = await _load_refused(ws, tmp_path, sid, 2)
            assert again["code"] == -32602
            assert not b.bridge.has_session(sid) and b.server.fleet.stats.adoptions == 0


async def test_an_owner_that_does_not_answer_is_waited_for_a_bounded_time(
        tmp_path: Path) -> None:
    """An owner that never answers (paused, cut off: here it ignores the notice) is
    waited for at most ``wait_s`` (two renewal intervals by default; shortened here,
    the renewal being slower than any test), then the load is refused, retryable."""
    now = [0.0]
    async with _pair(tmp_path, now) as (a, b):
        sid = await _session(a.client)
        a.server.fleet.journal.store.on_handoff = None   # deaf to hand-off notices
        b.server.fleet.handoffs.wait_s = 0.5
        async with ws_connect(b.base_url) as ws:
            await _initialize(ws)
            refused = await _load_refused(ws, tmp_path, sid)
        assert refused["data"]["errorKind"] == "session_busy_elsewhere", refused
        assert a.bridge.has_session(sid) and not b.bridge.has_session(sid)
        assert b.server.fleet.stats.handoffs_refused == 1


async def test_a_session_whose_id_has_a_comma_is_handed_over(tmp_path: Path) -> None:
    """Notices carry ids joined by commas: the ask for session "a,b" reached its owner
    as two ids, neither its own, and the load waited out ``wait_s`` (shortened here),
    then was refused ``session_busy_elsewhere``, every time. The fixture agent loads
    any id: A makes the session with a REST ``/load``."""
    now = [0.0]
    factory = StdioAgentFactory(fixture_command("any"), cwd=str(ROOT), name="any")
    async with _pair(tmp_path, now, agent_factory=factory) as (a, b):
        b.server.fleet.handoffs.wait_s = 5   # an ask not heard: refused after this
        for sid in ("a,b", "c%2Cd"):
            made = await a.client.post(f"/session/{quote(sid, safe='')}/load", json={})
            assert made.status_code == 200, made.text
            async with ws_connect(b.base_url) as ws:
                await _initialize(ws)
                await ws.send_json(_load(tmp_path, sid))
                answer = await ws.wait_for(lambda m: m.get("id") == 1 and "method" not in m,
                                           timeout=20)
            assert "result" in answer, answer
            assert b.bridge.has_session(sid) and not a.bridge.has_session(sid)
        assert a.server.fleet.handoffs.given == 2


async def test_a_rest_caller_who_may_not_see_the_session_causes_no_adoption(
        tmp_path: Path) -> None:
    """REST's router adopts a session whose owner's lease expired for the request that
    finds it so; another principal's request (a read, a prompt, a load, a stream) is
    answered 404 as for an unknown session and takes nothing over; the maker's then
    adopts it."""
    now = [0.0]
    async with _alpha_and_beta(tmp_path, now) as (a, b, alpha, beta, sid):
        now[0] += 61   # a's lease expired
        for method, path, body in (("GET", f"/session/{sid}/status", None),
                                   ("POST", f"/session/{sid}/prompt", _prompt("mine now")),
                                   ("POST", f"/session/{sid}/load", {}),
                                   ("GET", f"/session/{sid}/events", None)):
            sent = {"json": body} if body is not None else {}
            answer = await b.client.request(method, path, headers=bearer(beta), **sent)
            assert answer.status_code == 404, (path, answer.status_code, answer.text)
            assert answer.json()["code"] == "session_not_found", answer.text
            assert not b.bridge.has_session(sid), path
            assert b.server.fleet.stats.adoptions == 0, path
        mine = await b.client.get(f"/session/{sid}/status", headers=bearer(alpha))
        assert mine.status_code == 200, mine.text
        assert b.bridge.has_session(sid) and b.server.fleet.stats.adoptions == 1


async def test_a_session_whose_last_turn_commits_is_handed_over_once_committed(
        tmp_path: Path) -> None:
    """Asked as its last turn has ended but is not committed yet (its status still
    says running, as its readers see it): the owner waits for that commit, as for
    anything else it journaled, and lets the session go, not answers busy."""
    now = [0.0]
    agent = HeldAgent()
    async with _pair(tmp_path, now, agent_factory=agent) as (a, b):
        sid = await _session(a.client)
        accepted = await a.client.post(f"/session/{sid}/prompt", json=_prompt("x"))
        assert accepted.status_code == 202
        turn = await agent.arrived(1)
        session = a.bridge.get_session(sid)
        bus = session.bus
        await wait_until(lambda: bus.released_id == bus.last_event_id)
        handoffs, journal = a.server.fleet.handoffs, a.server.fleet.journal
        store = journal.store
        hold = CommitHold(store)   # the journal's next commit
        hold.arm()
        waiting = anyio.Event()
        wait_through = journal.wait_through

        async def wait_through_seen(seq: int, **kwargs: Any) -> None:
            waiting.set()
            await wait_through(seq, **kwargs)

        journal.wait_through = wait_through_seen
        given: list[bool | None] = []

        async def let_go() -> None:
            given.append(await handoffs._let_go(sid, b.server.fleet.handoffs.instance))

        try:
            turn.release()   # its reply and its end: held until the hold is released
            await wait_until(lambda: session.pending_count == 0 and hold.entered.is_set())
            shown = a.bridge.session_status(sid).pending_prompts   # as readers see it
            async with anyio.create_task_group() as tg:
                tg.start_soon(let_go)
                await wait_until(lambda: bool(given) or waiting.is_set())
                early = list(given)   # answered before the commit landed
                hold.release()
        finally:
            hold.release()
        moved = not a.bridge.has_session(sid)
    assert shown == 1
    assert early == [], "answered busy without waiting for the commit"
    assert given == [True] and moved
