"""From a bearer credential to a ``Principal``: the bootstrap token, or a stored token
looked up by its public id, behind a small cache.

    auth = Authenticator(store, bootstrap="s3cret", ttl_s=0.5)
    await auth.refresh()                        # are there stored tokens at all?
    found = auth.cached(b"acps_9f2c…_Qm9v…")    # Principal | None (refused) | MISS
    if found is MISS:
        found = await auth.lookup(b"acps_9f2c…_Qm9v…")   # one store read, then cached
    auth.forget(["9f2c…"])                      # revoked (here, or a PostgreSQL notice)

Contracts:

* ``required``: a credential is needed when there is a bootstrap token or the store
  holds any token (live, revoked or expired: revoking or outliving the last token
  does not reopen the server); with neither, the guard's loopback rule applies (and a
  loopback client is ``LOCAL``). The count is re-read by ``refresh`` (the principals
  run it every ``ttl_s``, and at once after a change); a read that finds a token's row
  (``lookup``: a stored token offered while none was required) makes it required at
  once.
* The bootstrap token is compared in constant time (``hmac.compare_digest``), always,
  whatever the credential looks like. A stored token (``acps_<id>_<secret>``) is found
  by its id, and its secret's SHA-256 compared in constant time with the stored
  digest; a revoked or expired one is refused exactly as an unknown one.
* The cache maps a token id to what the store said (the row, or no row) for ``ttl_s``
  (0.5 s): after that the next request reads the store again, so a revocation is seen
  within ``ttl_s`` even by an instance that missed the notice (another process on
  the same SQLite file, a lost PostgreSQL notice). ``forget`` drops ids at once. It
  holds at most ``max_entries`` ids with a row (the oldest go first), and apart from
  them at most ``max_entries`` ids without one (an unknown id, which any client can
  make up, never evicts a known one). Concurrent misses of one id share one read. A credential whose digest matched is remembered with its entry
  (a dict keyed by the whole credential, as bounded): while that entry is fresh, the
  same bytes are the same principal without parsing or hashing again (Python hashes
  ``bytes`` with a per-process keyed SipHash, so the lookup's timing tells nothing of
  the secret; a wrong secret never matches a remembered key and takes the digest path).
* When the store cannot answer, a cached row past its ``ttl_s`` is still used (the
  store being down, no revocation can be written either); without one ``lookup``
  raises ``StoreUnavailableError`` (the guard answers 503).
* ``used`` collects the last use of each stored token (``flush_used`` writes them,
  at most every ``USED_INTERVAL_S``): ``token list``'s "last used". Kept for the next
  time while the store is unavailable; when the store refuses the write for another
  reason (a constraint, a trigger), each token's is written alone and a refused one is
  dropped, logged once per token.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import anyio

from acp_server.principals import tokens
from acp_server.principals.model import BOOTSTRAP, Principal
from acp_server.store.errors import StoreUnavailableError, first_line
from acp_server.store.tokens import TokenRecord

log = logging.getLogger("acp_server.principals")

TTL_S = 0.5
MAX_ENTRIES = 4096
USED_INTERVAL_S = 10.0
MISS = object()


class TokenStore(Protocol):
    on_tokens_changed: Callable[[list[str]], None] | None

    async def get_token(self, token_id: str) -> TokenRecord | None: ...
    async def token_count(self) -> int: ...
    async def touch_tokens(self, used: dict[str, float]) -> None: ...


class _Entry:
    __slots__ = ("checked_at", "record", "principal")

    def __init__(self, checked_at: float, record: TokenRecord | None) -> None:
        self.checked_at = checked_at
        self.record = record
        self.principal = None if record is None else Principal(
            record.name, frozenset(record.scopes), kind="token", rate_class=record.rate_class,
            token_id=record.id)


class Authenticator:
    def __init__(self, store: TokenStore | None, *, bootstrap: str | None = None,
                 ttl_s: float = TTL_S, max_entries: int = MAX_ENTRIES,
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self._bootstrap = bootstrap.encode() if bootstrap is not None else None
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.clock = clock
        self.monotonic = monotonic
        self.stored_tokens = False         # any token ever stored (``refresh``)
        self.used: dict[str, float] = {}   # token id -> last use, not yet written
        self._refused_ids: set[str] = set()   # whose last use the store refused (logged)
        self._cache: dict[str, _Entry] = {}
        # ids the store has no row for, apart: unknown ids never evict known ones
        self._unknown: dict[str, _Entry] = {}
        # credential -> its entry, once its digest matched (the hot path's shortcut)
        self._verified: dict[bytes, _Entry] = {}
        self._reading: dict[str, anyio.Event] = {}
        self._used_written_at = 0.0

    @property
    def required(self) -> bool:
        return self._bootstrap is not None or self.stored_tokens

    # -- the request path --------------------------------------------------------------
    def cached(self, credential: bytes) -> Principal | None | object:
        """The principal of ``credential``; ``None`` when refused; ``MISS`` when only the
        store can tell (then ``lookup``)."""
        bootstrap = self._bootstrap
        if bootstrap is not None and hmac.compare_digest(bootstrap, credential):
            return BOOTSTRAP
        known = self._verified.get(credential)
        if known is not None and self.monotonic() - known.checked_at < self.ttl_s:
            record = known.record
            now = self.clock()
            if record is not None and (record.expires_at is None or now < record.expires_at):
                self.used[record.id] = now
                return known.principal
        if self.store is None:
            return None
        parsed = tokens.parse(credential)
        if parsed is None:
            return None
        entry = self._entry(parsed[0])
        if entry is None or self.monotonic() - entry.checked_at >= self.ttl_s:
            return MISS
        return self._verify(entry, parsed[1], credential)

    async def lookup(self, credential: bytes) -> Principal | None:
        """``cached``, reading the store on a miss (see the contracts)."""
        found = self.cached(credential)
        if found is not MISS:
            return found  # type: ignore[return-value]
        parsed = tokens.parse(credential)
        assert parsed is not None and self.store is not None
        entry = await self._read(parsed[0])
        return self._verify(entry, parsed[1], credential)

    async def _read(self, token_id: str) -> _Entry:
        """The store's answer for ``token_id``, cached; a read already under way for it
        is shared."""
        assert self.store is not None
        reading = self._reading.get(token_id)
        if reading is not None:
            await reading.wait()
            shared = self._entry(token_id)
            if shared is not None:
                return shared
        self._reading[token_id] = done = anyio.Event()
        try:
            try:
                record = await self.store.get_token(token_id)
            except StoreUnavailableError:
                stale = self._entry(token_id)
                if stale is None:
                    raise
                return stale   # the store is down: what it said last still holds
            entry = _Entry(self.monotonic(), record)
            self._remember(token_id, entry)
            if record is not None:   # the store holds a token: required from now on
                self.stored_tokens = True
            return entry
        finally:
            if self._reading.get(token_id) is done:
                del self._reading[token_id]
            done.set()

    def _entry(self, token_id: str) -> _Entry | None:
        return self._cache.get(token_id) or self._unknown.get(token_id)

    def _remember(self, token_id: str, entry: _Entry) -> None:
        self._cache.pop(token_id, None)
        self._unknown.pop(token_id, None)
        cache = self._cache if entry.record is not None else self._unknown
        if len(cache) >= self.max_entries:
            for old in list(cache)[:max(1, self.max_entries // 8)]:
                del cache[old]
        cache[token_id] = entry

    def _verify(self, entry: _Entry, secret: bytes, credential: bytes) -> Principal | None:
        record = entry.record
        if record is None:
            tokens.matches(_NO_RECORD, secret)   # the same work as a wrong secret
            return None
        now = self.clock()
        if not tokens.matches(record, secret) or not record.live(now):
            return None
        self.used[record.id] = now
        verified = self._verified
        if credential not in verified and len(verified) >= self.max_entries:
            for old in list(verified)[:max(1, self.max_entries // 8)]:
                del verified[old]
        verified[credential] = entry
        return entry.principal

    # -- changes -----------------------------------------------------------------------
    def forget(self, token_ids: Iterable[str]) -> None:
        ids = set(token_ids)
        for token_id in ids:
            self._cache.pop(token_id, None)
            self._unknown.pop(token_id, None)
        if ids:
            for credential, entry in list(self._verified.items()):
                if entry.record is not None and entry.record.id in ids:
                    del self._verified[credential]

    def expired_or_revoked(self, token_id: str) -> bool:
        """What the cache says of an id right now (``True`` when refused or unknown)."""
        entry = self._entry(token_id)
        return entry is None or entry.record is None or not entry.record.live(self.clock())

    async def revalidate(self, token_ids: Iterable[str]) -> list[str]:
        """Re-read these ids from the store; those no longer live (revoked, expired,
        gone). Ids the store cannot answer for now are left alone."""
        gone = []
        for token_id in token_ids:
            try:
                entry = await self._read(token_id)
            except StoreUnavailableError:
                continue
            if entry.record is None or not entry.record.live(self.clock()):
                gone.append(token_id)
        return gone

    async def refresh(self) -> None:
        """Re-read whether the store has ever held a token (kept as is when the store
        cannot answer). Once it has, it stays so: revoking the last token does not
        reopen the server to every local process (and once it has, the store is not
        asked again)."""
        if self.store is None or self.stored_tokens:
            return
        try:
            self.stored_tokens = await self.store.token_count() > 0
        except StoreUnavailableError:
            pass

    async def flush_used(self, *, force: bool = False) -> None:
        """Write the last uses collected so far (at most every ``USED_INTERVAL_S``)."""
        now = self.monotonic()
        if self.store is None or not self.used or \
                (not force and now - self._used_written_at < USED_INTERVAL_S):
            return
        used, self.used = self.used, {}
        self._used_written_at = now
        try:
            await self.store.touch_tokens(used)
        except StoreUnavailableError:
            for token_id, at in used.items():   # kept for the next time
                self.used.setdefault(token_id, at)
        except Exception as exc:   # noqa: BLE001 - the store refuses one of them
            await self._touch_each(used, exc)

    async def _touch_each(self, used: dict[str, float], exc: Exception) -> None:
        """The store refused a write of several last uses, not for being unavailable
        (a constraint, a trigger): each is written alone, so one token's refused
        update does not lose the others'; a refused one is dropped (last uses are
        lossy), logged once per token id (``_refused_ids``, at most ``MAX_ENTRIES``)."""
        assert self.store is not None
        for token_id, at in used.items():
            if len(used) > 1:
                try:
                    await self.store.touch_tokens({token_id: at})
                    continue
                except StoreUnavailableError:
                    self.used.setdefault(token_id, at)
                    continue
                except Exception as error:   # noqa: BLE001 - refused: dropped below
                    exc = error
            if token_id not in self._refused_ids and len(self._refused_ids) < MAX_ENTRIES:
                self._refused_ids.add(token_id)
                log.warning("principals: the store refused the last use of token %s (%s); "
                            "not written", token_id[:64], first_line(exc, 200))


# A record no secret matches: an unknown id costs the same digest as a wrong secret.
_NO_RECORD = TokenRecord(id="", name="", secret_sha256="0" * 64, scopes=(), rate_class="",
                         created_at=0.0, created_by="")


def bootstrap_only(token: str | None) -> Authenticator:
    """Only the ``--token`` credential (no store): what ``GuardPolicy(token=…)`` uses."""
    return Authenticator(None, bootstrap=token)


def credential_kind(credential: Any) -> str:
    """For the audit log: ``stored`` (an ``acps_`` token) or ``other``."""
    return "stored" if tokens.parse(credential) is not None else "other"


__all__ = ["Authenticator", "MISS", "TTL_S", "TokenStore", "bootstrap_only", "credential_kind"]
