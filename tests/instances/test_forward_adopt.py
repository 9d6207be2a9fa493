"""Two instances in process on one PostgreSQL store and one injected clock (issue #24):
a write for a session owned by the other instance is forwarded there (a prompt), a
read is answered from the journal (status, the event stream with ``Last-Event-ID``,
ended when the session is closed), a forwarded request is never forwarded again, and once the owner's lease expired the instance that gets a request
adopts the session (token + 1) from the journal; the old owner's next write is
refused, it stops the session there, and from then on forwards to the new owner."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from bridge.errors import SessionBusyElsewhereError
from tests.bridge.helpers import wait_until
from tests.harness import local_server
from tests.harness.local import LocalServer
from tests.instances.test_leases import _session
from tests.lmsp import stores
from tests.store.test_session_restart import _is, _prompt, read_events

pytestmark = pytest.mark.anyio


def _flags(tmp_path: Path, now: list[float]) -> dict[str, Any]:
    """An instance of the test's store, on the injected clock ``now``."""
    if not stores.postgres_dsn():
        pytest.skip(stores.SKIP_POSTGRES)
    # the renewal is slower than any test: the injected clock alone expires a lease
    return {"store": stores.postgres_url_for(tmp_path, "fleet"), "lease_offset": lambda: now[0],
            "session_lease_ttl_ms": 60_000, "session_lease_renew_ms": 50_000}


@contextlib.asynccontextmanager
async def _pair(tmp_path: Path, now: list[float], **extra: Any
                ) -> AsyncIterator[tuple[LocalServer, ...]]:
    flags = {**_flags(tmp_path, now), **extra}
    async with local_server(tmp_path, state_dir=tmp_path / "a", **flags) as a, \
            local_server(tmp_path, state_dir=tmp_path / "b", **flags) as b:
        yield a, b


async def test_forwarded_to_the_owner_then_adopted_when_its_lease_expired(
        tmp_path: Path) -> None:
    now = [0.0]
    async with _pair(tmp_path, now) as (a, b):
        sid = await _session(a.client)
        assert not b.bridge.has_session(sid)
        status = await b.client.get(f"/session/{sid}/status")   # a read: from the journal
        assert status.status_code == 200, status.text
        assert status.json()["eventEpoch"] == a.bridge.session_status(sid).event_epoch
        accepted = await b.client.post(f"/session/{sid}/prompt", json=_prompt("/chunks 3 x"))
        assert accepted.status_code == 202
        pid = accepted.json()["promptId"]
        frames = await read_events(b.client, sid, _is("turn_complete", pid), last_event_id=0)
        ids = [f["id"] for f in frames if f.get("id") is not None]
        assert ids == list(range(1, len(ids) + 1))   # a's events, on b, in order
        assert not b.bridge.has_session(sid) and a.bridge.has_session(sid)
        stats = b.server.fleet.stats   # the prompt went to a; the reads were answered on b
        assert (stats.forwards, stats.journal_reads, stats.adoptions) == (1, 2, 0)
        loop = await b.client.get(f"/session/{sid}/status",
                                  headers={"x-acp-forwarded-by": "elsewhere"})
        assert loop.status_code == 404   # a forwarded request is served where it lands

        epoch = a.bridge.session_status(sid).event_epoch
        now[0] += 61   # a stopped renewing (paused, say): its lease expired
        status = await b.client.get(f"/session/{sid}/status")
        assert status.status_code == 200
        assert b.bridge.has_session(sid) and b.server.fleet.stats.adoptions == 1
        assert b.bridge.session_status(sid).event_epoch == epoch   # the stream goes on
        # a still runs it, unaware: its next write is refused and it stops the session
        refused = await a.client.post(f"/session/{sid}/prompt", json=_prompt("stale"))
        assert refused.status_code == 503   # in flight at the fence: its own code
        assert refused.json()["code"] == "session_moved"
        assert refused.headers["retry-after"] == "1"
        await wait_until(lambda: not a.bridge.has_session(sid), timeout=10)
        # from now on a forwards to b, and the stream continues from the journal
        again = await a.client.post(f"/session/{sid}/prompt", json=_prompt("/chunks 2 y"))
        assert again.status_code == 202
        assert a.server.fleet.stats.forwards == 1
        more = await read_events(a.client, sid, _is("turn_complete", again.json()["promptId"]),
                                 last_event_id=ids[-1])
        more_ids = [f["id"] for f in more if f.get("id") is not None]
        assert more_ids[0] == ids[-1] + 1   # no gap, no duplicate
        assert more_ids == list(range(more_ids[0], more_ids[0] + len(more_ids)))

        status = (await b.client.get("/daemon/status")).json()["runtime"]["instances"]
        assert status == {"instance": b.server.leases.instance, "advertisedUrl": b.base_url,
                          "sessionsOwned": 1, "leasesTakenOver": 1, "sessionsMovedAway": 0,
                          "forwards": 1, "journalReads": 2, "forwardFailures": 0, "forwardsRerouted": 0,
                          "handOffsGiven": 0, "handOffsTaken": 0, "handOffsRefused": 0}
        moved = (await a.client.get("/daemon/status")).json()["runtime"]["instances"]
        assert (moved["sessionsOwned"], moved["sessionsMovedAway"]) == (0, 1)
        text = (await b.client.get("/metrics")).text
        assert f'acp_server_instance_info{{instance="{b.server.leases.instance}"}} 1.0' in text
        for line in ("acp_server_sessions_owned 1.0", "acp_server_session_adoptions_total 1.0",
                     "acp_server_session_forwards_total 1.0",
                     "acp_server_session_journal_reads_total 2.0"):
            assert line in text


async def test_a_replica_status_says_how_the_last_turn_failed(tmp_path: Path) -> None:
    """A session's status read from the journal on another instance has the owner's
    ``updatedAt``, ``hasTurnError``, ``turnError`` and ``pendingInteractions`` (qwen
    serve's status fields)."""
    now = [0.0]
    async with _pair(tmp_path, now) as (a, b):
        sid = await _session(a.client)
        fresh = (await b.client.get(f"/session/{sid}/status")).json()
        assert (fresh["hasTurnError"], fresh["activeWorkState"]) == (False, "unsupported")
        assert "updatedAt" not in fresh and "turnError" not in fresh
        pid = (await a.client.post(f"/session/{sid}/prompt", json=_prompt("/fail"))
               ).json()["promptId"]
        await read_events(b.client, sid, _is("turn_error", pid), last_event_id=0)
        owner = (await a.client.get(f"/session/{sid}/status")).json()
        replica = (await b.client.get(f"/session/{sid}/status")).json()
        assert owner["hasTurnError"] is True
        for key in ("updatedAt", "hasTurnError", "turnError", "activeWorkState"):
            assert replica[key] == owner[key], key
        # the listing there names it by its first prompt too (its journaled record)
        wid = (await b.client.get("/capabilities")).json()["workspaces"][0]["id"]
        listed = {s["sessionId"]: s for s in
                  (await b.client.get(f"/workspace/{wid}/sessions")).json()["sessions"]}
        assert (listed[sid]["displayName"], listed[sid]["isArchived"]) == ("/fail", False)
        # a permission request waiting: listed the same (``pendingInteractions``)
        asking = (await a.client.post(f"/session/{sid}/prompt", json=_prompt("/permission x"))
                  ).json()["promptId"]
        await read_events(b.client, sid, _is("permission_request", asking), last_event_id=0)
        owner = (await a.client.get(f"/session/{sid}/status")).json()
        replica = (await b.client.get(f"/session/{sid}/status")).json()
        assert len(owner["pendingInteractions"]) == 1
        for key in ("pendingInteractions", "isWaitingForPermission", "hasTurnError"):
            assert replica[key] == owner[key], key
        await a.client.delete(f"/session/{sid}")


async def test_an_owner_that_cannot_be_reached_is_a_503(tmp_path: Path) -> None:
    now = [0.0]
    async with _pair(tmp_path, now) as (a, b):
        sid = await _session(a.client)
        a.server.leases.url = "http://127.0.0.1:9"   # type: ignore[union-attr]
        assert await a.bridge.journal.renew() == set()   # type: ignore[attr-defined]
        refused = await b.client.post(f"/session/{sid}/prompt", json=_prompt("x"))
        assert refused.status_code == 503, refused.text
        assert refused.json()["code"] == "owner_unreachable"
        assert refused.headers["retry-after"] == "5"
        assert b.server.fleet.stats.forward_failures == 1 == b.server.fleet.stats.forwards


async def test_the_sweep_adopts_an_orphan_and_settles_its_interrupted_prompt(
        tmp_path: Path) -> None:
    now = [0.0]
    async with _pair(tmp_path, now) as (a, b):
        sid = await _session(a.client)
        running = await a.client.post(f"/session/{sid}/prompt", json=_prompt("/sleep 60s"))
        queued = await a.client.post(f"/session/{sid}/prompt", json=_prompt("/chunks 2 q"))
        pids = [running.json()["promptId"], queued.json()["promptId"]]
        await read_events(a.client, sid, lambda e: e["type"] == "session_update"
                          and e.get("promptId") == pids[0], last_event_id=0)
        assert await b.server.fleet.sweep() == 0   # a's lease is live
        now[0] += 61   # a stopped renewing
        assert await b.server.fleet.sweep() == 1 and b.bridge.has_session(sid)
        await read_events(b.client, sid, _is("turn_complete", pids[1]), last_event_id=0)
        terminals = (await b.client.post(f"/session/{sid}/load", json={})).json()[
            "promptTerminals"]
        by_id = {t["promptId"]: t for t in terminals}
        assert by_id[pids[0]]["errorCode"] == "server_restarted"   # --session-on-restart fail
        assert by_id[pids[1]]["terminal"] == "completed"           # the queued one ran on b


async def test_acp_resume_flow_across_instances(tmp_path: Path) -> None:
    """``/acp`` on the other instance: its ``Acp-Connection-Id`` is unknown there (404);
    the client re-``initialize``s and ``session/load``s, which is refused (retryable)
    while the owner's lease is live and it will not hand the session over (a door that
    does not vouch for its caller: here the bridge's own load), and adopts the session
    once the lease expired. (The hand-off itself: ``test_handoff.py``.)"""
    from tests.acp_http.wsclient import ws_connect

    now = [0.0]
    async with _pair(tmp_path, now) as (a, b):
        init = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
                "params": {"protocolVersion": 1}}
        opened = await a.client.post("/acp", json=init, headers={
            "accept": "application/json, text/event-stream"})
        connection = opened.headers["acp-connection-id"]
        unknown = await b.client.post("/acp", json={
            "jsonrpc": "2.0", "id": 1, "method": "session/new",
            "params": {"cwd": str(tmp_path), "mcpServers": []}}, headers={
            "accept": "application/json, text/event-stream", "acp-connection-id": connection})
        assert unknown.status_code == 404   # a's connection: b does not hold it
        sid = await _session(a.client)
        done = await a.client.post(f"/session/{sid}/prompt", json=_prompt("/chunks 2 hi"))
        await read_events(a.client, sid, _is("turn_complete", done.json()["promptId"]),
                          last_event_id=0)
        load = {"cwd": str(tmp_path), "mcpServers": [], "sessionId": sid}
        async with ws_connect(b.base_url) as ws:
            await ws.send_json(init)
            await ws.wait_for(lambda m: m.get("id") == 0)
            with pytest.raises(SessionBusyElsewhereError):   # no door's word: no hand-off
                await b.bridge.load_session(sid)
            assert not b.bridge.has_session(sid) and a.bridge.has_session(sid)
            now[0] += 61   # a's lease expired
            await ws.send_json({"jsonrpc": "2.0", "id": 2, "method": "session/load",
                                "params": load})
            loaded = await ws.wait_for(lambda m: m.get("id") == 2)
            assert "result" in loaded, loaded
            assert b.bridge.has_session(sid) and b.server.fleet.stats.adoptions == 1
            await ws.send_json({"jsonrpc": "2.0", "id": 3, "method": "session/prompt",
                                "params": {"sessionId": sid,
                                           "prompt": [{"type": "text", "text": "again"}]}})
            answered = await ws.wait_for(lambda m: m.get("id") == 3)
            assert answered["result"]["stopReason"] == "end_turn"


async def test_a_stream_from_the_journal_ends_when_its_client_goes_away(
        tmp_path: Path) -> None:
    """An event stream of a session owned elsewhere is read from the journal here; the
    tail that follows the journal for it ends when its last reader leaves (a server
    may drop sends to a gone client without a word), and nothing is forwarded."""
    now = [0.0]
    async with _pair(tmp_path, now) as (a, b):
        sid = await _session(a.client)
        replicas = b.server.fleet.replicas   # type: ignore[union-attr]
        for round_ in range(3):
            accepted = await b.client.post(f"/session/{sid}/prompt",
                                           json=_prompt(f"/chunks 2 r{round_}"))
            pid = accepted.json()["promptId"]
            await read_events(b.client, sid, _is("turn_complete", pid), last_event_id=0)
            # the reader left: so does the tail
            await wait_until(lambda: not replicas.following(), timeout=10)
        assert a.bridge.get_session(sid).bus.subscriber_count == 0
        assert b.server.fleet.stats.forwards == 3   # the prompts
        assert b.server.fleet.stats.journal_reads == 3   # the streams


async def test_a_stream_from_the_journal_ends_when_the_owner_closes_the_session(
        tmp_path: Path) -> None:
    now = [0.0]
    async with _pair(tmp_path, now) as (a, b):
        sid = await _session(a.client)
        await a.client.post(f"/session/{sid}/prompt", json=_prompt("/chunks 2 z"))
        closed = False
        with anyio.fail_after(20):   # the stream on b ends once a closed the session
            async with b.client.stream("GET", f"/session/{sid}/events",
                                       headers={"Last-Event-ID": "0"}) as stream:
                assert stream.status_code == 200
                async for line in stream.aiter_lines():
                    if line == "event: turn_complete" and not closed:
                        deleted = await a.client.delete(f"/session/{sid}")
                        assert deleted.status_code == 204
                        closed = True
        assert closed
        assert b.server.fleet.replicas.following() == []   # type: ignore[union-attr]


async def test_a_forwarded_request_is_counted_once_and_a_client_marker_skips_nothing(
        tmp_path: Path) -> None:
    """Rate limits: a prompt b forwards to a is counted by a (which serves it), not by
    b too; a client that sends the forward marker itself is counted as any other."""
    from tests.principals.helpers import bearer, mint

    limits = {"token": "boot-s3cret-for-the-fleet", "principals_clock": lambda: 100.0,
              "rate_limit_prompt": 2, "rate_limit_mutation": 100, "rate_limit_read": 100}
    async with _pair(tmp_path, [0.0], **limits) as (a, b):
        ci = bearer(await mint(a.server, "ci"))
        made = [(await x.client.post("/session", json={"sessionScope": "thread"},
                                     headers=ci)).json()["sessionId"] for x in (a, b)]
        on_a, on_b = made
        for n in range(2):   # through b, to a: a's two prompts of the minute
            sent = await b.client.post(f"/session/{on_a}/prompt", json=_prompt(f"f{n}"),
                                       headers=ci)
            assert sent.status_code == 202, sent.text
        assert b.server.fleet.stats.forwards == 2   # type: ignore[union-attr]
        third = await a.client.post(f"/session/{on_a}/prompt", json=_prompt("a"), headers=ci)
        assert third.status_code == 429   # a counted both
        for n in range(2):   # b counted neither: its own two are still there
            sent = await b.client.post(f"/session/{on_b}/prompt", json=_prompt(f"b{n}"),
                                       headers=ci)
            assert sent.status_code == 202, sent.text
        marked = await b.client.post(f"/session/{on_b}/prompt", json=_prompt("m"),
                                     headers={**ci, "x-acp-forwarded-by": a.server.leases
                                              .instance})   # type: ignore[union-attr]
        assert marked.status_code == 429   # the marker a client sends skips no limit


async def test_a_replica_load_of_a_live_ownerless_session_is_404_to_non_admins(
        tmp_path: Path) -> None:
    """A journaled session no principal owns (made by none: before principals were
    recorded, or by the server itself), live on a: a non-admin's ``/load`` is 404 on a
    and on b (which answers it from the journal) alike; the bootstrap token (admin)
    loads it from b's journal."""
    from tests.principals.helpers import bearer, mint

    boot = "boot-s3cret-for-the-fleet"
    async with _pair(tmp_path, [0.0], token=boot) as (a, b):
        info = await a.bridge.create_session()   # no owner
        sid = info.session_id
        mallory = bearer(await mint(a.server, "mallory", "prompt", "read"))
        for x in (a, b):
            load = await x.client.post(f"/session/{sid}/load", json={}, headers=mallory)
            assert load.status_code == 404, (x is b, load.text)
            assert load.json()["code"] == "session_not_found"
        admin = await b.client.post(f"/session/{sid}/load", json={}, headers=bearer(boot))
        assert admin.status_code == 200, admin.text
        assert admin.json()["sessionId"] == sid
        assert b.server.fleet.stats.journal_reads == 2   # type: ignore[union-attr]


def test_session_moved_in_each_doors_shape() -> None:
    from acp_server.acp_http.errors import to_rpc_error
    from acp_server.rest.errors import describe
    from bridge.errors import SessionMovedError

    moved = SessionMovedError("session moved: another instance holds its lease")
    status, body, headers = describe(moved)
    assert (status, body["code"], headers) == (503, "session_moved", {"Retry-After": "1"})
    code, _, data = to_rpc_error(moved)
    assert code == -32603 and data == {"errorKind": "session_moved", "retryable": True,
                                       "retryAfterSeconds": 1}


async def test_a_reader_ahead_of_the_tail_resumes_without_a_resync(tmp_path: Path) -> None:
    """A reader that resumes here from a cursor another instance gave it, while this
    instance's tail of the session lags (no NOTIFY heard yet), gets what follows its
    cursor, not ``state_resync_required``; the lagging readers get the events too."""
    async with _pair(tmp_path, [0.0]) as (a, b):
        sid = await _session(a.client)
        replicas = b.server.fleet.replicas   # type: ignore[union-attr]
        replicas.poll_s = 3600
        b.bridge.journal.store.on_sessions = lambda ids: None   # type: ignore[attr-defined]
        with anyio.fail_after(20):
            async with b.client.stream("GET", f"/session/{sid}/events",
                                       headers={"Last-Event-ID": "0"}) as lagging:
                await wait_until(lambda: replicas.following() == [sid], timeout=20)
                done = await a.client.post(f"/session/{sid}/prompt", json=_prompt("/chunks 2"))
                pid = done.json()["promptId"]
                on_a = await read_events(a.client, sid, _is("turn_complete", pid),
                                         last_event_id=0)   # committed: published after
                last = on_a[-1]["id"]
                resumed = await read_events(b.client, sid,
                                            lambda e: e["type"] == "replay_complete",
                                            last_event_id=last - 1)
                assert [e["type"] for e in resumed] == ["turn_complete", "replay_complete"]
                ids: list[int] = []
                async for line in lagging.aiter_lines():
                    if line.startswith("id: "):
                        ids.append(int(line[4:]))
                        if ids[-1] == last:
                            break
                assert ids == list(range(1, last + 1))


async def test_a_status_from_the_journal_shows_the_running_prompt_and_its_question(
        tmp_path: Path) -> None:
    """b answers a's session's status and pending prompts from the journal: the
    running prompt (and its text), the queued one, the permission it waits for."""
    async with _pair(tmp_path, [0.0]) as (a, b):
        sid = await _session(a.client)
        asking = await a.client.post(f"/session/{sid}/prompt", json=_prompt("/permission"))
        queued = await a.client.post(f"/session/{sid}/prompt", json=_prompt("after"))
        pids = [asking.json()["promptId"], queued.json()["promptId"]]
        await read_events(a.client, sid, lambda e: e["type"] == "permission_request",
                          last_event_id=0)
        mine = a.bridge.session_status(sid)   # a waits for the answer: nothing more
        with anyio.fail_after(20):   # until the journal has it all (a's commits)
            while (status := (await b.client.get(f"/session/{sid}/status")).json())[
                    "lastEventId"] != mine.last_event_id:
                await anyio.sleep(0.02)
        assert status["isWaitingForPermission"] is True
        assert (status["activePromptId"], status["pendingPrompts"], status["queuedPrompts"],
                status["lastEventId"], status["eventEpoch"]) == (
            pids[0], 2, 1, mine.last_event_id, mine.event_epoch)
        pending = (await b.client.get(f"/session/{sid}/pending-prompts")).json()
        assert [(p["promptId"], p["state"], p["text"]) for p in pending["pendingPrompts"]] == [
            (pids[0], "running", "/permission"), (pids[1], "queued", "after")]
        assert b.server.fleet.stats.forwards == 0   # type: ignore[union-attr]


async def test_a_request_forwarded_to_an_owner_that_just_let_go_is_routed_again(
        tmp_path: Path) -> None:
    """c looks the owner up (a), a lets the session go (b adopted it) before the
    forwarded prompt arrives, and answers 404 (a forwarded request is never forwarded
    again): c sees the lease moved and routes the prompt once more, to b: 202. The
    stale lookup is forced (the instant between c's lookup and a's answer)."""
    now = [0.0]
    async with _pair(tmp_path, now) as (a, b), \
            local_server(tmp_path, state_dir=tmp_path / "c", **_flags(tmp_path, now)) as c:
        sid = await _session(a.client)
        leases = c.server.leases
        assert leases is not None
        stale = await c.server.fleet.journal.store._read(lambda conn: leases.owner(conn, sid))
        assert stale is not None and stale.url == a.base_url
        now[0] += 61   # a's lease expired: b adopts, a's next write stops it there
        assert (await b.client.get(f"/session/{sid}/status")).status_code == 200
        assert b.bridge.has_session(sid)
        assert (await a.client.post(f"/session/{sid}/prompt", json=_prompt("x"))
                ).status_code == 503
        await wait_until(lambda: not a.bridge.has_session(sid), timeout=10)
        real, looked = leases.owner, []

        def first_stale(conn: Any, session_id: str) -> Any:
            looked.append(session_id)
            return stale if len(looked) == 1 else real(conn, session_id)

        leases.owner = first_stale   # type: ignore[method-assign]
        accepted = await c.client.post(f"/session/{sid}/prompt", json=_prompt("/chunks 2 z"))
        assert accepted.status_code == 202, accepted.text
        pid = accepted.json()["promptId"]
        frames = await read_events(b.client, sid, _is("turn_complete", pid), last_event_id=0)
        assert frames[-1]["type"] == "turn_complete"
        stats = c.server.fleet.stats
        assert (stats.forwards, stats.forwards_rerouted) == (2, 1)   # to a, then to b
        # without the forced stale lookup, a client sending the marker itself to an
        # instance that does not run the session is served there, as before
        loop = await c.client.get(f"/session/{sid}/pending-prompts",
                                  headers={"x-acp-forwarded-by": "elsewhere"})
        assert loop.status_code == 404


async def test_a_forwarded_request_is_audited_with_the_callers_address(
        tmp_path: Path) -> None:
    """A prompt b forwards to a is recorded in a's audit log with the caller's address
    (b sends it with a proof keyed by the fleet's shared secret), not b's; the same
    headers sent by a client, without a valid proof, change nothing."""
    import httpx

    from tests.principals.helpers import bearer, mint

    async with _pair(tmp_path, [0.0], token="boot-s3cret-for-the-fleet") as (a, b):
        ci = bearer(await mint(a.server, "ci"))
        sid = (await a.client.post("/session", json={"sessionScope": "thread"},
                                   headers=ci)).json()["sessionId"]
        elsewhere = httpx.AsyncHTTPTransport(local_address="127.0.0.9")
        async with httpx.AsyncClient(base_url=b.base_url, transport=elsewhere,
                                     headers=ci) as caller:
            sent = await caller.post(f"/session/{sid}/prompt", json=_prompt("via b"))
            assert sent.status_code == 202, sent.text
        assert b.server.fleet.stats.forwards == 1   # type: ignore[union-attr]
        forged = {**ci, "x-acp-forwarded-by": "b", "x-acp-forwarded-for": "6.6.6.6",
                  "x-acp-forwarded-proof": "0" * 64}
        direct = await a.client.post(f"/session/{sid}/prompt", json=_prompt("forged"),
                                     headers=forged)
        assert direct.status_code == 202, direct.text
        read = await a.client.get("/audit", params={"action": "prompt.accepted"},
                                  headers=bearer("boot-s3cret-for-the-fleet"))
        assert read.status_code == 200, read.text
        assert [r["client"] for r in read.json()["records"]] == ["127.0.0.9", "127.0.0.1"]


async def test_a_setter_goes_to_the_owner(tmp_path: Path) -> None:
    """qwen's setters for a session the other instance runs are forwarded there (a
    write): its agent's mode changes, and the answer comes back as the owner's."""
    now = [0.0]
    async with _pair(tmp_path, now) as (a, b):
        sid = await _session(a.client)
        answer = await b.client.post(f"/session/{sid}/approval-mode", json={"mode": "plan"})
        assert (answer.status_code, answer.json()) == (200, {
            "sessionId": sid, "mode": "plan", "previous": "default", "persisted": False})
        refused = await b.client.post(f"/session/{sid}/approval-mode", json={"mode": "auto"})
        assert (refused.status_code, refused.json()["code"]) == (400, "invalid_approval_mode")
        assert (await a.bridge.agent_state(sid))["modes"]["currentModeId"] == "plan"
        assert not b.bridge.has_session(sid) and b.server.fleet.stats.forwards == 2
        # its event, published by the owner, read here from the journal
        seen = await read_events(b.client, sid, lambda e: e["type"] == "approval_mode_changed",
                                 last_event_id=0)
        assert seen[-1]["data"] == {"sessionId": sid, "previous": "default", "next": "plan",
                                    "persisted": False}


async def test_a_clean_stop_ends_the_streams_read_from_the_journal(tmp_path: Path) -> None:
    """B's drain ends B's readers of a session A runs (served from the journal) as it
    ends those of its own sessions, after what they were given, and opens no new one:
    they resume by cursor, not held open until the HTTP server's grace runs out and
    cut."""
    now = [0.0]
    async with _pair(tmp_path, now) as (a, b):
        sid = await _session(a.client)
        pid = (await a.client.post(f"/session/{sid}/prompt", json=_prompt("/chunks 2 x"))
               ).json()["promptId"]
        await read_events(a.client, sid, _is("turn_complete", pid), last_event_id=0)
        ids: list[int] = []
        ended = anyio.Event()

        async def read() -> None:
            async with b.client.stream("GET", f"/session/{sid}/events",
                                       headers={"Last-Event-ID": "0"}) as response:
                assert response.status_code == 200
                async for line in response.aiter_lines():
                    if line.startswith("id: "):
                        ids.append(int(line[4:]))
            ended.set()

        last = a.bridge.session_status(sid).last_event_id
        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            await wait_until(lambda: bool(ids) and ids[-1] == last)
            await b.server.drain()
            with anyio.fail_after(10):   # a hang bound: the stream ends at once
                await ended.wait()
        assert ids == list(range(1, last + 1))
        late = await b.client.get(f"/session/{sid}/events", headers={"Last-Event-ID": "0"})
        assert late.status_code == 503, late.text
