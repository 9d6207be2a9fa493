"""The session journal is bounded in bytes per session (issue #23): once a quarter of
``max_session_bytes`` of events was journaled since the last trim, the oldest events
go until the rest fit; the newest always stays, so the ids go on after a restart. The
bound holds across restarts (the count is seeded at restore: a session that journals
less than a quarter of it a run is trimmed too), and a settled prompt's row keeps its
terminal, not its body (a prompt sent again under its id, ``/load`` and the restore
read only that); a prompt not settled keeps its body, for the restore."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from acp_server.store.leases import SessionLeases
from acp_server.store.postgres import PostgresTaskStore
from acp_server.store.sessions import StoreSessionJournal
from acp_server.store.sqlite import SqliteTaskStore
from acp_server.store.writer import Op
from bridge import events as ev
from bridge import wire
from bridge.journal import EventRecord, PromptAccepted, PromptSettled, SessionOpened
from tests.harness import local_server
from tests.lmsp import stores
from tests.store.faults import faulty
from tests.store.test_journal_refusals import _run_sql, _settings
from tests.store.test_session_restart import _is, read_events

pytestmark = pytest.mark.anyio

LIMIT = 8192


def _event(sid: str, n: int, size: int) -> EventRecord:
    event = ev.Event(n, ev.SESSION_UPDATE, {"sessionId": sid, "update": {
        "sessionUpdate": "agent_message_chunk",
        "content": {"type": "text", "text": "x" * size}}}, prompt_id="p")
    return EventRecord(session_id=sid, event_id=n, type=event.type, prompt_id="p",
                       envelope=wire.envelope(event))


async def test_a_session_journal_is_bounded_in_bytes(tmp_path: Path, store_name: str) -> None:
    store = faulty(tmp_path)
    async with store, StoreSessionJournal(store, max_session_bytes=LIMIT) as journal:
        journal.append(SessionOpened(session_id="big", agent="a", cwd="/", created_at=1.0,
                                     epoch="e"))
        journal.append(SessionOpened(session_id="small", agent="a", cwd="/", created_at=2.0,
                                     epoch="e"))
        seq = 0
        for n in range(1, 41):   # 40 events of ~1 KiB: five times the bound
            seq = journal.append(_event("big", n, 1000))
            if n <= 3:
                seq = journal.append(_event("small", n, 10))
            await journal.wait(seq)   # one commit each: the trim runs as they come
        restored = {found.record.session_id: found for found in await journal.restore()}
        big, small = restored["big"], restored["small"]
        assert [e.id for e in small.events] == [1, 2, 3]   # another session's are untouched
        assert big.last_event_id == 40 and not big.gap
        assert sum(e.size for e in big.events) <= LIMIT + LIMIT // 4   # plus since the trim
        assert [e.id for e in big.events] == list(range(big.events[0].id, 41))   # no hole
        assert big.events[0].id > 25   # the oldest went
        seq = journal.append(_event("big", 41, 3 * LIMIT))   # one event past the bound
        await journal.wait(seq)
        big = next(f for f in await journal.restore() if f.record.session_id == "big")
    assert [e.id for e in big.events] == [41]   # alone, but kept: the ids go on from it
    assert big.last_event_id == 41


async def test_a_commit_run_twice_counts_its_bytes_once(tmp_path: Path) -> None:
    """A batch whose other operation fails is rolled back and run again with savepoints:
    the journal's commit runs twice, its envelopes count once towards the next byte
    trim (planned as the commit starts, counted when it lands), and a trim planned for
    it runs in the transaction that lands."""
    def boom(conn: Any, out: Any, *state: Any) -> None:
        raise ValueError("this operation's own error")

    async with SqliteTaskStore(str(tmp_path / "store.db")) as store, \
            StoreSessionJournal(store, max_session_bytes=LIMIT) as journal:
        journal.append(SessionOpened(session_id="s1", agent="a", cwd="/", created_at=1.0,
                                     epoch="e"))
        records = [_event("s1", n, 100) for n in range(1, 6)]
        seq = 0
        for record in records:
            seq = journal.append(record)
        failing = Op(boom)
        assert store.submit(failing)   # the same batch as the journal's commit
        await journal.wait(seq)
        await failing.done.wait()
        assert isinstance(failing.error, ValueError)
        assert journal.commits == 1
        assert journal._unsized == {"s1": sum(len(r.envelope) for r in records)}
        for n in range(6, 41):   # past a quarter of the bound: trimmed, the count restarts
            seq = journal.append(_event("s1", n, 100))
        failing = Op(boom)
        assert store.submit(failing)
        await journal.wait(seq)
        await failing.done.wait()
        assert journal._unsized == {}
        [found] = await journal.restore()
    assert sum(e.size for e in found.events) <= LIMIT
    assert [e.id for e in found.events] == list(range(found.events[0].id, 41))


def _store(tmp_path: Path, store_name: str) -> tuple[Any, str | None]:
    """The test's store, opened anew on the same database each time: a restart (the
    same instance: its state dir keeps its id)."""
    (tmp_path / "state").mkdir(exist_ok=True)
    if store_name == "postgres":
        url = stores.postgres_url_for(tmp_path, "journal")
        return PostgresTaskStore(url, lease_s=stores.TEST_LEASE_S, renew_s=stores.TEST_RENEW_S,
                                 poll_s=stores.TEST_POLL_S,
                                 state_dir=str(tmp_path / "state")), url
    return SqliteTaskStore(str(tmp_path / "state" / "lmsp.sqlite3")), None


def _sizes(tmp_path: Path, store_name: str, url: str | None, sid: str) -> tuple[int, int]:
    """(the session's envelope bytes, its prompt rows' record bytes) on disk."""
    [(events,)] = _run_sql(tmp_path, store_name, url, "SELECT COALESCE(SUM(size), 0) "
                           "FROM session_segments WHERE session_id = ?", (sid,))
    [(prompts,)] = _run_sql(tmp_path, store_name, url, "SELECT COALESCE(SUM(LENGTH(record)), "
                            "0) FROM session_prompts WHERE session_id = ?", (sid,))
    return int(events), int(prompts)


@pytest.mark.parametrize("leased", [False, True], ids=["alone", "leased"])
async def test_the_byte_bound_holds_across_restarts(tmp_path: Path, store_name: str,
                                                    leased: bool) -> None:
    """Each run journals less than a quarter of the bound and stops (its count in
    memory is gone, as after ``kill -9``): the next run's restore seeds it from the
    store, so the events on disk never pass 1.25 × the bound (they grew by a run's
    worth for ever before). A session under the bound is not trimmed at the restore."""
    if leased and store_name != "postgres":
        pytest.skip("leases are PostgreSQL's")
    last, per_run = 0, 0
    for run in range(12):   # 12 runs of ~1.5 KiB: over twice the bound in all
        store, url = _store(tmp_path, store_name)
        leases = SessionLeases(store.instance, ttl_s=60) if leased else None
        async with store, StoreSessionJournal(store, max_session_bytes=LIMIT,
                                              leases=leases) as journal:
            found = {f.record.session_id: f for f in await journal.restore()}
            if run == 0:
                journal.append(SessionOpened(session_id="s", agent="a", cwd="/",
                                             created_at=1.0, epoch="e"))
            else:
                assert found["s"].last_event_id == last and not found["s"].gap
            for n in range(last + 1, last + 4):   # 3 x ~500 B, one commit each
                await journal.wait(journal.append(_event("s", n, 400)))
            last += 3
            events, _ = _sizes(tmp_path, store_name, url, "s")
            per_run = per_run or events
            assert events <= LIMIT + LIMIT // 4, f"run {run}: {events} bytes"
            assert per_run * 4 < LIMIT   # each run alone is never due a trim
    assert events > LIMIT - per_run   # trimmed to the bound, not below it
    restored = {f.record.session_id: f for f in await _restored(tmp_path, store_name)}
    ids = [e.id for e in restored["s"].events]
    assert ids == list(range(ids[0], last + 1)) and ids[0] > 1


async def _restored(tmp_path: Path, store_name: str) -> list[Any]:
    store, _ = _store(tmp_path, store_name)
    async with store, StoreSessionJournal(store, max_session_bytes=LIMIT) as journal:
        return await journal.restore()


def _accepted(pid: str, seq: int, size: int) -> PromptAccepted:
    return PromptAccepted(session_id="s", prompt_id=pid, seq=seq, queued_at_ms=seq,
                          prompt=[{"type": "text", "text": pid * size}],
                          last_event_id=seq, epoch="e")


def _settled(pid: str, at: int) -> PromptSettled:
    return PromptSettled(session_id="s", prompt_id=pid, terminal="completed", at=at,
                         stop_reason="end_turn")


async def test_a_settled_prompt_keeps_its_terminal_not_its_body(tmp_path: Path,
                                                                store_name: str) -> None:
    """Its row's body is dropped in the commit that settles it (also when it was
    accepted in that commit); a prompt not settled keeps its body, and both come back
    from a restart as they were: a terminal, a prompt to run."""
    body = 100_000
    store, url = _store(tmp_path, store_name)
    async with store, StoreSessionJournal(store) as journal:
        journal.append(SessionOpened(session_id="s", agent="a", cwd="/", created_at=1.0,
                                     epoch="e"))
        await journal.wait(journal.append(_accepted("a", 1, body)))
        assert _sizes(tmp_path, store_name, url, "s")[1] > body   # accepted: kept
        journal.append(_settled("a", 10))
        journal.append(_accepted("b", 2, body))   # accepted and settled in one commit
        journal.append(_settled("b", 11))
        await journal.wait(journal.append(_accepted("c", 3, body)))   # still pending
        prompts = _sizes(tmp_path, store_name, url, "s")[1]
        assert body < prompts < body + 200   # c's body; a's and b's are gone
        rows = _run_sql(tmp_path, store_name, url, "SELECT prompt_id, LENGTH(record) FROM "
                        "session_prompts WHERE session_id = 's' ORDER BY prompt_id")
        assert [(pid, int(size) > body) for pid, size in rows] == [
            ("a", False), ("b", False), ("c", True)]
    [found] = await _restored(tmp_path, store_name)
    assert [(t.prompt_id, t.terminal, t.at, t.stop_reason) for t in found.terminals] == [
        ("a", "completed", 10, "end_turn"), ("b", "completed", 11, "end_turn")]
    assert found.unsettled == [_accepted("c", 3, body)]   # whole: it runs after a restart


async def test_a_prompt_sent_again_after_a_restart_is_answered_without_its_body(
        tmp_path: Path, store_name: str) -> None:
    """The audit's case: prompts of a large body under the client's ids. Their rows keep
    no body once settled, and after a restart each id sent again is answered with its
    terminal (200, never run again), as ``/load``'s ``promptTerminals`` lists it."""
    text = "/chunks 1 " + "x" * 300_000
    settings = _settings(tmp_path, store_name)
    url = settings.get("store")
    async with local_server(tmp_path, **settings) as srv:
        client = srv.client
        sid = (await client.post("/session", json={"sessionScope": "thread"})).json()[
            "sessionId"]
        after = 0
        for n in range(3):
            answer = await client.post(f"/session/{sid}/prompt", json={
                "prompt": [{"type": "text", "text": text}], "promptId": f"big-{n}"})
            assert answer.status_code == 202, answer.text
            seen = await read_events(client, sid, _is("turn_complete", f"big-{n}"),
                                     last_event_id=after)
            after = seen[-1]["id"]
    assert _sizes(tmp_path, store_name, url, sid)[1] < 1000   # three terminals, no body
    async with local_server(tmp_path, **settings) as srv:
        client = srv.client
        loaded = (await client.post(f"/session/{sid}/load", json={})).json()
        assert [(t["promptId"], t["terminal"]) for t in loaded["promptTerminals"]] == [
            (f"big-{n}", "completed") for n in range(3)]
        for n in range(3):
            again = await client.post(f"/session/{sid}/prompt", json={
                "prompt": [{"type": "text", "text": text}], "promptId": f"big-{n}"})
            assert again.status_code == 200, again.text
            assert again.headers["idempotent-replayed"] == "true"
            assert again.json()["terminal"] == "completed"
        assert srv.bridge.session_status(sid).last_event_id == after   # nothing ran
