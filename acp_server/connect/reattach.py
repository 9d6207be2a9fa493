"""Re-attaching the editor's sessions after a reconnect: the part of ``Relay`` that
asks the server for each session again, after the last event the editor saw.

    await relay._reattach_sessions(link)    # every session, REATTACH_AT_ONCE at a time

Contracts:

* Each session is re-attached with ``session/load`` (our server: its cursor replays
  only what was missed) or ``session/resume`` (``_reattach_method``), with the cursor
  of ``state.Book.cursor`` and the ``--agent``.
* ``-32602`` (no such session): the session is forgotten and its pending requests
  fail with ``session_lost``. Any other error answer raises ``ReattachFailed`` (the
  link is made again). No answer within ``REATTACH_TIMEOUT_S``: the session's pending
  requests fail with ``reattach_timeout`` and it is kept for the next reconnect.
* A re-attach refused by the principal's rate limit (``rate_limit_exceeded``, a
  token of the ``default`` rate class: each ``session/load`` is a mutation) is sent
  again on the same link after the server's ``retryAfterMs`` (``RATE_WAIT_S`` at
  most), as long as it takes: the sessions re-attached already stay so. Dropping the
  link instead re-attached them all again at the next one, which the bucket could
  never pay for once the editor had more sessions than it refills between two
  reconnects: the adapter gave up on a server that was up.
* One session that hangs or fails does not hold the others; a lost link or a
  ``ReattachFailed`` is raised once all are done.
* A session the editor is ending (a ``session/close`` or ``session/delete`` of it
  waiting or in flight, ``FORGETS``) is not re-attached: that request goes as it is;
  nor asked again when the rate limit refused its re-attach and the editor ended it
  during the wait.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import anyio

from acp_server.connect import wire
from acp_server.connect.link import Link, LinkLost
from acp_server.connect.state import Book, Call

if TYPE_CHECKING:
    from acp_server.connect.reconnect import Clock

log = logging.getLogger("acp_server.connect")

REATTACH_TIMEOUT_S = 120.0
REATTACH_AT_ONCE = 8     # sessions re-attached concurrently after a reconnect
AGENT_META = "acp-server/agent"
CURSOR_META = "acp-server/lastEventId"
EPOCH_META = "acp-server/eventEpoch"
EVENTS_META = "acp-server/events"
RATE_LIMITED = "rate_limit_exceeded"
RATE_WAIT_S = 60.0   # the longest wait a rate-limited re-attach takes before trying again
FORGETS = frozenset({"session/close", "session/delete"})   # the editor ends its session
ENDS_OR_LOADS = FORGETS | {"session/load", "session/resume"}   # need no load before them


class ReattachFailed(LinkLost):
    """The server answered a re-attach with an error other than "no such session" (a
    store outage, ...): the link is given up and made again, within the give-up window,
    and the requests in flight are not blamed for it."""


class Reattach:
    """Mixed into ``Relay``, whose state it reads (``book``, ``agent``,
    ``server_init``) and whose ``_fail`` / ``_drop_outgoing`` it calls."""

    book: Book
    agent: str | None
    server_init: dict[str, Any] | None
    out: Any   # the editor's writer (``EditorWriter``)
    clock: Clock

    async def _fail(self, call: Call, message: str, kind: str,
                    data: dict[str, Any] | None = None) -> None:
        raise NotImplementedError

    def _drop_outgoing(self, call: Call) -> None:
        raise NotImplementedError

    async def _reattach_sessions(self, link: Link) -> None:
        """Every session the editor uses, ``REATTACH_AT_ONCE`` at a time."""
        limiter = anyio.CapacityLimiter(REATTACH_AT_ONCE)
        failures: list[LinkLost] = []

        async def one(sid: str) -> None:
            async with limiter:
                if failures and not isinstance(failures[0], ReattachFailed):
                    return   # the link is gone
                try:
                    await self._reattach_session(link, sid)
                except LinkLost as exc:
                    failures.append(exc)

        async with anyio.create_task_group() as tg:
            for sid in list(self.book.sessions):
                if not self._ending(sid):
                    tg.start_soon(one, sid)
        lost = [f for f in failures if not isinstance(f, ReattachFailed)]
        if lost or failures:
            raise (lost or failures)[0]

    def _ending(self, sid: str) -> bool:
        """The editor ends ``sid``: a ``session/close`` or ``session/delete`` of it waits
        or is in flight."""
        return any(c.session_id == sid and c.method in FORGETS and not c.internal
                   for c in self.book.calls.values())

    @property
    def resumable(self) -> bool:
        meta = (self.server_init or {}).get("_meta")
        ours = meta.get("acp-server") if isinstance(meta, dict) else None
        return isinstance(ours, dict) and ours.get("resumable") is True

    async def _reattach_session(self, link: Link, sid: str) -> None:
        session = self.book.sessions[sid]
        last, epoch = self.book.cursor(sid)
        meta: dict[str, Any] = {CURSOR_META: last}
        if epoch is not None:
            meta[EPOCH_META] = epoch
        if self.agent is not None:
            meta[AGENT_META] = self.agent
        method = self._reattach_method()
        params: dict[str, Any] = {"sessionId": sid, "cwd": session.cwd or self._workspace(),
                                  "mcpServers": session.mcp_servers or [], "_meta": meta}
        while True:
            answer = await self._call(link, method, params)
            if answer is None:
                await self._reattach_timed_out(sid)
                return
            wait = _rate_limited(answer)
            if wait is None:
                break
            log.info("session %s: re-attaching it was refused by the rate limit; again "
                     "in %.1f s", sid, wait)
            await self.clock.sleep(wait)
            if self._ending(sid):
                return   # the editor ends it meanwhile: that request goes as it is
        if "error" in answer.members:
            error = wire.decode(answer.members["error"])
            error = error if isinstance(error, dict) else {"message": str(error)}
            if error.get("code") != wire.INVALID_PARAMS:   # not "no such session"
                raise ReattachFailed(f"re-attaching session {sid} failed for now: "
                                     f"{error.get('message')} "
                                     f"({(error.get('data') or {}).get('errorKind')})")
            await self._session_lost(sid, error.get("message"))
            return
        result = wire.decode(answer.members["result"])
        events = (result.get("_meta") or {}).get(EVENTS_META) if isinstance(result, dict) \
            else None
        if isinstance(events, dict) and events.get("resync"):
            log.warning("session %s: the server resynchronised (%s): what happened while "
                        "disconnected may be missing", sid, events["resync"])
            if events["resync"] == "epoch_reset" and session.epoch != events.get("eventEpoch"):
                session.epoch = events.get("eventEpoch")
                session.last_id = int(events.get("lastEventId") or 0)
                await self._withdraw_stale(sid, session.epoch)

    async def _withdraw_stale(self, sid: str, epoch: str | None) -> None:
        """The session's event epoch changed: the questions the editor was asked under
        the old one and has not answered are withdrawn (``$/cancel_request``): the
        server no longer knows them (``Book.stale_asked``)."""
        for request_id in self.book.stale_asked(sid, epoch):
            log.info("session %s: the server forgot question %r (a new event epoch): "
                     "withdrawn", sid, request_id)
            await self.out.send(wire.notification("$/cancel_request",
                                                  {"requestId": request_id}))

    def _reattach_method(self) -> str:
        """``session/load`` with our server (its cursor makes it replay only what was
        missed), else ``session/resume`` where offered (no replay, no duplicates)."""
        caps = (self.server_init or {}).get("agentCapabilities")
        caps = caps if isinstance(caps, dict) else {}
        session_caps = caps.get("sessionCapabilities")
        resume = isinstance(session_caps, dict) and session_caps.get("resume") is not None
        load = caps.get("loadSession") is True
        if self.resumable:
            return "session/load" if load or not resume else "session/resume"
        return "session/resume" if resume or not load else "session/load"

    def _workspace(self) -> str | None:
        meta = (self.server_init or {}).get("_meta")
        ours = meta.get("acp-server") if isinstance(meta, dict) else None
        cwd = ours.get("workspaceCwd") if isinstance(ours, dict) else None
        return cwd if isinstance(cwd, str) else None

    async def _call(self, link: Link, method: str,
                    params: dict[str, Any]) -> wire.Message | None:
        """The server's answer to our own request; ``None`` past ``REATTACH_TIMEOUT_S``."""
        server_id = self.book.next_id()
        call = self.book.add_call(None, method, wire.request(server_id, method, params),
                                  params.get("sessionId"), internal=True, server_id=server_id)
        call.done = anyio.Event()
        call.sent = True
        await link.send(call.payload, session_id=call.session_id)
        with anyio.move_on_after(REATTACH_TIMEOUT_S):
            await call.done.wait()
        if call.answer is None:
            self.book.calls.pop(server_id, None)
            return None
        return wire.parse(call.answer)

    async def _reattach_timed_out(self, sid: str) -> None:
        """No answer to a session's re-attach: its pending requests fail; the session
        is kept (the next reconnect tries again) and the others go on."""
        log.error("session %s: no answer to re-attaching it within %g s", sid,
                  REATTACH_TIMEOUT_S)
        for call in [c for c in self.book.calls.values()
                     if c.session_id == sid and not c.internal]:
            del self.book.calls[call.server_id]
            self._drop_outgoing(call)
            await self._fail(call, f"session {sid} could not be re-attached in "
                                   f"{REATTACH_TIMEOUT_S:g} s after the reconnect",
                             "reattach_timeout", {"sessionId": sid})

    async def _session_lost(self, sid: str, cause: str | None) -> None:
        log.error("session %s could not be re-attached: %s", sid, cause)
        for call in self.book.forget_session(sid):
            self._drop_outgoing(call)
            await self._fail(call, f"session {sid} could not be re-attached after the "
                                   f"reconnect ({cause}); the server may have restarted "
                                   "without keeping it", "session_lost",
                             {"sessionId": sid, "cause": cause})


def _rate_limited(answer: wire.Message) -> float | None:
    """Seconds to wait when ``answer`` is the principal's rate limit refusing the
    request (its ``retryAfterMs``, within 0.05 s and ``RATE_WAIT_S``), else ``None``."""
    error = wire.decode(answer.members["error"]) if "error" in answer.members else None
    data = error.get("data") if isinstance(error, dict) else None
    if not isinstance(data, dict) or data.get("errorKind") != RATE_LIMITED:
        return None
    after = data.get("retryAfterMs")
    seconds = after / 1000 if isinstance(after, (int, float)) and after == after else 1.0
    return min(max(seconds, 0.05), RATE_WAIT_S)
