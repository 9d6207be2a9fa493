"""Faults at the seams of sessions across instances (helper-47's review), on a real
PostgreSQL store:

* a hand-off whose journal commit has not landed (a store blip, its retry backing off)
  answers busy, and hands the session over only once the commit landed: the records
  of its last prompt are never refused and lost;
* an adoption that took the lease and could not read the session back lets the lease
  expire again (never renewed here for a session that runs nowhere), and raises the
  store's fault;
* a store that refuses writes while a session's owner is gone is a retryable 503 on
  the instance that would adopt it, never a 404 for a session that exists;
* the sessions an instance lost stay fenced, at most ``MAX_LOST`` of them.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import anyio.lowlevel
import psycopg
import pytest

from acp_server.fleet.adoption import Fleet
from acp_server.fleet.handoff import HandOffs
from acp_server.store.errors import StoreUnavailableError
from acp_server.store.leases import SessionLeases
from acp_server.store.postgres import PostgresTaskStore
from acp_server.store.sessions import LOST, MAX_LOST, StoreSessionJournal
from bridge.journal import PromptAccepted, PromptSettled, SessionOpened
from tests.instances.test_forward_adopt import _pair
from tests.instances.test_leases import _session
from tests.lmsp import stores
from tests.store.test_session_restart import _prompt

pytestmark = pytest.mark.anyio


class IdleBridge:
    """What ``HandOffs`` and ``Fleet`` ask of the bridge: one idle session, live here
    (``live``) or not."""

    def __init__(self, live: bool = True) -> None:
        self.live = live
        self.moved: list[str] = []

    def has_session(self, sid: str) -> bool:
        return self.live

    def session_status(self, sid: str) -> Any:
        return SimpleNamespace(pending_prompts=0, pending_permissions=0)

    def settled_pending(self, sid: str) -> int:
        return 0

    def sessions_moved(self, sids: list[str]) -> None:
        self.moved += sids


async def wait_store_queued(store: Any, found: list[Any]) -> None:
    """Until the store's writers took the adoption's write, or have it queued."""
    with anyio.fail_after(10):
        while not found and store._send.statistics().current_buffer_used == 0:
            await anyio.lowlevel.checkpoint()


def _opened(sid: str) -> SessionOpened:
    return SessionOpened(session_id=sid, agent="a", cwd="/", created_at=1.0, epoch="e1")


async def test_a_hand_off_waits_for_the_commit_of_what_it_journaled(tmp_path: Path) -> None:
    url = stores.postgres_url_or_skip(tmp_path, "hoff")
    async with PostgresTaskStore(url) as store:
        leases = SessionLeases(store.instance, ttl_s=8, renew_s=2)
        async with StoreSessionJournal(store, leases=leases) as journal:
            sid = "sess-1"
            journal.append(_opened(sid))
            await journal.wait(journal.append(PromptAccepted(
                session_id=sid, prompt_id="p1", prompt=[], queued_at_ms=1, seq=1)))
            token = journal.fence[sid]
            real, failing = journal._commit_in, [True]

            def commit_in(conn: Any, out: Any, *state: Any) -> Any:
                if failing[0]:
                    raise psycopg.OperationalError("server closed the connection")
                return real(conn, out, *state)

            journal._commit_in = commit_in   # type: ignore[method-assign]
            journal.append(PromptSettled(session_id=sid, prompt_id="p1",
                                         terminal="completed", at=2))
            with anyio.fail_after(10):
                while not journal._failing:
                    await anyio.sleep(0.01)
            bridge = IdleBridge()
            handoffs = HandOffs(bridge, journal, wait_s=0.2)   # type: ignore[arg-type]
            assert await handoffs._let_go(sid, "bbbbbbbbbbbb") is False   # busy
            assert journal.fence[sid] == token and not bridge.moved
            failing[0] = False   # the store is back: the retry lands the terminal
            with anyio.fail_after(15):
                await journal.wait(journal.appended)
            handoffs.wait_s = 5
            assert await handoffs._let_go(sid, "bbbbbbbbbbbb") is True
            assert journal.fence[sid] == LOST and bridge.moved == [sid]
    with psycopg.connect(url, autocommit=True) as db:
        terminal = db.execute("SELECT terminal FROM session_prompts WHERE session_id = %s "
                              "AND prompt_id = 'p1'", (sid,)).fetchone()
        lease = db.execute("SELECT instance FROM session_leases WHERE session_id = %s",
                           (sid,)).fetchone()
    assert terminal is not None and terminal[0] is not None   # nothing was lost
    assert lease == ("bbbbbbbbbbbb",)


async def test_an_adoption_that_cannot_read_the_session_lets_its_lease_go(
        tmp_path: Path) -> None:
    url = stores.postgres_url_or_skip(tmp_path, "adopt")
    a_store, b_store = PostgresTaskStore(url), PostgresTaskStore(url)
    async with a_store, b_store:
        b_leases = SessionLeases(b_store.instance, ttl_s=8, renew_s=0.2)
        async with StoreSessionJournal(b_store, leases=b_leases) as b:
            async with StoreSessionJournal(
                    a_store, leases=SessionLeases(a_store.instance, ttl_s=8)) as a:
                sid = "sess-orphan"
                a.append(_opened(sid))
                await a.wait(a.append(PromptAccepted(session_id=sid, prompt_id="p1",
                                                     prompt=[], queued_at_ms=1, seq=1)))
            # a stopped (its clean stop let its leases expire): b adopts, its read fails
            fleet = Fleet(IdleBridge(live=False), b, forwarder=None)  # type: ignore[arg-type]
            real_read, calls = b_store._read, [0]

            async def flaky_read(fn: Any) -> Any:
                calls[0] += 1
                if calls[0] == 1:
                    raise StoreUnavailableError("PostgreSQL: a blip")
                return await real_read(fn)

            b_store._read = flaky_read   # type: ignore[method-assign]
            with pytest.raises(StoreUnavailableError):
                await fleet.adopt(sid)
            b_store._read = real_read   # type: ignore[method-assign]
            assert b.fence[sid] == LOST   # nothing of it is written here
            await b.renew()               # b's renewal does not keep it alive
            expired = await b_store._read(lambda conn: b_leases.expired(conn))
            assert expired == [sid]       # the next sweep, anywhere, adopts it


async def test_a_store_that_refuses_writes_is_a_503_not_a_404(tmp_path: Path) -> None:
    now = [0.0]
    async with _pair(tmp_path, now) as (a, b):
        sid = await _session(a.client)
        now[0] += 61   # a's lease expired: b would adopt the session

        def refused(conn: Any, session_id: str) -> Any:
            raise psycopg.errors.ReadOnlySqlTransaction(
                "cannot execute INSERT in a read-only transaction")

        b.server.fleet.journal.leases.adopt = refused   # type: ignore[union-attr]
        status = await b.client.get(f"/session/{sid}/status")
        prompt = await b.client.post(f"/session/{sid}/prompt", json=_prompt("hi"))
        for answer in (status, prompt):
            assert answer.status_code == 503, answer.text
            assert answer.json()["code"] == "store_unavailable"
            assert answer.headers["retry-after"]


async def test_the_lost_sessions_kept_fenced_are_bounded() -> None:
    journal = StoreSessionJournal.__new__(StoreSessionJournal)
    journal.fence, journal._lost = {"live": 3}, {}
    for n in range(MAX_LOST + 10):
        journal.lose(f"s{n}")
    assert len(journal.fence) == MAX_LOST + 1 and journal.fence["live"] == 3
    assert "s0" not in journal.fence and journal.fence[f"s{MAX_LOST + 9}"] == LOST
    journal.lose("s20")   # lost again: now the newest
    journal.fence["s20"] = 7   # (adopted back meanwhile: not forgotten with the lost)
    for n in range(MAX_LOST):
        journal.lose(f"t{n}")
    assert journal.fence["s20"] == 7


async def test_a_load_of_a_session_it_could_not_adopt_is_retried_not_made_anew(
        tmp_path: Path) -> None:
    now = [0.0]
    async with _pair(tmp_path, now) as (a, b):
        sid = await _session(a.client)
        now[0] += 61   # a's lease expired; b's adoption comes back empty (lost a race)

        async def lost_the_race(session_id: str) -> Any:
            return None

        b.server.fleet.journal.adopt = lost_the_race   # type: ignore[union-attr,method-assign]
        loaded = await b.client.post(f"/session/{sid}/load", json={})
        assert loaded.status_code == 503, loaded.text
        assert loaded.json()["code"] == "session_busy_elsewhere"
        assert not b.bridge.has_session(sid)   # nothing made anew over its journal


async def test_a_load_racing_the_close_of_its_session_is_a_cold_load(tmp_path: Path) -> None:
    """The race the ACP TypeScript SDK met through HAProxy: a load of a session its own
    instance is closing reads the session's lease, then the close commits (closed, the
    lease gone with it), then the adoption finds no live session. That is a load of a
    closed session, as without the race, not ``session_busy_elsewhere``."""
    now = [0.0]
    async with _pair(tmp_path, now) as (a, _):
        sid = await _session(a.client)
        accepted = await a.client.post(f"/session/{sid}/prompt", json=_prompt("before"))
        assert accepted.status_code == 202
        fleet = a.server.fleet
        assert fleet is not None
        leases = fleet.leases
        store = fleet.journal.store
        before = await store._read(lambda conn: leases.owner(conn, sid))
        assert before is not None and before.instance == leases.instance and before.live
        await a.bridge.close_session(sid)   # then committed: closed, its lease deleted
        with anyio.fail_after(10):
            while await store._read(lambda conn: leases.owner(conn, sid)) is not None:
                await anyio.sleep(0.01)
        owner = leases.owner
        reads = []

        def read_before_the_close(conn: Any, session_id: str) -> Any:
            reads.append(session_id)
            return before if len(reads) == 1 else owner(conn, session_id)

        leases.owner = read_before_the_close   # type: ignore[method-assign]
        await fleet.claim(sid)   # no SessionBusyElsewhereError
        assert len(reads) == 2
        leases.owner = owner   # type: ignore[method-assign]
        loaded = await a.client.post(f"/session/{sid}/load", json={})
        assert loaded.status_code == 200, loaded.text


async def test_a_session_ended_here_is_not_adopted_back_before_its_end_commits(
        tmp_path: Path) -> None:
    """A session this instance just ended (its agent died) whose end record waits behind
    a commit in flight: a request for it (its lease still this instance's, the session
    not live here) must not adopt it back from the journal, where it still looks live.
    Found by ``tests/store/test_reseed.py`` on a loaded CI machine: the session came
    back live after its agent's death, and answered 200 for good."""
    import threading

    from bridge.journal import EventRecord, SessionEnded

    url = stores.postgres_url_or_skip(tmp_path, "ended")
    async with PostgresTaskStore(url) as store:
        leases = SessionLeases(store.instance, ttl_s=8, renew_s=2)
        async with StoreSessionJournal(store, leases=leases) as journal:
            sid = "sess-ended"
            await journal.wait(journal.append(_opened(sid)))
            real, entered, release = journal._commit_in, threading.Event(), threading.Event()

            def held(conn: Any, out: Any, *state: Any) -> Any:
                entered.set()
                release.wait(20)
                return real(conn, out, *state)

            journal._commit_in = held   # type: ignore[method-assign]
            journal.append(EventRecord(session_id=sid, event_id=1, type="session_update",
                                       prompt_id=None, envelope=b"{}", epoch="e1"))
            with anyio.fail_after(10):   # that commit is in flight, held
                while not entered.is_set():
                    await anyio.sleep(0.01)
            journal.append(SessionEnded(session_id=sid, at=time.time()))   # the next one
            fleet = Fleet(IdleBridge(live=False), journal, forwarder=None)  # type: ignore[arg-type]
            found: list[Any] = []
            real_adopt, real_wait, asked = journal.adopt, journal.wait, anyio.Event()
            adopting: list[bool] = []

            async def adopt_seen(session_id: str) -> Any:
                adopting.append(True)
                asked.set()
                found.append(await real_adopt(session_id))
                return found[-1]

            async def wait_seen(seq: int, **kw: Any) -> None:
                asked.set()   # the adoption waits for what was journaled first
                await real_wait(seq, **kw)

            journal.adopt = adopt_seen   # type: ignore[method-assign]
            journal.wait = wait_seen   # type: ignore[method-assign]
            async with anyio.create_task_group() as tg:
                tg.start_soon(fleet.adopt, sid)
                with anyio.fail_after(10):
                    await asked.wait()
                if adopting:   # straight to its own write: taken, or queued, first
                    await wait_store_queued(store, found)
                release.set()
            journal._commit_in = real   # type: ignore[method-assign]
    assert found == [None]   # not taken back: its end committed first
