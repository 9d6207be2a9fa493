"""The link's life: the part of ``Relay`` that owns the connection to the server.
It connects, relays over the link until it is lost, reconnects with capped
exponential backoff, re-attaches and resends, and gives up.

    answer = await tg.start(relay._supervise)    # the first link's initialize answer,
                                                  # or the StartupError that refused it
    Backoff(first_s=0.5, cap_s=30.0).delay(attempt)   # the wait before a reconnect
    Clock().now(); await Clock().sleep(s)        # monotonic seconds (tests pass their own)

Contracts (``relay``'s **Reconnect**, **Refused credentials**, **Giving up**,
**Poison messages** and **Seams** bullets say them for the whole relay):

* ``_supervise`` reports the first link's outcome through ``task_status`` (the
  server's ``initialize`` answer, or the ``StartupError``) and from then on owns the
  link: on a loss it waits ``Backoff.delay`` (never past the give-up window) and
  connects again; a link up ``HEALTHY_AFTER_S`` by the clock, or one that answered a
  request of the editor, closes the window and resets the backoff.
* ``_serve`` relays over one link: the server's messages to ``_from_server`` (one that
  fails is logged and dropped), and after a reconnect ``_reattach`` first, then the
  outbox in order. ``Relay.link`` is the link only while the outbox may be sent on it.
  While the head waits to go again after a 503 (the link's ``wait``), the cancels
  behind it go (``_cancel_early``), or withdraw it when they cancel it (``_withdrawn``).
* ``_reattach`` re-attaches every session (``Reattach``), then puts back in front of
  the outbox the requests in flight that are ``REPEATABLE`` (a prompt only when the
  server is resumable), failing the others with ``connection_lost``, and the editor's
  answers to questions the server resolves by event. A request in flight on
  ``MAX_ATTEMPTS`` links lost within ``HEALTHY_AFTER_S`` fails instead.
* A message refused for its size (``MessageTooLarge``, or a close 1009 blaming the
  largest sent on that link) fails alone (``_too_large``); ``refused_size`` keeps
  anything as large from being sent again.
* ``_unauthorized`` fails every pending request at once; ``_give_up`` fails them all,
  sets ``exit_code`` 1 and ends ``run``; ``_quit`` cancels the editor's turns and
  closes the link, bounded, when the editor closes stdin.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from acp_server.connect import wire
from acp_server.connect.link import TOO_BIG, Link, LinkLost, MessageTooLarge, StartupError, Target
from acp_server.connect.reattach import ENDS_OR_LOADS, ReattachFailed
from acp_server.connect.state import REPEATABLE, Book, Call
from acp_server.connect.stdio import EditorWriter

log = logging.getLogger("acp_server.connect")

HEALTHY_AFTER_S = 30.0   # a link up this long (or that answered the editor) was no flap
MAX_ATTEMPTS = 3         # links lost with a request in flight before it fails
QUIT_CLOSE_S = 10.0      # the close handshake when the editor quits (its own bound)
# Requests of the server kept until it reports them resolved (``_qwen/notify``).
RESOLVED_BY_EVENT = frozenset({"session/request_permission", "elicitation/create"})


class Clock:
    """Monotonic seconds and sleeping in them (tests pass their own)."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)


@dataclass(frozen=True)
class Backoff:
    """``first_s`` doubling up to ``cap_s``; each delay drawn in its upper half."""

    first_s: float = 0.5
    cap_s: float = 30.0

    def delay(self, attempt: int, rng: Callable[[], float] = random.random) -> float:
        ceiling = min(self.cap_s, self.first_s * 2 ** min(attempt, 30))
        return ceiling / 2 + rng() * ceiling / 2


@dataclass
class Outgoing:
    payload: bytes
    session_id: str | None
    call: Call | None = None
    on_sent: Callable[[], None] | None = None
    cancels: str | None = None        # a ``session/cancel`` of this session
    cancel_of: Call | None = None     # a ``$/cancel_request`` of this request
    refused: bool = False             # answered 503 when it went ahead (``_cancel_early``)


class Withdrawn(Exception):
    """The editor cancelled the message waiting to go again after a 503 (``by``)."""

    def __init__(self, by: Outgoing) -> None:
        super().__init__("withdrawn")
        self.by = by


class _NotNow(Exception):
    pass


async def _not_now(seconds: float) -> None:
    raise _NotNow


Connect = Callable[[Target, bytes],
                   contextlib.AbstractAsyncContextManager[tuple[Link, bytes]]]


class GaveUp(Exception):
    pass


class Reconnect:
    """Mixed into ``Relay``, whose state it keeps (``Relay.__init__``) and whose
    ``_from_server``, ``_reattach_sessions`` / ``_session``, ``_fail`` and ``_drop_outgoing``
    it calls."""

    target: Target
    connect: Connect
    out: EditorWriter
    clock: Clock
    backoff: Backoff
    give_up_after_s: float
    book: Book
    outbox: deque[Outgoing]
    outbox_bytes: int
    _wake: anyio.Event
    init_members: wire.Members | None
    server_init: dict[str, Any] | None
    link: Link | None
    exit_code: int
    _tg: anyio.abc.TaskGroup | None
    _healthy: bool
    _short_lived: bool
    _blameless: bool
    _largest_sent: Outgoing | None
    refused_size: int | None
    _dropping: bool
    _refused: bool

    if TYPE_CHECKING:   # the other parts of ``Relay``
        @property
        def resumable(self) -> bool: ...

        async def _from_server(self, link: Link, payload: bytes) -> None: ...

        async def _reattach_sessions(self, link: Link) -> None: ...

        async def _reattach_session(self, link: Link, sid: str) -> None: ...

        async def _fail(self, call: Call, message: str, kind: str,
                        data: dict[str, Any] | None = None) -> None: ...

        def _drop_outgoing(self, call: Call) -> None: ...

    def _init_payload(self) -> bytes:
        assert self.init_members is not None
        return wire.with_id(self.init_members, 0)

    def _accept(self, raw: bytes) -> wire.Message:
        """The server's ``initialize`` answer; ``StartupError`` unless it is a result."""
        try:
            answer: wire.Message | None = wire.parse(raw)
        except (wire.ParseError, wire.InvalidRequest):
            answer = None
        result = wire.decode(answer.members["result"]) if answer is not None \
            and "result" in answer.members else None
        if answer is None or not isinstance(result, dict):
            detail = wire.decode(answer.members["error"]) if answer is not None \
                and "error" in answer.members else raw[:200]
            raise StartupError(f"{self.target.shown} refused initialize: {detail}",
                               kind="initialize_refused")
        self.server_init = result
        return answer

    async def _supervise(self, *, task_status: anyio.abc.TaskStatus[Any]) -> None:
        """Own the link: connect, relay, and on a loss reconnect (see the contracts).

        The give-up window opens at the first loss and stays open (and the backoff keeps
        growing) across links that come up and drop again, until one is healthy: up
        ``HEALTHY_AFTER_S`` or it answered a request of the editor."""
        first = True
        started = False
        attempt = 0
        down_since: float | None = None
        last = ""
        while True:
            if down_since is not None:
                remaining = down_since + self.give_up_after_s - self.clock.now()
                if remaining <= 0:
                    await self._give_up(last)
                await self.clock.sleep(min(self.backoff.delay(attempt), remaining))
                attempt += 1
            reason: str | None = None
            up_at: float | None = None
            try:
                async with self.connect(self.target, self._init_payload()) as (link, raw):
                    answer = self._accept(raw)
                    if first:
                        task_status.started(answer)
                        started = True
                    else:
                        log.warning("reconnected to %s (%s)", self.target.shown, link.transport)
                    up_at = self.clock.now()
                    self._healthy = False
                    self._refused = False
                    reason = await self._serve(link, first=first)
            except StartupError as exc:
                if first:
                    task_status.started(exc)
                    return
                last = str(exc)
                log.info("reconnect attempt %d failed: %s", attempt, exc)
                if exc.kind == "unauthorized":
                    await self._unauthorized(exc)
                continue
            except Exception as exc:   # the link failed on its way in or out
                if not started:
                    task_status.started(StartupError(
                        f"{self.target.shown} failed during initialize: {exc!r}",
                        kind="initialize_refused"))
                    return
                reason = reason or repr(exc)
            first = False
            last = reason or "closed"
            lived = self.clock.now() - up_at if up_at is not None else 0.0
            self._short_lived = lived < HEALTHY_AFTER_S
            if up_at is not None and (self._healthy or not self._short_lived):
                down_since, attempt = None, 0
            if down_since is None:
                down_since = self.clock.now()
            log.warning("connection to %s lost (%s); reconnecting", self.target.shown, last)

    async def _serve(self, link: Link, *, first: bool) -> str:
        """Relay over ``link`` until it is lost; the reason."""
        reason = "closed"
        code: int | None = None
        self._largest_sent = None
        try:
            async with anyio.create_task_group() as tg:
                async def pump() -> None:
                    nonlocal reason, code
                    try:
                        while True:
                            payload = await link.receive()
                            try:
                                await self._from_server(link, payload)
                            except (LinkLost, anyio.get_cancelled_exc_class()):
                                raise
                            except Exception:   # one bad message does not end the relay
                                log.exception("dropped a message from the server")
                    except LinkLost as exc:
                        reason, code = str(exc), exc.code
                    tg.cancel_scope.cancel()

                tg.start_soon(pump)
                try:
                    if not first:
                        await self._reattach(link)
                    self._blameless = False
                    self.link = link
                    await self._send_outbox(link)
                except ReattachFailed as exc:
                    reason, self._blameless = str(exc), True
                except LinkLost as exc:
                    reason, code = str(exc), code or exc.code
                tg.cancel_scope.cancel()
        finally:
            self.link = None
            for call in [c for c in self.book.calls.values() if c.internal]:
                del self.book.calls[call.server_id]
        if code == TOO_BIG and self._largest_sent is not None:
            await self._too_large(self._largest_sent, "the server closed the WebSocket "
                                                      f"({TOO_BIG}: message too big)")
        return reason

    async def _send_outbox(self, link: Link) -> None:
        while True:
            while not self.outbox:
                self._wake = anyio.Event()
                await self._wake.wait()
            item = self.outbox[0]
            if await self._load_ended(link, item):
                continue   # the outbox may have changed (a lost session's requests)
            if item.call is not None:
                item.call.sent = True   # before the write: an answer may come at once
            try:
                await link.send(item.payload, session_id=item.session_id,
                                wait=lambda s, head=item: self._retry_wait(link, head, s))
            except LinkLost:
                if item.call is not None:
                    item.call.sent = False
                raise
            except Withdrawn as exc:
                await self._withdrawn(item, exc.by)
                continue
            except MessageTooLarge as exc:
                if item.call is not None:
                    item.call.sent = False
                self._unqueue(item)
                await self._too_large(item, str(exc))
                continue
            self._unqueue(item)
            if self._largest_sent is None \
                    or len(item.payload) > len(self._largest_sent.payload):
                self._largest_sent = item
            if item.on_sent is not None:
                item.on_sent()

    async def _retry_wait(self, link: Link, head: Outgoing, seconds: float) -> None:
        """The server answered ``head`` 503: until it goes again, after ``seconds``,
        the editor's cancels queued behind it go at once (``_cancel_early``)."""
        deadline = anyio.current_time() + seconds
        while True:
            # made before the cancels go: one the editor sends while they do wakes it
            wake = self._wake = anyio.Event()
            await self._cancel_early(link, head)
            with anyio.move_on_at(deadline):
                await wake.wait()
            if anyio.current_time() >= deadline:
                return

    async def _cancel_early(self, link: Link, head: Outgoing) -> None:
        """Send the cancels queued behind ``head`` (waiting to go again after a 503)
        that nothing of their session precedes but ``head``; a cancel of ``head``
        itself (a ``session/cancel`` of its prompt, a ``$/cancel_request`` of it)
        withdraws it (``Withdrawn``): the server never took it."""
        call = head.call
        earlier: set[str | None] = set()   # sessions with a message waiting before
        for item in list(self.outbox):
            if item is head:
                continue
            if call is not None and (item.cancel_of is call or (
                    item.cancels is not None and item.cancels == head.session_id
                    and call.method == "session/prompt")):
                raise Withdrawn(item)
            if (item.cancels is None and item.cancel_of is None) or item.refused \
                    or item.session_id in earlier:
                earlier.add(item.session_id)
                continue
            try:
                await link.send(item.payload, session_id=item.session_id, wait=_not_now)
            except _NotNow:   # the server refuses it too for now: it keeps its place
                item.refused = True
                earlier.add(item.session_id)
                log.warning("the server answered a cancel of the editor 503 (busy): "
                            "it goes in order, after the message it answered 503 before")
                continue
            except MessageTooLarge as exc:
                self._remove(item)
                await self._too_large(item, str(exc))
                continue
            self._remove(item)

    async def _withdrawn(self, item: Outgoing, by: Outgoing) -> None:
        """``item`` (a request waiting to go again after a 503) was cancelled by ``by``:
        it is not sent; a prompt ends ``cancelled`` (as the agent would end it), a
        request cancelled by ``$/cancel_request`` gets ``-32800``."""
        call = item.call
        assert call is not None
        call.sent = False
        self._unqueue(item)
        self.book.calls.pop(call.server_id, None)
        log.warning("the editor cancelled a %s the server had not taken yet (HTTP 503): "
                    "it is not sent again", call.method)
        if call.editor_id is None:
            return
        if by.cancel_of is call:
            self._remove(by)   # it would name a request the server never had
            await self.out.send(wire.error(call.editor_id, wire.REQUEST_CANCELLED,
                                           "Request cancelled"))
        else:
            await self.out.send(wire.result(call.editor_id, {"stopReason": "cancelled"}))

    def _remove(self, item: Outgoing) -> None:
        with contextlib.suppress(ValueError):
            self.outbox.remove(item)
            self.outbox_bytes -= len(item.payload)
        if not self.outbox:
            self._dropping = False

    async def _load_ended(self, link: Link, item: Outgoing) -> bool:
        """Before a message of a session the server ended but keeps (its agent died:
        ``Session.ended_here``), the session is loaded again (``_reattach_session``:
        the server starts its agent again, seeded with the conversation); whether it
        was. A refused load is the next request's to meet: its own error answers."""
        session = self.book.sessions.get(item.session_id) if item.session_id else None
        if session is None or not session.ended_here \
                or (item.call is not None and item.call.method in ENDS_OR_LOADS):
            return False
        session.ended_here = False
        log.warning("session %s: the server ended it (its agent died); loading it again",
                    session.session_id)
        try:
            await self._reattach_session(link, session.session_id)
        except ReattachFailed as exc:
            log.error("session %s: loading it again failed: %s", session.session_id, exc)
        return True

    def _send_again(self, call: Call) -> None:
        """``call`` goes out once more, first (its session is loaded again before it)."""
        call.sent = False
        self.book.calls[call.server_id] = call
        self.outbox.appendleft(Outgoing(call.payload, call.session_id, call))
        self.outbox_bytes += len(call.payload)
        self._wake.set()

    def _unqueue(self, item: Outgoing) -> None:
        if self.outbox and self.outbox[0] is item:
            self.outbox.popleft()
            self.outbox_bytes -= len(item.payload)
        if not self.outbox:
            self._dropping = False

    async def _too_large(self, item: Outgoing, cause: str) -> None:
        """The server refused ``item`` for its size: it fails (a request) or is dropped,
        and nothing as large is sent again."""
        size = len(item.payload)
        self.refused_size = min(self.refused_size or size, size)
        log.error("%s: dropped a message of %d bytes", cause, size)
        call = item.call
        if call is not None and self.book.calls.pop(call.server_id, None) is not None:
            await self._fail(call, f"{cause}; the request was not sent again",
                             "message_too_large", {"size": size})

    async def _reattach(self, link: Link) -> None:
        """Re-attach every session (``Reattach``), then queue what was in flight again."""
        await self._reattach_sessions(link)
        resend: list[Call] = []
        for call in sorted(self.book.calls.values(), key=lambda c: c.server_id):
            if call.internal or not call.sent:
                continue
            call.attempts += self._short_lived and not self._blameless
            if call.attempts >= MAX_ATTEMPTS:
                del self.book.calls[call.server_id]
                await self._fail(call, f"the connection to the server was lost {MAX_ATTEMPTS} "
                                       f"times within {HEALTHY_AFTER_S:g} s of connecting "
                                       "while this request was in flight; it was not "
                                       "repeated again", "connection_lost")
            elif call.method in REPEATABLE and (call.method != "session/prompt"
                                                or self.resumable):
                call.sent = False
                resend.append(call)
            else:
                del self.book.calls[call.server_id]
                await self._fail(call, "the connection to the server was lost before the "
                                       "answer; the request was not repeated",
                                 "connection_lost")
        for call in reversed(resend):
            self.outbox.appendleft(Outgoing(call.payload, call.session_id, call))
            self.outbox_bytes += len(call.payload)
        for asked in self.book.asked.values():   # answers the server may not have had
            if asked.answer is not None and asked.method in RESOLVED_BY_EVENT:
                self.outbox.appendleft(Outgoing(asked.answer, asked.session_id))
                self.outbox_bytes += len(asked.answer)

    async def _unauthorized(self, exc: StartupError) -> None:
        """A reconnect refused the credentials (revoked, rotated, expired): waiting
        will not help the requests pending, so they fail now; reconnecting goes on
        within the give-up window (the server may accept the token again)."""
        if not self._refused:
            log.error("%s; pending requests fail, reconnecting goes on", exc)
        self._refused = True
        for call in sorted(self.book.calls.values(), key=lambda c: c.server_id):
            if call.internal:
                continue
            del self.book.calls[call.server_id]
            self._drop_outgoing(call)
            await self._fail(call, str(exc), "unauthorized")

    async def _give_up(self, last: str) -> None:
        message = (f"gave up after {self.give_up_after_s:g} s: {self.target.shown} "
                   f"unreachable (last error: {last})")
        log.error("%s", message)
        for call in sorted(self.book.calls.values(), key=lambda c: c.server_id):
            if not call.internal:
                await self._fail(call, message, "server_unreachable")
        self.book.calls.clear()
        self.exit_code = 1
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        await anyio.sleep_forever()

    async def _quit(self) -> None:
        """The editor closed stdin: its turns are cancelled (best effort, bounded)."""
        link = self.link
        if link is None:
            return
        prompting = {c.session_id for c in self.book.calls.values()
                     if c.method == "session/prompt" and c.session_id is not None}
        with anyio.move_on_after(2):
            for sid in prompting:
                with contextlib.suppress(LinkLost):
                    await link.send(wire.notification("session/cancel", {"sessionId": sid}),
                                    session_id=sid)
        # A bound of its own: the close handshake cut short (a loaded server slow to
        # answer it) and the process gone, the server may lose the close frame to the
        # reset and keep the sessions waiting for a reconnect (a CI run saw it).
        with anyio.move_on_after(QUIT_CLOSE_S):
            await link.close()
