"""Adopting sessions whose owner's lease expired (issue #24).

    fleet = Fleet(bridge, journal, forwarder)
    await fleet.adopt(session_id)          # on a request for it (``routing``)
    await fleet.claim(session_id)          # a load or resume: adopted, or asked for
    async with anyio.create_task_group() as tg:
        tg.start_soon(fleet.sweep_forever)  # and of orphans nobody asks for

Contracts:

* ``adopt`` takes the lease over (token + 1, which fences the old owner:
  ``acp_server.store.leases``) and restores the session from the journal as after a
  restart (``bridge.restore``: the agent side re-made, the interrupted prompt handled by
  ``--session-on-restart``, the queued ones run in their order). Concurrent calls for
  one session adopt it once. The store's faults (``StoreUnavailableError``,
  ``JournalUnavailableError``) are raised: the door answers a retryable 503, never a
  404 for a session that exists. Any other failure is logged, and an adoption that
  took the lease and could not restore the session lets the lease expire again (a
  later sweep retries), so it never runs nowhere under a lease renewed here.
* ``sweep_forever`` looks for live sessions whose lease expired every renewal interval
  and adopts them, so a prompt accepted by an instance that died is run (or given its
  terminal) without waiting for a client to ask. Several instances sweeping at once
  adopt each session once: the store decides (``SessionLeases.adopt``).
* ``claim`` (``Bridge.before_restore``) asks the owner of a session live elsewhere
  to hand it over when idle (``handoff``), then adopts it.
* ``stats`` counts forwards, their failures, reads served from the journal,
  adoptions and hand-offs (``/daemon/status``, ``/metrics``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from typing import Any

import anyio

from acp_server.fleet.forward import Forwarder
from acp_server.fleet.handoff import HandOffs, caller_sees
from acp_server.store.errors import StoreUnavailableError
from acp_server.store.sessions import StoreSessionJournal
from bridge import Bridge
from bridge.errors import JournalUnavailableError, SessionBusyElsewhereError, SessionNotFoundError
from bridge.restore import restore_sessions

log = logging.getLogger("acp_server.fleet")


@dataclasses.dataclass
class FleetStats:
    """What ``/daemon/status`` and ``/metrics`` report of sessions across instances."""

    forwards: int = 0
    journal_reads: int = 0   # reads of sessions live elsewhere served from the journal
    forward_failures: int = 0
    forwards_rerouted: int = 0   # the owner had let the session go meanwhile: routed anew
    adoptions: int = 0
    handoffs_taken: int = 0    # idle sessions another instance let go to this one
    handoffs_refused: int = 0  # asked for and not let go in time (busy, unreachable)


class Fleet:
    """See the module docstring."""

    def __init__(self, bridge: Bridge, journal: StoreSessionJournal,
                 forwarder: Forwarder) -> None:
        assert journal.leases is not None, "sessions across instances need leases"
        self.bridge = bridge
        self.journal = journal
        self.leases = journal.leases
        self.forwarder = forwarder
        self.stats = FleetStats()
        self.replicas: Any = None   # replica.JournalReplicas: reads served from the journal
        self._adopting: dict[str, anyio.Event] = {}
        self.handoffs = HandOffs(bridge, journal)

    @property
    def instance(self) -> str:
        return self.leases.instance

    def owned(self) -> int:
        """The sessions this instance holds the lease of."""
        return sum(1 for token in self.journal.fence.values() if token > 0)

    def report(self) -> dict[str, Any]:
        """``/daemon/status``'s ``runtime.instances``."""
        return {"instance": self.instance, "advertisedUrl": self.leases.url,
                "sessionsOwned": self.owned(), "leasesTakenOver": self.stats.adoptions,
                "sessionsMovedAway": self.bridge.moved_sessions,
                "forwards": self.stats.forwards,
                "journalReads": self.stats.journal_reads,
                "forwardFailures": self.stats.forward_failures,
                "forwardsRerouted": self.stats.forwards_rerouted,
                "handOffsGiven": self.handoffs.given,
                "handOffsTaken": self.stats.handoffs_taken,
                "handOffsRefused": self.stats.handoffs_refused}

    async def adopt(self, sid: str) -> bool:
        """Take ``sid`` over and restore it here; whether it is live here now."""
        while (adopting := self._adopting.get(sid)) is not None:
            await adopting.wait()
        if self.bridge.has_session(sid):
            return True
        done = self._adopting[sid] = anyio.Event()
        try:
            # what this instance journaled lands first: a session it just ended (its
            # agent died) still looks live in the store until its end commits
            await self.journal.wait_through(self.journal.appended, fail_fast=True)
            if self.bridge.has_session(sid):
                return True
            found = await self.journal.adopt(sid)
            if found is None:
                return False
            restored = await restore_sessions(self.bridge, [found])
            if restored:
                self.stats.adoptions += 1
                log.info("session %s: adopted (its owner's lease expired)", sid)
                return True
            await self._let_go(sid, "it could not be restored")
            return False
        except (StoreUnavailableError, JournalUnavailableError):
            raise   # the store's fault: the caller answers 503 (retry), not 404
        except Exception as exc:   # noqa: BLE001 - the session stays where it is
            await self._let_go(sid, str(exc) or type(exc).__name__)
            return False
        finally:
            del self._adopting[sid]
            done.set()

    async def _let_go(self, sid: str, why: str) -> None:
        """An adoption that failed after taking the lease: the lease expires again (a
        later sweep retries), a half-made session here is stopped."""
        log.warning("session %s: could not be adopted (%s)", sid, why)
        # any instance may adopt it now: listed as not live here, as any such session
        self.bridge.unrestored.discard(sid)
        if self.bridge.has_session(sid):
            self.bridge.sessions_moved([sid])
        with contextlib.suppress(Exception):   # the store: the lease then expires by itself
            await self.journal.let_go(sid)

    async def claim(self, sid: str) -> None:
        """``Bridge.before_restore``: a session ``/acp`` (or any door) loads or resumes
        that is not live here is adopted when its lease expired. One another instance
        runs live is asked for (``handoff``: only when the door vouched for its
        caller, ``may_hand_off``); given, it is adopted here. When the door vouched,
        a caller who does not see the session's maker (read from the journal) gets
        ``SessionNotFoundError`` before anything is asked or adopted. Not given in time
        (busy, or the owner paused or unreachable), or not adopted (another instance
        won it, or it could not be restored): ``SessionBusyElsewhereError``, a
        retryable 503 / ``session_busy_elsewhere``, never a fresh session over it. A
        session with no lease goes on as before. The store's faults are
        ``JournalUnavailableError``."""
        leases = self.leases
        try:
            owner = await self.journal.store._read(lambda conn: leases.owner(conn, sid))
        except Exception as exc:   # noqa: BLE001 - the store: the door's own 503
            raise JournalUnavailableError(str(exc)) from exc
        if owner is None:
            return
        sees = caller_sees()
        if sees is not None and owner.instance != leases.instance:
            await self._check_maker(sid, sees)   # before anything moves
        try:
            if owner.instance != leases.instance and owner.live:
                await self._ask(sid, sees)
                if await self.adopt(sid):
                    self.stats.handoffs_taken += 1
                    return
            elif await self.adopt(sid):
                return
            # closed meanwhile (its lease went with it): a load of a closed session
            if await self.journal.store._read(lambda conn: leases.owner(conn, sid)) is None:
                return
        except StoreUnavailableError as exc:
            raise JournalUnavailableError(str(exc)) from exc
        # it has a lease and is not live here (another instance won it, or it could not
        # be restored and its lease was let go): retry, never a fresh session over it
        raise SessionBusyElsewhereError(sid, max(1, math.ceil(leases.renew_s)))

    async def maker_seen(self, sid: str, sees: Any) -> bool:
        """Whether a caller's ``sees`` sees the session's maker, read from the journal
        (``True`` where this instance reads no replicas: nothing to check against)."""
        try:
            await self._check_maker(sid, sees)
        except SessionNotFoundError:
            return False
        return True

    async def _check_maker(self, sid: str, sees: Any) -> None:
        """``SessionNotFoundError`` unless the door's caller sees the session's maker
        (read from the journal, and remembered here for the door's own checks)."""
        if self.replicas is None:
            return
        view = await self.replicas.view(sid, ring=False)
        if not sees(view.found.record.owner):
            raise SessionNotFoundError(sid)

    async def _ask(self, sid: str, sees: Any) -> None:
        """The hand-off of ``sid``, live elsewhere (see ``claim``)."""
        retry = max(1, math.ceil(self.leases.renew_s))
        if sees is None or self.replicas is None:   # no door vouched for the caller
            raise SessionBusyElsewhereError(sid, retry)
        try:
            given = await self.handoffs.ask(sid)
        except Exception as exc:   # noqa: BLE001 - the store: the door's own 503
            raise JournalUnavailableError(str(exc)) from exc
        if not given:
            self.stats.handoffs_refused += 1
            raise SessionBusyElsewhereError(sid, retry)

    async def sweep(self) -> int:
        """Adopt the live sessions whose lease expired; how many were adopted."""
        leases = self.leases
        expired = await self.journal.store._read(lambda conn: leases.expired(conn))
        adopted = 0
        for sid in expired:
            adopted += await self.adopt(sid)
        return adopted

    async def sweep_forever(self) -> None:
        """The orphan sweep; also owns the answers to hand-offs asked of this instance."""
        async with anyio.create_task_group() as tg:
            self.handoffs.tasks = tg
            try:
                while True:
                    await anyio.sleep(self.leases.renew_s)
                    try:
                        await self.sweep()
                    except Exception as exc:   # noqa: BLE001 - a store outage: next time
                        log.warning("sessions across instances: the orphan sweep failed "
                                    "(%s)", exc)
            finally:
                self.handoffs.tasks = None
