"""Requests for a session reach the instance that runs it (issue #24).

    router = SessionRouter(app, fleet, reads)   # reads: rest.journal_reads.JournalReads
    # build_app puts it inside the front layer: a request is authenticated here first

For an HTTP request under ``/session/{id}`` (REST) whose session is not live on this
instance and that no instance forwarded (``FORWARDED_HEADER``):

* the store names the lease holder (``acp_server.store.leases``). Another instance
  whose lease is live: a read (``reads.serves``: status, pending prompts, the event
  stream with ``Last-Event-ID``, ``/load``) is answered here from the journal
  (``replica``: no take-over, so it answers while the owner is paused or slow); any
  other request (a prompt, cancel, permission vote, close, branch…) is forwarded to
  the owner's advertised URL (``forward.Forwarder``), so only the owner admits prompts
  and the admission limit stays exact across instances;
* a lease that expired (its owner died or paused): for a caller who sees the session
  (its maker, read from the journal, an admin, or ``--share-sessions``; another
  principal's request is served here, a 404, and takes nothing over) this instance
  adopts the session, taking the lease over (token + 1, which fences the old owner)
  and restoring it from the journal as after a restart (``bridge.restore``;
  ``--session-on-restart`` decides the interrupted prompt), then serves the request
  itself;
* no lease (a closed or unknown session): served here as before (journal reads, 404).

A forwarded request is counted against the caller's rate limits once, by the owner
that serves it: this instance gives back what its front layer took (``Caller.uncharge``).
The owner counts every request it serves, a forwarded one too, so a client gains
nothing by sending ``FORWARDED_HEADER`` itself.

Concurrent requests for one session on this instance adopt it once
(``adoption.Fleet``). Nothing here
raises: a store that cannot say who owns the session is a 503 ``store_unavailable``
with ``Retry-After`` (the REST door's shape: not a 404 for a session that may be live
on another instance), an owner that cannot be reached is a 503 ``owner_unreachable``
with ``Retry-After: 5`` (the request did not reach it: sending it again is safe), and
one that took the request and gave no answer (it died or was given up meanwhile:
``forward.OwnerLostError``) a 503 ``owner_lost`` with ``Retry-After: 5``, whose
message says that the request may have been carried out (a prompt admitted, say), so
the client reads the session before it sends it again (a prompt named by its
``promptId`` may simply be sent again under it: ``acp_server.rest.prompts``). ``stats`` counts forwards,
adoptions and failures.
"""

from __future__ import annotations

import logging
from typing import Any

from acp_server.fleet.adoption import Fleet
from acp_server.fleet.forward import (
    FORWARDED_HEADER,
    OwnerLostError,
    OwnerMovedError,
    OwnerUnreachableError,
    replayed,
)
from acp_server.principals import CALLER_KEY
from acp_server.store.errors import RETRY_AFTER_S, StoreUnavailableError
from acp_server.store.leases import Owner

log = logging.getLogger("acp_server.fleet")
CLIENT_ID_HEADER = b"x-qwen-client-id"
UNREACHABLE = (b'{"error":"The instance that runs this session cannot be reached; retry '
               b'later","code":"owner_unreachable"}')
LOST = (b'{"error":"The instance that runs this session took this request and stopped '
        b'answering: it may have carried it out. Read the session (its status, pending '
        b'prompts or events) before sending it again; a prompt sent with a promptId may '
        b'be sent again under it","code":"owner_lost"}')
STORE_UNAVAILABLE = b'{"error":"The store is unavailable; retry later","code":"store_unavailable"}'


def session_of(path: str) -> str | None:
    """The session id of a ``/session/{id}[/…]`` path."""
    if not path.startswith("/session/"):
        return None
    sid = path[len("/session/"):].split("/", 1)[0]
    return sid or None


class SessionRouter:
    """See the module docstring (an ASGI middleware)."""

    def __init__(self, app: Any, fleet: Fleet, reads: Any = None) -> None:
        self.app = app
        self.reads = reads   # e.g. rest.journal_reads.JournalReads: ``serves(scope)``, ASGI
        self.fleet = fleet
        self.bridge = fleet.bridge
        self.journal = fleet.journal
        self.leases = fleet.leases
        self.forwarder = fleet.forwarder
        self.stats = fleet.stats

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            sid = session_of(scope["path"])
            if sid is not None and self.bridge.has_session(sid):
                self._adopt_client(sid, scope)
            elif sid is not None \
                    and not any(k == FORWARDED_HEADER for k, _ in scope["headers"]):
                await self._not_live_here(sid, scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _not_live_here(self, sid: str, scope: Any, receive: Any, send: Any,
                             again: bool = True) -> None:
        """A request for ``sid``, not live here: a read of a session live elsewhere is
        answered from the journal, any other request goes to its owner (``again``: it
        may be routed once more, see ``_forward``), else it is served here (adopted if
        due; a closed or unknown session)."""
        try:
            owner = await self._route(sid, scope)
        except Exception as exc:   # noqa: BLE001 - the store's fault: retry later
            log.warning("session %s: its owner could not be looked up (%s)", sid, exc)
            retry = exc.retry_after if isinstance(exc, StoreUnavailableError) \
                else RETRY_AFTER_S
            await _refuse(send, STORE_UNAVAILABLE, retry)
            return
        if owner is not None and self.reads is not None and self.reads.serves(scope):
            self.stats.journal_reads += 1   # a read: answered here, from the journal
            await self.reads(scope, receive, send)
        elif owner is not None:
            await self._forward(owner, scope, receive, send, again)
        else:
            await self.app(scope, receive, send)

    def _adopt_client(self, sid: str, scope: Any) -> None:
        """A client id another instance issued for this session (its ``/load`` from
        the journal, or an owner before an adoption) is one this session knows; only
        from a caller who sees the session (another principal's request, a 404, changes
        nothing of it)."""
        caller = scope.get(CALLER_KEY)
        if caller is not None and not caller.sees_session(sid):
            return
        for name, value in scope["headers"]:
            if name == CLIENT_ID_HEADER:
                session = self.bridge.get_session(sid)
                client_id = value.decode("latin-1")
                if client_id not in session.clients:
                    session.adopt_client(client_id)
                return

    async def _owner(self, sid: str) -> Owner | None:
        """Who holds ``sid``'s lease, as the store says now."""
        leases = self.leases
        return await self.journal.store._read(lambda conn: leases.owner(conn, sid))

    async def _route(self, sid: str, scope: Any) -> Owner | None:
        """The owner to forward to, else ``None`` (serve here, adopted if due). An
        adoption another instance won meanwhile (its sweep, say) is looked up again
        and forwarded to. Only a caller who sees the session causes its adoption:
        another principal's request is served here unadopted (its 404)."""
        leases = self.leases
        for _ in range(2):
            owner = await self._owner(sid)
            if owner is None:
                return None
            if owner.instance != leases.instance and owner.live:
                return owner
            if not await self._may_adopt(sid, scope):
                return None
            if await self.fleet.adopt(sid):   # expired, or ours but not live here
                return None
        return None

    async def _may_adopt(self, sid: str, scope: Any) -> bool:
        """Whether the request's caller (none: no principals) sees the session: its
        maker, read from the journal, unless an admin or ``--share-sessions``."""
        caller = scope.get(CALLER_KEY)
        if caller is None or caller.sees_session(sid):
            return True
        return await self.fleet.maker_seen(sid, caller.sees)

    async def _forward(self, owner: Owner, scope: Any, receive: Any, send: Any,
                       again: bool = True) -> None:
        """Relay to ``owner``; when it answers 404 because the session moved meanwhile
        (``again``: once), route the request anew: to the new owner, or here."""
        url, leases, sid = owner.url or "", self.leases, session_of(scope["path"]) or ""

        async def alive() -> bool:
            return await self.journal.store._read(
                lambda conn: leases.alive(conn, owner.instance))

        async def moved() -> bool:
            now = await self._owner(sid)
            return now is not None and (now.instance, now.token) != (owner.instance,
                                                                     owner.token)

        try:
            if not url:
                raise OwnerUnreachableError("the owner advertises no URL")
            self.stats.forwards += 1   # attempts; the failures are counted apart
            caller = scope.get(CALLER_KEY)
            if caller is not None:   # the owner counts it against the rate limits
                caller.uncharge()
            await self.forwarder.relay(url, scope, receive, send, alive,
                                       moved if again else None)
        except OwnerMovedError as exc:
            self.stats.forwards_rerouted += 1
            log.info("session %s moved while a request was forwarded to %s: routed again",
                     sid, url)
            await self._not_live_here(sid, scope, replayed(exc.body, receive), send,
                                      again=False)
        except OwnerUnreachableError as exc:   # OwnerLostError too: told apart
            self.stats.forward_failures += 1
            lost = isinstance(exc, OwnerLostError)
            log.warning("a request for a session owned elsewhere %s %s: %s",
                        "got no answer (its outcome is unknown) from" if lost
                        else "could not be forwarded to", url or "(no URL)", exc)
            await _refuse(send, LOST if lost else UNREACHABLE, 5)


async def _refuse(send: Any, body: bytes, retry_after: int) -> None:
    """A 503 in the REST door's shape, with ``Retry-After``."""
    await send({"type": "http.response.start", "status": 503, "headers": [
        (b"content-type", b"application/json"),
        (b"retry-after", str(retry_after).encode()),
        (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
