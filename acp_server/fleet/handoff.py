"""Hand-offs of idle sessions between instances, through the store (issue #24).

    handoffs = HandOffs(bridge, journal, tasks=tg)   # Fleet makes it, wires the store
    with may_hand_off(caller.sees):                  # a door: who may cause one
        await bridge.load_session(sid)               # Fleet.claim -> handoffs.ask(sid)

A client that lands on an instance other than the one running its session follows the
RFD's resume flow (``initialize``, ``session/load``). While the owner's lease is live,
this instance asks the owner to let the session go instead of refusing at once.

Contracts:

* ``ask`` (the asker) sends one notice ``h`` (``asker:session``) through the store, in
  a commit of its own, and waits at most ``wait_s`` (default: two renewal intervals)
  for the owner's answer: ``g`` (given: the lease names this instance now) or ``b``
  (busy). It wakes on the answer's notice and re-reads the lease every ``poll_s``
  (a notice may be lost). Returns whether the lease names this instance: the caller
  then adopts the session as an expired one (``Fleet.adopt``: token + 1, restored
  from the journal); otherwise the door answers ``SessionBusyElsewhereError``.
* The owner, on ``h`` for a session it runs: when the session is idle (no prompt
  running or queued, no permission or elicitation pending) it waits until what the
  journal holds of it is committed, checks again, then, with no await in between,
  stops it here exactly as when it loses its lease (``Bridge.sessions_moved``: its
  streams end, its fence is lost so nothing more of it is written), and names the
  asker in the lease, fenced by its own token (``SessionLeases.hand_over``), sending
  ``g`` in that commit. A session that is busy, or that becomes busy while its
  journal commits, stays: the answer is ``b``. A session not live here is ignored.
* Only a caller who may see the session causes a hand-off: the door sets
  ``may_hand_off(sees)`` around its load or resume (a context variable: the bridge
  calls ``Fleet.claim`` with the session id only). ``ask``'s caller checks the
  session's maker, read from the journal, first; with no door's word (another door,
  a forwarded request) nothing is asked.
* ``given`` counts the sessions let go (``Fleet`` counts those taken).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import anyio.abc

from acp_server.store.sessions import LOST, StoreSessionJournal
from bridge import Bridge

log = logging.getLogger("acp_server.fleet")
ASK, GIVEN, BUSY = "h", "g", "b"   # the notice kinds (``store.postgres.HANDOFF_KINDS``)
POLL_S = 0.25   # the asker re-reads the lease this often (a lost notice)

# The caller's ``sees(maker)`` of the door's load or resume running in this task.
_SEES: contextvars.ContextVar[Callable[[str | None], bool] | None] = \
    contextvars.ContextVar("acp_server_may_hand_off", default=None)


@contextlib.contextmanager
def may_hand_off(sees: Callable[[str | None], bool]) -> Iterator[None]:
    """Within: a session live elsewhere may be asked for when ``sees(its maker)``."""
    token = _SEES.set(sees)
    try:
        yield
    finally:
        _SEES.reset(token)


def caller_sees() -> Callable[[str | None], bool] | None:
    """The door's ``sees`` (``may_hand_off``), or ``None``: no hand-off."""
    return _SEES.get()


class HandOffs:
    """See the module docstring."""

    def __init__(self, bridge: Bridge, journal: StoreSessionJournal, *,
                 wait_s: float | None = None, poll_s: float = POLL_S) -> None:
        assert journal.leases is not None
        self.bridge = bridge
        self.journal = journal
        self.leases = journal.leases
        self.wait_s = 2 * self.leases.renew_s if wait_s is None else wait_s
        self.poll_s = poll_s
        self.given = 0   # sessions this instance let go when asked
        self.tasks: anyio.abc.TaskGroup | None = None   # the owner's answers run here
        self._awaited: dict[str, anyio.Event] = {}      # session -> its answer
        self._answers: dict[str, str] = {}
        store = journal.store
        if hasattr(store, "on_handoff"):   # PostgreSQL: the notices come to us
            store.handoff_wanted = self.wanted
            store.on_handoff = self.notified

    @property
    def instance(self) -> str:
        return self.leases.instance

    # -- the notices (``wanted`` on the listener's thread: a cheap look only) ------------
    def wanted(self, kind: str, ids: list[str]) -> list[str]:
        if kind == ASK:
            fence = self.journal.fence
            return [i for i in ids if fence.get(i.partition(":")[2], LOST) != LOST]
        prefix = self.instance + ":"
        awaited = self._awaited
        return [i for i in ids if i.startswith(prefix) and i[len(prefix):] in awaited]

    def notified(self, kind: str, ids: list[str]) -> None:
        for item in ids:
            asker, _, sid = item.partition(":")
            if kind == ASK:
                if self.tasks is not None:
                    self.tasks.start_soon(self.answer, sid, asker)
                continue
            event = self._awaited.get(sid)
            if event is not None and asker == self.instance:
                self._answers[sid] = kind
                event.set()

    async def _notify(self, kind: str, sid: str, asker: str) -> None:
        store = self.journal.store
        await store._write(lambda conn, out, *state: store.notice(state[0], kind,
                                                                 f"{asker}:{sid}"))

    # -- the asker -----------------------------------------------------------------------
    async def ask(self, sid: str) -> bool:
        """Ask the owner of ``sid`` to let it go; whether the lease names this instance
        now (see the module docstring). Raises what the store raises."""
        event = self._awaited.setdefault(sid, anyio.Event())
        leases = self.leases
        try:
            await self._notify(ASK, sid, self.instance)
            with anyio.move_on_after(self.wait_s):
                while True:
                    with anyio.move_on_after(self.poll_s):
                        await event.wait()
                    if self._answers.get(sid) == BUSY:
                        return False
                    owner = await self.journal.store._read(
                        lambda conn: leases.owner(conn, sid))
                    if owner is None or owner.instance == self.instance or not owner.live:
                        return True   # ours, expired (adopted as such) or closed
            return False
        finally:
            if self._awaited.get(sid) is event:
                del self._awaited[sid]
                self._answers.pop(sid, None)

    # -- the owner -----------------------------------------------------------------------
    def idle(self, sid: str, *, committed: bool = True) -> bool:
        """Live here with no prompt running or queued and no question pending;
        ``committed``: nor a turn whose end is not committed yet (ended in memory: the
        status still counts it, ``Bridge.settled_pending``)."""
        if not self.bridge.has_session(sid):
            return False
        status = self.bridge.session_status(sid)
        pending = status.pending_prompts
        if not committed:
            pending -= self.bridge.settled_pending(sid)
        # an elicitation is asked within a prompt's turn: a pending prompt covers it
        return pending == 0 and status.pending_permissions == 0

    async def answer(self, sid: str, asker: str) -> None:
        """Let ``sid`` go to ``asker`` when idle, else answer busy (never raises)."""
        try:
            given = await self._let_go(sid, asker)
            if given is None:
                return   # not ours (any more): the asker reads the lease
            await self._notify(GIVEN if given else BUSY, sid, asker)
        except Exception as exc:   # noqa: BLE001 - the asker times out, and retries
            log.warning("session %s: the hand-off to %s failed (%s)", sid, asker, exc)

    async def _let_go(self, sid: str, asker: str) -> bool | None:
        journal = self.journal
        token = journal.fence.get(sid, LOST)
        if token == LOST or not self.bridge.has_session(sid):
            return None
        for _ in range(3):   # what it journaled so far committed, and still idle
            # (a turn ended whose end is not committed yet is idle once that lands: the
            # status counts it running until then, as its readers see it)
            if not self.idle(sid, committed=False):
                return False
            seq = journal.appended
            with anyio.move_on_after(self.wait_s) as waiting:
                await journal.wait_through(seq)   # (not a refused record's fate)
            if waiting.cancelled_caught:
                return False   # not committed in time (a store blip): busy, asked again
            if journal.appended == seq and self.idle(sid) \
                    and journal.fence.get(sid) == token:
                break
        else:
            return False
        # no await from the check to here: no prompt can be admitted in between
        journal.lose(sid)   # nothing more of it is written here
        self.bridge.sessions_moved([sid])
        leases = self.leases
        held = await journal.store._write(
            lambda conn, out, *state: leases.hand_over(conn, sid, token, asker))
        if held:
            self.given += 1
            log.info("session %s: handed over to %s (idle, asked for)", sid, asker)
        return bool(held)

