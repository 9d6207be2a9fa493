"""The principals' parts on their own: token format, rate limiter, authenticator cache,
audit sampling. Clocks are injected; nothing sleeps."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from acp_server.principals import tokens
from acp_server.principals import audit as audit_module
from acp_server.principals.audit import AuditLog, prompt_text
from acp_server.principals.auth import MISS, Authenticator
from acp_server.principals.limits import RateLimiter, Tier
from acp_server.principals.model import (BOOTSTRAP, InvalidPrincipalError, Principal,
                                         check_name, check_scopes)
from acp_server.store.audit import AuditQuery, AuditRecord
from acp_server.store.errors import StoreUnavailableError
from acp_server.store.sqlite import SqliteTaskStore


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# -- tokens ----------------------------------------------------------------------------------
def test_a_token_is_its_public_id_and_a_secret_of_which_only_a_digest_is_kept() -> None:
    issued = tokens.issue("ci", scopes=["read", "prompt", "read"], by="bootstrap", now=5.0,
                          expires_in_s=10)
    token_id, secret = tokens.parse(issued.token)  # type: ignore[misc]
    assert issued.token.startswith("acps_") and token_id == issued.record.id
    assert len(token_id) == 16 and len(secret) == 43
    assert issued.record.scopes == ("prompt", "read")
    assert issued.record.secret_sha256 == tokens.digest(secret)
    assert secret.decode() not in repr(issued.record)
    assert tokens.matches(issued.record, secret)
    assert not tokens.matches(issued.record, secret[:-1] + b"x")
    assert issued.record.live(14.9) and not issued.record.live(15.0)


@pytest.mark.parametrize("text", ["", "acps_", "acps_123_x", "acps_zzzzzzzzzzzzzzzz_x",
                                  "acps_0123456789abcdef", "acps_0123456789abcdef_",
                                  "Bearer acps_0123456789abcdef_x", "x" * 300])
def test_malformed_tokens_parse_to_nothing(text: str) -> None:
    assert tokens.parse(text) is None


def test_names_scopes_and_durations_are_checked() -> None:
    assert check_name("ci-bot.1@team") == "ci-bot.1@team"
    for bad in ("", "-x", "a b", "x" * 65, "bootstrap", "Local", "é"):
        with pytest.raises(InvalidPrincipalError):
            check_name(bad)
    assert check_scopes([]) == ("prompt", "read")
    assert check_scopes(["admin"]) == ("admin",)
    with pytest.raises(InvalidPrincipalError):
        check_scopes(["write"])
    assert tokens.parse_duration("30d") == 30 * 86400
    assert tokens.parse_duration("90m") == 5400 and tokens.parse_duration("45") == 45
    for bad in ("", "0", "-1d", "3y", "d"):
        with pytest.raises(InvalidPrincipalError):
            tokens.parse_duration(bad)


def test_scopes_admin_includes_the_others_and_ownership_is_by_name() -> None:
    reader = Principal("r", frozenset({"read"}))
    admin = Principal("a", frozenset({"admin"}))
    assert reader.has("read") and not reader.has("prompt") and not reader.has("admin")
    assert admin.has("read") and admin.has("prompt") and reader.has(None)
    assert reader.sees("r") and not reader.sees("a") and not reader.sees(None)
    assert reader.sees("a", shared=True) and admin.sees("r") and admin.sees(None)
    assert not BOOTSTRAP.limited and reader.limited


# -- the rate limiter ------------------------------------------------------------------------
def test_the_rate_limiter_is_a_token_bucket_per_principal_and_class() -> None:
    clock = Clock()
    limiter = RateLimiter({"prompt": Tier(3), "read": Tier(120), "mutation": Tier(0)},
                          clock=clock)
    assert [limiter.take("ci", "prompt") for _ in range(3)] == [None, None, None]
    assert limiter.take("ci", "prompt") == pytest.approx(20.0)   # one per 20 s
    assert limiter.take("ops", "prompt") is None                 # per principal
    assert limiter.take("ci", "read") is None                    # per class
    assert all(limiter.take("ci", "mutation") is None for _ in range(1000))   # 0 = off
    clock.now += 19.0
    assert limiter.take("ci", "prompt") == pytest.approx(1.0)
    clock.now += 1.0
    assert limiter.take("ci", "prompt") is None
    assert limiter.take("ci", "prompt") == pytest.approx(20.0)
    clock.now += 3600
    assert [limiter.take("ci", "prompt") for _ in range(4)][-1] is not None   # capped at 3
    assert limiter.refused["prompt"] == 4


def test_the_rate_limiter_memory_is_bounded_and_never_refuses_for_others() -> None:
    clock = Clock()
    limiter = RateLimiter({"read": Tier(1)}, clock=clock, max_keys=2)
    assert limiter.take("a", "read") is None and limiter.take("b", "read") is None
    assert limiter.take("c", "read") is None   # full, nothing refilled: allowed, not tracked
    assert limiter.take("a", "read") is not None
    clock.now += 60   # a and b are full again: dropped to make room
    assert limiter.take("c", "read") is None and limiter.take("c", "read") is not None


# -- the authenticator -----------------------------------------------------------------------
pytestmark = pytest.mark.anyio


async def test_the_cache_answers_for_ttl_then_the_store_does(tmp_path: Path) -> None:
    mono, wall = Clock(0.0), Clock(time.time())
    async with SqliteTaskStore(f"sqlite:///{tmp_path}/t.db") as store:
        auth = Authenticator(store, bootstrap="boot", ttl_s=0.5, monotonic=mono, clock=wall)
        await auth.refresh()
        assert auth.required and not auth.stored_tokens   # the bootstrap token alone
        issued = tokens.issue("ci", by="t", now=wall())
        await store.create_token(issued.record)
        await auth.refresh()
        assert auth.required and auth.stored_tokens
        credential = issued.token.encode()
        assert auth.cached(b"boot") is BOOTSTRAP
        assert auth.cached(credential) is MISS
        found = await auth.lookup(credential)
        assert found is not None and found.name == "ci" and found.token_id == issued.record.id
        assert auth.cached(credential) is found                 # cached
        wrong = credential[:-1] + (b"A" if not credential.endswith(b"A") else b"B")
        assert auth.cached(wrong) is None                       # the digest differs
        await store.revoke_token("ci", by="t", at=wall())
        assert auth.cached(credential) is found                 # within the ttl
        mono.now += 0.5
        assert auth.cached(credential) is MISS
        assert await auth.lookup(credential) is None             # the store said so
        assert await auth.lookup(b"acps_0123456789abcdef_nope") is None
        await auth.refresh()
        assert auth.required   # a revoked token still counts: the server stays closed
        assert issued.record.id in auth.used


async def test_once_a_token_was_stored_tokens_are_not_counted_again(tmp_path: Path) -> None:
    async with SqliteTaskStore(f"sqlite:///{tmp_path}/t.db") as store:
        counted = []
        count = store.token_count

        async def counting() -> int:
            counted.append(1)
            return await count()

        store.token_count = counting  # type: ignore[method-assign]
        auth = Authenticator(store)
        await auth.refresh()
        assert not auth.stored_tokens and len(counted) == 1
        await store.create_token(tokens.issue("ci", by="t", now=time.time()).record)
        await auth.refresh()
        assert auth.stored_tokens and len(counted) == 2
        for _ in range(3):
            await auth.refresh()
        assert auth.stored_tokens and len(counted) == 2   # sticky: never asked again


async def test_unknown_ids_never_evict_a_known_one(tmp_path: Path) -> None:
    mono, wall = Clock(0.0), Clock(time.time())
    async with SqliteTaskStore(f"sqlite:///{tmp_path}/t.db") as store:
        auth = Authenticator(store, ttl_s=0.5, max_entries=8, monotonic=mono, clock=wall)
        issued = tokens.issue("ci", by="t", now=wall())
        await store.create_token(issued.record)
        assert await auth.lookup(issued.token.encode()) is not None
        for i in range(50):   # made-up ids, one store read each, answered "no row"
            assert await auth.lookup(f"acps_{i:016x}_nope".encode()) is None
        assert auth.cached(issued.token.encode()) is not MISS   # still cached
        assert auth.cached(f"acps_{49:016x}_nope".encode()) is None   # so are the latest
        assert len(auth._unknown) <= 8


async def test_a_store_outage_keeps_what_the_cache_said(tmp_path: Path) -> None:
    mono = Clock(0.0)

    class Down:
        on_tokens_changed = None
        down = False

        def __init__(self, store: SqliteTaskStore) -> None:
            self.store = store

        async def get_token(self, token_id: str):  # noqa: ANN201
            if self.down:
                raise StoreUnavailableError("down")
            return await self.store.get_token(token_id)

    async with SqliteTaskStore(f"sqlite:///{tmp_path}/t.db") as store:
        issued = tokens.issue("ci", by="t", now=time.time())
        await store.create_token(issued.record)
        flaky = Down(store)
        auth = Authenticator(flaky, ttl_s=0.5, monotonic=mono)  # type: ignore[arg-type]
        assert await auth.lookup(issued.token.encode()) is not None
        flaky.down = True
        mono.now += 10
        assert await auth.lookup(issued.token.encode()) is not None   # stale, still served
        with pytest.raises(StoreUnavailableError):
            await auth.lookup(b"acps_0123456789abcdef_unknown")


# -- the audit log ---------------------------------------------------------------------------
async def test_auth_failures_are_sampled_per_client(tmp_path: Path) -> None:
    wall = Clock(100.0)
    async with SqliteTaskStore(f"sqlite:///{tmp_path}/t.db") as store:
        audit = AuditLog(store, clock=wall, failure_window_s=60, failures_per_window=3)
        for _ in range(50):
            audit.auth_failed(client="10.0.0.1", reason="invalid_credential", path="/x")
        audit.auth_failed(client="10.0.0.2", reason="missing_credential", path="/y")
        audit.auth_failed(client="10.0.0.3", reason="missing_credential", path="/y")
        audit.auth_failed(client="10.0.0.4", reason="missing_credential", path="/y")   # cap
        wall.now += 60
        audit.auth_failed(client="10.0.0.1", reason="invalid_credential", path="/x")
        await audit.flush()
        rows = await store.read_audit(AuditQuery())
        assert [(r.client, r.detail) for r in rows] == [
            ("10.0.0.1", '{"reason":"invalid_credential","path":"/x"}'),
            ("10.0.0.2", '{"reason":"missing_credential","path":"/y"}'),
            ("10.0.0.3", '{"reason":"missing_credential","path":"/y"}'),
            ("10.0.0.1", '{"reason":"invalid_credential","path":"/x","suppressed":49}')]


async def test_a_client_past_the_cap_is_still_counted_and_a_forgotten_one_is_told(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """helper-54: once the window's cap was used, a client never recorded before was not
    counted at all, and the map of counted clients was cleared whole at 4,096."""
    monkeypatch.setattr(audit_module, "FAILURE_CLIENTS_KEPT", 3)
    wall = Clock(100.0)
    async with SqliteTaskStore(f"sqlite:///{tmp_path}/t.db") as store:
        audit = AuditLog(store, clock=wall, failure_window_s=60, failures_per_window=1)
        audit.auth_failed(client="10.0.0.1", reason="invalid_credential", path="/x")
        for _ in range(50):   # past the cap: counted, not recorded
            audit.auth_failed(client="10.0.0.9", reason="invalid_credential", path="/x")
        for n in (2, 3, 4):   # 10.0.0.9 is forgotten (the least recent): its 50 are told
            audit.auth_failed(client=f"10.0.1.{n}", reason="missing_credential", path="/y")
        audit.auth_failed(client="10.0.1.4", reason="missing_credential", path="/y")
        wall.now += 60
        audit.auth_failed(client="10.0.1.4", reason="missing_credential", path="/y")
        await audit.flush()
        rows = [(r.client, r.detail) for r in await store.read_audit(AuditQuery())]
        assert rows == [
            ("10.0.0.1", '{"reason":"invalid_credential","path":"/x"}'),
            (None, '{"reason":"sampled_out","suppressed":50}'),
            ("10.0.1.4", '{"reason":"missing_credential","path":"/y","suppressed":2}')]


async def test_the_buffer_is_bounded_and_says_what_it_dropped(tmp_path: Path) -> None:
    async with SqliteTaskStore(f"sqlite:///{tmp_path}/t.db") as store:
        audit = AuditLog(store, max_buffered=3, clock=Clock())
        for i in range(5):
            audit.record("ci", "prompt.accepted", f"s{i}")
        assert audit.dropped == 2
        await audit.flush()
        rows = await store.read_audit(AuditQuery())
        assert [r.action for r in rows] == ["prompt.accepted"] * 3 + ["audit.records_dropped"]
        assert rows[-1].detail == '{"count":2}'


class CountedAudit:
    """The store's audit operations, each write's targets noted (``writes``)."""

    def __init__(self, store: SqliteTaskStore) -> None:
        self.store = store
        self.writes: list[list[str | None]] = []

    async def append_audit(self, records: list[AuditRecord]) -> None:
        self.writes.append([r.target for r in records])
        await self.store.append_audit(records)

    async def read_audit(self, query: AuditQuery) -> list[AuditRecord]:
        return await self.store.read_audit(query)

    async def purge_audit(self, *, before: float) -> int:
        return await self.store.purge_audit(before=before)


async def test_a_stream_of_records_is_written_once_per_interval(tmp_path: Path) -> None:
    """After a quiet spell a record is written at once; then at most one write per
    ``flush_interval_s``: the records made meanwhile wait for the next (or a flush,
    as ``read`` and a clean stop do), in order, not a commit per turn of the loop."""
    async with SqliteTaskStore(f"sqlite:///{tmp_path}/t.db") as store:
        counted = CountedAudit(store)
        audit = AuditLog(counted, clock=Clock(), flush_interval_s=3600)
        async with anyio.create_task_group() as tg:
            await tg.start(audit.run)
            audit.record("ci", "prompt.accepted", "s0")
            with anyio.fail_after(10):
                while audit.written < 1:
                    await anyio.lowlevel.checkpoint()
            for i in range(1, 20):
                audit.record("ci", "prompt.accepted", f"s{i}")
                for _ in range(5):   # turns of the loop the writer could take
                    await anyio.lowlevel.checkpoint()
            assert counted.writes == [["s0"]] and audit.buffered == 19
            rows = await audit.read(AuditQuery())
            assert counted.writes == [["s0"], [f"s{i}" for i in range(1, 20)]]
            assert [r.target for r in rows] == [f"s{i}" for i in range(20)]
            tg.cancel_scope.cancel()


async def test_records_made_while_a_write_runs_wait_for_the_interval(tmp_path: Path) -> None:
    """The records made while a write is in the store (a steady stream: one per prompt)
    are not written as soon as it lands, again and again (a durable commit, an fsync,
    for every commit of the store under load), but in one write after the interval."""
    async with SqliteTaskStore(f"sqlite:///{tmp_path}/t.db") as store:
        counted = CountedAudit(store)
        entered, release = anyio.Event(), anyio.Event()
        append = counted.append_audit

        async def gated(records: list[AuditRecord]) -> None:
            entered.set()
            await release.wait()
            await append(records)

        counted.append_audit = gated  # type: ignore[method-assign]
        audit = AuditLog(counted, clock=Clock(), flush_interval_s=3600)
        async with anyio.create_task_group() as tg:
            await tg.start(audit.run)
            audit.record("ci", "prompt.accepted", "s0")
            with anyio.fail_after(10):
                await entered.wait()
            for i in range(1, 4):   # made while the first write runs
                audit.record("ci", "prompt.accepted", f"s{i}")
            release.set()
            with anyio.fail_after(10):
                while audit.written < 1:
                    await anyio.lowlevel.checkpoint()
            await anyio.wait_all_tasks_blocked()
            assert counted.writes == [["s0"]] and audit.buffered == 3
            await audit.flush()   # as ``read`` and a clean stop do
            assert counted.writes == [["s0"], ["s1", "s2", "s3"]]
            tg.cancel_scope.cancel()


def test_a_limited_principal_gets_its_own_caller_per_request() -> None:
    """``Gate.caller`` shares the caller of an unlimited principal per (principal,
    client); a limited one's holds the request it was charged (``uncharge``), so each
    request gets its own, and the limiter counts every one."""
    from acp_server.principals import Gate
    from acp_server.principals.model import LOCAL, PROMPTING

    gate = Gate(Authenticator(None), limiter=RateLimiter({"prompt": Tier(2)}, clock=Clock()))
    assert gate.caller(BOOTSTRAP, "10.0.0.1") is gate.caller(BOOTSTRAP, "10.0.0.1")
    assert gate.caller(BOOTSTRAP, "10.0.0.1") is not gate.caller(BOOTSTRAP, "10.0.0.2")
    assert gate.caller(LOCAL, None).principal is LOCAL
    ci = Principal("ci", frozenset({"prompt"}), token_id="tok1")
    first, second = gate.caller(ci, "10.0.0.1"), gate.caller(ci, "10.0.0.1")
    assert first is not second
    assert first.check(PROMPTING) is None and first.charged == "prompt"
    assert second.check(PROMPTING) is None and second.charged == "prompt"
    third = gate.caller(ci, "10.0.0.1")
    assert third.check(PROMPTING) is not None and third.charged is None   # 2 a minute
    first.uncharge()
    assert first.charged is None and gate.caller(ci, "10.0.0.1").check(PROMPTING) is None


def test_an_unlimited_callers_answers_stay_and_its_memo_is_cleared_when_full() -> None:
    """An unlimited caller remembers the last Access it passed (``_passed``): a
    read-only token passes reads and is refused prompts, in any order, every time.
    ``Gate.caller`` keeps ``CALLERS_KEPT`` of them, then starts again."""
    from acp_server.principals import Gate
    from acp_server.principals.gate import CALLERS_KEPT, SCOPE_DENIALS
    from acp_server.principals.model import MUTATING, PROMPTING, READING

    gate = Gate(Authenticator(None))
    reader = Principal("reader", frozenset({"read"}), rate_class="unlimited", token_id="t1")
    caller = gate.caller(reader, "c0")
    for _ in range(3):
        assert caller.check(READING) is None and caller.charged is None
        assert caller.check(PROMPTING) is SCOPE_DENIALS["prompt"]
        assert caller.check(MUTATING) is SCOPE_DENIALS["prompt"]
    for i in range(1, CALLERS_KEPT):
        assert gate.caller(reader, f"c{i}").client == f"c{i}"
    assert len(gate._callers) == CALLERS_KEPT and gate.caller(reader, "c0") is caller
    late = gate.caller(reader, "late")
    assert len(gate._callers) == 1 and gate.caller(reader, "late") is late
    again = gate.caller(reader, "c0")   # made anew after the clear: the same answers
    assert again is not caller and again.check(PROMPTING) is SCOPE_DENIALS["prompt"]
    assert again.check(READING) is None


def test_prompt_text_keeps_the_text_blocks_only() -> None:
    assert prompt_text([{"type": "text", "text": "a"}, {"type": "image", "data": "x"},
                        {"type": "text", "text": "b"}]) == "a\nb"
    assert prompt_text("nope") == ""


def test_session_owners_keep_the_first_claim_and_forget_closed_sessions_first() -> None:
    from acp_server.principals.ownership import SessionOwners

    live = {"a", "c"}
    owners = SessionOwners(limit=3, is_live=live.__contains__)
    assert owners.claim("a", "alice") == "alice"
    assert owners.claim("a", "bob") == "alice"          # a claim never replaces an owner
    for sid in ("b", "c", "d"):                          # b is closed: forgotten first
        owners.claim(sid, "bob")
    assert (owners.owner("a"), owners.owner("b"), owners.owner("c"), owners.owner("d")) == (
        "alice", None, "bob", "bob")
    assert len(owners) == 3
    owners.set_default(("alice", None), "a")
    owners.set_default(("bob", None), "b")
    assert owners.default(("alice", None)) == "a"
    assert owners.default(("bob", None)) is None        # not live: spawn another
    everything = SessionOwners(limit=2, is_live=lambda sid: True)
    for sid in ("x", "y", "z"):                          # all live: the oldest goes
        everything.claim(sid, "alice")
    assert (everything.owner("x"), len(everything)) == (None, 2)


def test_session_owners_fall_back_to_the_owner_the_bridge_recorded() -> None:
    from acp_server.principals.ownership import SessionOwners

    recorded = {"restored": "alice"}
    owners = SessionOwners(recorded=recorded.get)
    assert owners.owner("restored") == "alice"          # journaled with the session
    assert owners.claim("restored", "bob") == "alice"   # a claim never replaces it
    assert owners.owner("unknown") is None
    assert owners.claim("unknown", "bob") == "bob"
