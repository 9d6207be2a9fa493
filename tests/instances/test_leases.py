"""Session leases on a shared PostgreSQL store (issue #24), in process, the store's
clock moved by an injected offset: a session's lease is taken with its record, renewed
in one statement, and a take-over by another instance fences the old owner: its next
write is refused by the
store (nothing of it lands), and it stops the session at once (its readers' streams end,
its prompts fail with ``session_moved``). On SQLite leases are a no-op. The
``SessionLeases`` SQL itself: open, stale, renew, adopt, expired, owner, hand_over."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import psycopg
import pytest

from acp_server.store.leases import SessionLeases
from acp_server.store.sessions import LOST
from tests.harness import local_server
from tests.lmsp import stores
from tests.store.test_session_restart import _prompt, read_events
from tests.store.segment_rows import stored_events

pytestmark = pytest.mark.anyio


@pytest.fixture
def pg_url(tmp_path: Path) -> str:
    return stores.postgres_url_or_skip(tmp_path, "leases")


@pytest.fixture
def db(pg_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        yield conn


def _lease(db: psycopg.Connection[Any], sid: str) -> tuple[str, int, float] | None:
    """(instance, token, seconds until it expires on the store's clock; 0 for a lease
    released at once)."""
    row = db.execute("SELECT instance, token, expires_at, expires_at - "
                     "extract(epoch FROM clock_timestamp())::float8 FROM session_leases "
                     "WHERE session_id = %s", (sid,)).fetchone()
    if row is None:
        return None
    return row[0], row[1], 0 if row[2] == 0 else row[3]


class Leased:
    """A lease written after ``mark`` (``time.monotonic()`` taken before the write) for
    ``ttl`` seconds (the injected offset included): it compares equal to a ``_lease``
    whose seconds left are between ``ttl`` less the wall time since the mark and ``ttl``
    (half a second either side), so a loaded machine's delays never fail the check."""

    def __init__(self, instance: str, token: int, ttl: float, mark: float) -> None:
        self.instance, self.token, self.ttl, self.mark = instance, token, ttl, mark

    def __eq__(self, lease: object) -> bool:
        if not isinstance(lease, tuple):
            return NotImplemented
        waited = time.monotonic() - self.mark
        return (lease[:2] == (self.instance, self.token)
                and self.ttl - waited - 0.5 <= lease[2] <= self.ttl + 0.5)

    def __repr__(self) -> str:
        return f"Leased({self.instance!r}, {self.token}, {self.ttl} less the wait since the mark)"


def _take_over(db: psycopg.Connection[Any], sid: str) -> None:
    """What another instance's adoption does to the lease row."""
    db.execute("UPDATE session_leases SET instance = 'elsewhere', token = token + 1 "
               "WHERE session_id = %s", (sid,))


def _event_count(db: psycopg.Connection[Any], sid: str) -> int:
    return len(stored_events(db.execute, sid, "%s"))


async def _session(client: httpx.AsyncClient) -> str:
    created = await client.post("/session", json={"sessionScope": "thread"})
    assert created.status_code == 200, created.text
    return str(created.json()["sessionId"])


async def test_a_taken_over_session_is_fenced_and_stopped_here(
        tmp_path: Path, pg_url: str, db: psycopg.Connection[Any]) -> None:
    now = [0.0]
    async with local_server(tmp_path, store=pg_url, lease_offset=lambda: now[0],
                            session_lease_ttl_ms=8000, session_lease_renew_ms=2000) as srv:
        leases = srv.server.leases
        assert leases is not None
        journal: Any = srv.bridge.journal
        mark = time.monotonic()
        sid = await _session(srv.client)
        assert _lease(db, sid) == Leased(leases.instance, 1, now[0] + 8, mark)   # with its record
        accepted = await srv.client.post(f"/session/{sid}/prompt", json=_prompt("/chunks 2 a"))
        assert accepted.status_code == 202
        await read_events(srv.client, sid, lambda e: e["type"] == "turn_complete",
                          last_event_id=0)
        now[0] += 5
        renewed = time.monotonic()
        assert await journal.renew() == set()
        assert _lease(db, sid) == Leased(leases.instance, 1, now[0] + 8, renewed)
        row = db.execute("SELECT url FROM instances WHERE id = %s",
                         (leases.instance,)).fetchone()
        assert row == (srv.base_url,)   # the registry: where this instance is reached

        written = _event_count(db, sid)
        frames: list[dict[str, Any]] = []

        async def reader() -> None:
            frames.extend(await read_events(srv.client, sid, lambda e: False,
                                            last_event_id=written))

        bus = srv.bridge.get_session(sid).bus
        earlier = list(bus._subscribers)   # the first reader's, until its close is seen
        async with anyio.create_task_group() as tg:
            tg.start_soon(reader)
            # the reader attached before the take-over (its GET could reach the server
            # after the stop, on another connection than the prompt's: then served
            # from the journal as any session of another instance's, and not ended)
            with anyio.fail_after(30):
                while not any(s not in earlier for s in bus._subscribers):
                    await anyio.sleep(0.01)
            _take_over(db, sid)
            refused = await srv.client.post(f"/session/{sid}/prompt", json=_prompt("late"))
            assert refused.status_code == 503   # its record was refused: not accepted
            assert refused.headers["retry-after"]   # a retry reaches the new owner
            with anyio.fail_after(10):
                while srv.bridge.has_session(sid):   # stopped here at once
                    await anyio.sleep(0.01)
        assert [f["type"] for f in frames if f.get("id") is not None] == []  # nothing more
        assert _event_count(db, sid) == written   # nothing of it landed
        assert journal.fence[sid] == LOST
        assert srv.bridge.moved_sessions == 1
        assert _lease(db, sid) == Leased("elsewhere", 2, now[0] + 8, renewed)


async def test_a_renewal_finds_a_lost_lease_and_stops_the_session(
        tmp_path: Path, pg_url: str, db: psycopg.Connection[Any]) -> None:
    now = [0.0]
    async with local_server(tmp_path, store=pg_url, lease_offset=lambda: now[0]) as srv:
        journal: Any = srv.bridge.journal
        kept, lost = await _session(srv.client), await _session(srv.client)
        running = await srv.client.post(f"/session/{lost}/prompt", json=_prompt("/sleep 60s"))
        assert running.status_code == 202
        pid = running.json()["promptId"]
        await read_events(srv.client, lost, lambda e: e["type"] == "session_update"
                          and e.get("promptId") == pid, last_event_id=0)   # it sleeps now
        session = srv.bridge.get_session(lost)
        _take_over(db, lost)
        assert await journal.renew() == {lost}
        assert not srv.bridge.has_session(lost) and srv.bridge.has_session(kept)
        assert not session.pending   # its prompt failed here (the new owner decides)
        assert journal.fence[lost] == LOST and journal.fence[kept] == 1


async def test_a_refused_record_does_not_fail_a_later_adoption(
        tmp_path: Path, pg_url: str, db: psycopg.Connection[Any]) -> None:
    """The last record this instance journaled was refused (a prompt for a session
    another instance took over: its caller got 503 ``session_moved``). An adoption
    after it waits for what this instance journaled so far (``wait_through``), not for
    that record's fate: the session whose lease expired is adopted, and a hand-off
    asked of this instance is not failed by it either. It was: every adoption and
    load of a session live elsewhere answered ``session_moved`` until this instance
    journaled something else (test_three_instances' hand-off under load)."""
    now = [0.0]
    async with local_server(tmp_path, store=pg_url, lease_offset=lambda: now[0]) as srv:
        journal: Any = srv.bridge.journal
        fleet: Any = srv.server.fleet
        taken, orphan = await _session(srv.client), await _session(srv.client)
        # the orphan's owner died elsewhere: its lease there, expired
        db.execute("UPDATE session_leases SET instance = 'elsewhere', token = token + 1, "
                   "expires_at = 0 WHERE session_id = %s", (orphan,))
        assert await journal.renew() == {orphan}   # stopped here: not live here any more
        _take_over(db, taken)
        refused = await srv.client.post(f"/session/{taken}/prompt", json=_prompt("late"))
        assert refused.status_code == 503 and refused.json()["code"] == "session_moved"
        await journal.wait_through(journal.appended)   # the barrier: not that record's
        assert await fleet.adopt(orphan) is True
        assert srv.bridge.has_session(orphan)
        assert _lease(db, orphan)[:2] == (srv.server.leases.instance, 3)   # type: ignore


async def test_a_clean_stop_releases_the_leases_and_the_next_start_takes_them_back(
        tmp_path: Path, pg_url: str, db: psycopg.Connection[Any]) -> None:
    now = [0.0]
    settings: dict[str, Any] = {"store": pg_url, "lease_offset": lambda: now[0]}
    async with local_server(tmp_path, **settings) as srv:
        sid = await _session(srv.client)
        instance = srv.server.leases.instance   # type: ignore[union-attr]
    assert _lease(db, sid) == (instance, 1, 0)   # expired at once: others may adopt
    mark = time.monotonic()
    async with local_server(tmp_path, **settings) as srv:
        assert srv.bridge.has_session(sid)
        assert _lease(db, sid) == Leased(instance, 2, now[0] + 8, mark)   # token + 1
        assert (await srv.client.delete(f"/session/{sid}")).status_code == 204
        with anyio.fail_after(10):
            while _lease(db, sid) is not None:   # a closed session has no lease
                await anyio.sleep(0.01)


async def test_on_sqlite_leases_are_a_no_op(tmp_path: Path) -> None:
    async with local_server(tmp_path) as srv:
        sid = await _session(srv.client)
        assert srv.server.leases is None
        assert srv.bridge.journal.fence == {}   # type: ignore[attr-defined]
        accepted = await srv.client.post(f"/session/{sid}/prompt", json=_prompt("hi"))
        assert accepted.status_code == 202


def test_the_lease_sql(pg_url: str, db: psycopg.Connection[Any]) -> None:
    from acp_server.store.schema import migrate_postgres

    migrate_postgres(db)
    now = [0.0]
    a = SessionLeases("aaaa", ttl_s=8, offset=lambda: now[0], url="http://a:1")
    b = SessionLeases("bbbb", ttl_s=8, offset=lambda: now[0], url="http://b:2")
    db.execute("INSERT INTO sessions(id, created_at, record) VALUES ('s1', 1, '\\x00')")
    assert a.open(db, "s1") == 1
    assert a.open(db, "s1") == 1            # ours already: the token stays
    assert b.open(db, "s1") is None         # a live lease elsewhere
    assert b.adopt(db, "s1") is None
    assert a.stale(db, {"s1": 1}) == set() and a.stale(db, {"s1": 0}) == {"s1"}
    assert b.expired(db) == []
    now[0] += 9                              # past the TTL, unrenewed
    assert b.expired(db) == ["s1"]
    b.heartbeat(db)
    owner = b.owner(db, "s1")
    assert owner is not None and (owner.instance, owner.live) == ("aaaa", False)
    assert b.adopt(db, "s1") == 2            # taken over: token + 1
    assert a.stale(db, {"s1": 1}) == {"s1"}  # the old owner is fenced
    assert a.renew(db, {"s1": 1}) == {"s1"}  # and finds out at its renewal
    assert b.renew(db, {"s1": 2}) == set()
    owner = a.owner(db, "s1")
    assert owner is not None and (owner.instance, owner.url, owner.live) == (
        "bbbb", "http://b:2", True)
    assert db.execute("SELECT owner FROM sessions WHERE id = 's1'").fetchone() == ("bbbb",)


def test_the_hand_over_sql(pg_url: str, db: psycopg.Connection[Any]) -> None:
    """A hand-off names the asker in the lease, live for a TTL, fenced by the giver's
    token (a stale one gives nothing), keeping the token; the asker adopts it (+ 1)."""
    from acp_server.store.schema import migrate_postgres

    migrate_postgres(db)
    now = [0.0]
    a = SessionLeases("aaaa", ttl_s=8, offset=lambda: now[0])
    b = SessionLeases("bbbb", ttl_s=8, offset=lambda: now[0])
    db.execute("INSERT INTO sessions(id, created_at, record) VALUES ('s1', 1, '\\x00')")
    assert a.open(db, "s1") == 1
    assert b.hand_over(db, "s1", 1, "cccc") is False   # not b's to give
    assert a.hand_over(db, "s1", 0, "bbbb") is False   # a stale token gives nothing
    now[0] += 5
    mark = time.monotonic()
    assert a.hand_over(db, "s1", 1, "bbbb") is True
    assert _lease(db, "s1") == Leased("bbbb", 1, now[0] + 8, mark)   # live for a TTL, token kept
    assert a.stale(db, {"s1": 1}) == {"s1"}   # the giver is fenced at once
    assert a.hand_over(db, "s1", 1, "aaaa") is False   # given once
    assert b.adopt(db, "s1") == 2   # the asker adopts it: token + 1
    assert db.execute("SELECT owner FROM sessions WHERE id = 's1'").fetchone() == ("bbbb",)


def test_skewed_instance_clocks_do_not_matter(pg_url: str, db: psycopg.Connection[Any],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Expiry is on the store's clock: an instance whose own clock runs an hour ahead
    neither steals a live lease nor, holding one, keeps it past the TTL; one an hour
    behind is not seen as dead by the others."""
    import time

    from acp_server.store.schema import migrate_postgres

    migrate_postgres(db)
    real = time.time
    skew = [0.0]
    monkeypatch.setattr(time, "time", lambda: real() + skew[0])
    now = [0.0]   # the store's clock, moved for every instance alike
    a = SessionLeases("aaaa", ttl_s=8, offset=lambda: now[0], url="http://a:1")
    b = SessionLeases("bbbb", ttl_s=8, offset=lambda: now[0], url="http://b:2")
    db.execute("INSERT INTO sessions(id, created_at, record) VALUES ('s1', 1, '\\x00'), "
               "('s2', 1, '\\x00')")
    skew[0] = -3600   # a's clock is an hour behind
    assert a.open(db, "s1") == 1
    a.heartbeat(db)
    skew[0] = 3600    # b's clock is an hour ahead: a's lease is live all the same
    assert b.expired(db) == [] and b.adopt(db, "s1") is None and b.open(db, "s1") is None
    owner = b.owner(db, "s1")
    assert owner is not None and owner.live and b.alive(db, "aaaa")
    assert b.open(db, "s2") == 1   # b, an hour ahead, holds s2 ...
    now[0] += 9                    # ... and stops renewing: 9 s later on the store's clock
    skew[0] = -3600                # a (an hour behind) finds it expired and adopts it
    assert sorted(a.expired(db)) == ["s1", "s2"]   # its own unrenewed one too
    assert a.adopt(db, "s2") == 2
    assert not a.alive(db, "bbbb")


def test_the_flags_are_checked(tmp_path: Path) -> None:
    from acp_server.settings import Settings, SettingsError

    with pytest.raises(SettingsError, match="session-lease-renew-ms"):
        Settings(workspace=str(tmp_path), session_lease_ttl_ms=1000, session_lease_renew_ms=1000)
    with pytest.raises(SettingsError, match="advertise-url"):
        Settings(workspace=str(tmp_path), advertise_url="ftp://host:1/path")
    settings = Settings.from_flags(workspace=str(tmp_path), advertise_url="http://10.0.0.2:4170/",
                                   session_lease_ttl_ms="3000", session_lease_renew_ms="500")
    assert (settings.advertise_url, settings.session_lease_ttl_ms,
            settings.session_lease_renew_ms) == ("http://10.0.0.2:4170", 3000, 500)


def test_a_busy_timeout_that_outlasts_a_lease_is_warned_of(tmp_path: Path, pg_url: str
                                                           ) -> None:
    """A lock wait as long as a lease's time left after a renewal tick could let the
    lease expire while this instance runs its work: ``serve`` starts and warns (a
    real process: the line is in its log); SQLite (one instance) and the defaults do
    not warn."""
    from acp_server.settings import Settings
    from tests.harness import ServeProcess

    def warning(**flags: Any) -> str | None:
        return Settings.from_flags(workspace=str(tmp_path), **flags).lease_margin_warning()

    assert warning(store=pg_url) is None   # 5,000 < 8,000 - 2,000 and < 30,000 - 10,000
    assert warning(store_busy_timeout_ms="60000") is None   # SQLite: no leases
    said = warning(store=pg_url, store_busy_timeout_ms="6000")
    assert said is not None and "--session-lease-ttl-ms 8000" in said, said
    # a renewal on a connection gone silent is given up 500 ms past the busy timeout
    said = warning(store=pg_url, store_busy_timeout_ms="5600")
    assert said is not None and "renewal interval 2000 and 500 ms" in said, said
    said = warning(store=pg_url, session_lease_ttl_ms="60000", store_busy_timeout_ms="20000")
    assert said is not None and "--store-lease-ms 30000" in said, said
    with ServeProcess(tmp_path, "--store", pg_url, "--store-busy-timeout-ms", "7000") as child:
        assert child.http.get("/health").status_code == 200   # it serves all the same
        assert "--store-busy-timeout-ms 7000 is not below" in child.stderr_text()


async def test_a_wildcard_bind_advertises_nothing_unless_told(
        tmp_path: Path, pg_url: str, db: psycopg.Connection[Any]) -> None:
    async with local_server(tmp_path, store=pg_url, hostname="0.0.0.0",
                            token="a-long-enough-token-for-tests-0123456789") as srv:
        assert srv.server.leases is not None and srv.server.leases.url is None
    async with local_server(tmp_path, store=pg_url, hostname="0.0.0.0",
                            token="a-long-enough-token-for-tests-0123456789",
                            advertise_url="http://10.1.2.3:4170") as srv:
        assert srv.server.leases is not None
        assert srv.server.leases.url == "http://10.1.2.3:4170"
