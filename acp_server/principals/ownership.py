"""Who owns each session: the principal that made it (REST and ``/acp`` share one map).

    owners = SessionOwners(is_live=bridge.has_session, recorded=bridge.session_owner)
    owners.owner(session_id)               # "ci", or None: made by no principal we know
    owners.claim(session_id, "ci")         # the first claim wins; returns the owner
    async with owners.default_lock(("ci", None)):
        sid = owners.default(("ci", None))  # a principal's "single" session, per agent
        owners.set_default(("ci", None), new_sid)

Contracts:

* A session's owner is the principal whose request made it (create, attach that
  spawned, load or resume that restored it, branch). A claim never replaces an owner:
  restoring a remembered session keeps its maker as owner, whoever restores it.
* The map is a cache in front of ``recorded``: the owner the bridge keeps with the
  session, journaled with its record, so that a session restored at start (or
  adopted) is still its maker's. A claim never replaces a recorded owner.
* A session without a known owner (made before principals were recorded, by the LMSP
  runner, or forgotten past ``limit``) is seen by admins only (``Principal.sees``): the
  map fails closed.
* The map is in memory, per instance, bounded: past ``limit`` entries the oldest whose
  session is no longer live (``is_live``) is forgotten first; a live session is
  forgotten only when every entry is live (never with the session cap below ``limit``).
* A default session's lock lives while a request holds or waits for it; a default
  is recorded only once its session was made (a known agent). Defaults whose session
  is no longer live are forgotten when the map reaches twice what was left after the
  last sweep (at least ``DEFAULTS_SWEPT_FROM`` entries): a principal that is gone
  (a revoked token, a client of one day) does not stay in it for good, a live default
  is never forgotten.
* The doors answer 404 for what a caller does not see; this module only remembers.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable

import anyio

MAX_OWNED = 50_000
DEFAULTS_SWEPT_FROM = 64   # defaults kept before the first sweep of the dead ones
DefaultKey = tuple[str, str | None]   # (principal name, agent name or None)


class _Waited:
    """A default session's lock and how many requests hold or wait for it."""

    __slots__ = ("lock", "users")

    def __init__(self, lock: anyio.Lock) -> None:
        self.lock = lock
        self.users = 0


def _never_live(session_id: str) -> bool:
    return False


def _nothing_recorded(session_id: str) -> str | None:
    return None


class SessionOwners:
    def __init__(self, *, limit: int = MAX_OWNED,
                 is_live: Callable[[str], bool] = _never_live,
                 recorded: Callable[[str], str | None] = _nothing_recorded) -> None:
        self.limit = limit
        self.is_live = is_live
        self.recorded = recorded
        self._owners: OrderedDict[str, str] = OrderedDict()
        self._defaults: dict[DefaultKey, str] = {}
        self._locks: dict[DefaultKey, _Waited] = {}
        self._sweep_defaults_at = DEFAULTS_SWEPT_FROM

    def __len__(self) -> int:
        return len(self._owners)

    def owner(self, session_id: str) -> str | None:
        known = self._owners.get(session_id)
        if known is None:
            known = self.recorded(session_id)
            if known is not None:
                self._remember(session_id, known)
        return known

    def claim(self, session_id: str, name: str) -> str:
        """Record ``name`` as the owner unless the session has one; returns the owner."""
        known = self.owner(session_id)
        if known is not None:
            return known
        self._remember(session_id, name)
        return name

    def _remember(self, session_id: str, name: str) -> None:
        self._owners[session_id] = name
        if len(self._owners) > self.limit:
            self._evict()

    def _evict(self) -> None:
        rotated = 0
        while len(self._owners) > self.limit:
            sid = next(iter(self._owners))
            if rotated < len(self._owners) and self.is_live(sid):
                self._owners.move_to_end(sid)
                rotated += 1
                continue
            del self._owners[sid]

    # -- a principal's default ("single") session, per agent ----------------------------
    @contextlib.asynccontextmanager
    async def default_lock(self, key: DefaultKey) -> AsyncIterator[None]:
        """Concurrent first attaches of one principal share one spawn. A key's lock is
        kept only while a request holds or waits for it (a key names any agent string
        a client sends, before the name is checked: none may pin memory)."""
        entry = self._locks.get(key)
        if entry is None:
            entry = self._locks[key] = _Waited(anyio.Lock())
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            if not entry.users and self._locks.get(key) is entry:
                del self._locks[key]

    def default(self, key: DefaultKey) -> str | None:
        sid = self._defaults.get(key)
        return sid if sid is not None and self.is_live(sid) else None

    def set_default(self, key: DefaultKey, session_id: str) -> None:
        self._defaults[key] = session_id
        if len(self._defaults) >= self._sweep_defaults_at:   # amortised: O(1) a call
            for known, sid in list(self._defaults.items()):
                if not self.is_live(sid):
                    del self._defaults[known]
            self._sweep_defaults_at = max(DEFAULTS_SWEPT_FROM, 2 * len(self._defaults))


__all__ = ["DEFAULTS_SWEPT_FROM", "MAX_OWNED", "SessionOwners"]
