"""The session journal's leases on a shared PostgreSQL store (issue #24):
``acp_server.store.sessions.StoreSessionJournal`` inherits them; its module docstring
states the contracts (a ``SessionOpened`` takes its lease in its commit, every commit
is fenced, ``renew``, ``adopt``), ``acp_server.store.leases`` the SQL.

    journal.advertise(url)                 # this instance is reached there (the registry)
    lost = await journal.renew()           # every lease renewed; the sessions lost
    found = await journal.adopt(sid)       # an expired lease taken over, read back
    await journal.let_go(sid)              # an adoption undone: its lease expires now
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

import anyio

from acp_server.store.leases import SessionLeases
from bridge.journal import RestoredSession

log = logging.getLogger("acp_server.store.sessions")

LOST = -1   # the fence of a session this instance lost: every write of it is refused
# Lost sessions kept fenced (``lose``): the bridge stops one at once, so its last
# records are long refused when it is forgotten; past this the oldest are forgotten.
MAX_LOST = 4096


class SessionLeasing:
    """The leases of ``StoreSessionJournal`` (its attributes and the other parts'
    methods, set there)."""

    store: Any
    leases: SessionLeases | None
    fence: dict[str, int]
    _lost: dict[str, None]
    _closing: bool
    _renew_now: anyio.Event
    on_moved: Callable[[set[str]], None]
    _restore_in: Callable[..., list[RestoredSession]]
    _seed_untrimmed: Callable[[dict[str, int]], None]
    _resettle: Callable[[dict[str, list[Any]]], None]
    _seed_unsized: Callable[[list[str]], Any]

    def lose(self, session_id: str) -> None:
        """This instance no longer holds ``session_id``'s lease: every record of it is
        refused from now on (``LOST``). At most ``MAX_LOST`` are kept so; the oldest
        are forgotten (their sessions were stopped long before)."""
        self.fence[session_id] = LOST
        lost = self._lost
        lost.pop(session_id, None)
        lost[session_id] = None
        while len(lost) > MAX_LOST:
            oldest = next(iter(lost))
            del lost[oldest]
            if self.fence.get(oldest) == LOST:
                del self.fence[oldest]

    async def let_go(self, session_id: str) -> None:
        """An adoption that could not restore the session: its lease expires now (and
        is fenced ``LOST`` here), so the next sweep, here or elsewhere, tries again."""
        assert self.leases is not None
        token = self.fence.get(session_id)
        self.lose(session_id)
        if token is None or token == LOST:
            return
        me = self.leases.instance
        await self.store._write(lambda conn, out, *state: conn.execute(
            "UPDATE session_leases SET expires_at = 0 WHERE session_id = %s "
            "AND instance = %s AND token = %s", (session_id, me, token)))

    def advertise(self, url: str) -> None:
        """This instance is reached at ``url`` (the registry): written at once."""
        assert self.leases is not None
        self.leases.url = url
        self._renew_now.set()

    async def _renewer(self) -> None:
        assert self.leases is not None
        while not self._closing:
            with anyio.move_on_after(self.leases.renew_s):
                await self._renew_now.wait()
            self._renew_now = anyio.Event()
            try:
                await self.renew()
            except Exception as exc:   # noqa: BLE001 - the store's fault: next time
                log.warning("session leases: renewal failed (%s)", exc)

    async def renew(self) -> set[str]:
        """Renew every lease this instance holds (one statement) and its heartbeat; the
        sessions it lost are dropped from the fence and handed to ``on_moved``."""
        assert self.leases is not None
        leases = self.leases
        tokens = {sid: token for sid, token in self.fence.items() if token != LOST}
        lost = await self.store._write(lambda conn, out, *state: leases.renew(conn, tokens))
        lost = {sid for sid in lost if self.fence.get(sid) == tokens[sid]}
        for sid in lost:
            self.lose(sid)
        if lost:
            log.warning("session leases: %d session(s) taken over by another instance",
                        len(lost))
            self.on_moved(lost)
        return lost

    async def _release_leases(self) -> None:
        """A clean stop: this instance's leases expire now, so another instance adopts
        its sessions at once (this one takes back those nobody did at its next start)."""
        if self.leases is None or not self.fence:
            return
        sids = sorted(sid for sid, token in self.fence.items() if token != LOST)
        me = self.leases.instance
        self.fence.clear()
        with contextlib.suppress(Exception):
            await self.store._write(lambda conn, out, *state: conn.execute(
                "UPDATE session_leases SET expires_at = 0 WHERE instance = %s "
                "AND session_id = ANY(%s)", (me, sids)))

    async def adopt(self, session_id: str) -> RestoredSession | None:
        """Take over ``session_id`` when its lease expired (or it has none) and read it
        back from the journal; ``None`` when a live lease is elsewhere, it is closed or
        unknown. The caller restores it (``bridge.restore``) and fences it from now."""
        assert self.leases is not None
        leases = self.leases
        token = await self.store._write(
            lambda conn, out, *state: leases.adopt(conn, session_id))
        if token is None:
            return None
        self.fence[session_id] = token
        self._lost.pop(session_id, None)
        settled: dict[str, int] = {}
        resettle: dict[str, list[Any]] = {}
        try:
            found = await self.store._read(
                lambda conn: self._restore_in(conn, "id = %s", (session_id,),
                                              settled=settled, resettle=resettle))
        except BaseException:
            with anyio.move_on_after(5, shield=True):   # a dead store: the lease expires
                with contextlib.suppress(Exception):
                    await self.let_go(session_id)
            raise
        self._seed_untrimmed(settled)
        if not found:   # unreadable: let go, or its lease would be renewed here for ever
            await self.let_go(session_id)
            return None
        self._resettle(resettle)
        await self._seed_unsized([session_id])
        return found[0]
