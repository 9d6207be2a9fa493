"""The relay between one editor (stdio) and one acp-server ``/acp``, across reconnects.

    relay = Relay(Target(url, token), out=writer, agent="claude", give_up_after_s=600)
    code = await relay.run(LineReader(stdin_reader(), max_bytes=32 << 20))

Contracts:

* **Pass-through.** Every editor message goes to the server and every server message
  to the editor, known or not, members unknown to us kept as sent. Request ids are
  rewritten on the way to the server (the adapter's own requests share that id
  space) and back. The adapter adds to ``params._meta`` only: the prompt id of a
  ``session/prompt``, the ``--agent`` of ``session/new`` / ``load`` / ``resume``, and
  ``acp-server/resumable`` to ``initialize``; it removes the event marker the server
  adds to each event (``acp_http.dispatch``).
* **Start-up.** Nothing is connected before the editor's ``initialize``. If the server
  cannot be reached, refuses the token or is not ACP, that ``initialize`` gets an
  error naming the cause, one line goes to stderr, and the adapter keeps reading (a
  later ``initialize`` tries again). Requests before ``initialize`` get ``-32600``.
* **Bad input.** Nothing the editor sends ends the adapter: a line that is not JSON
  gets ``-32700``, one that is not a JSON-RPC message ``-32600``, with the codes the
  server gives the same input (``wire.parse_editor``); params that are not an
  object on a method whose ``_meta`` it adds to get ``-32602``; a line whose relaying
  fails unexpectedly is logged and, when it is a request, answered ``-32603``.
* **Reconnect.** A lost link is reconnected with capped exponential backoff and
  jitter (``Backoff``); then ``initialize`` again, then every session the editor
  uses is re-attached (``session/load``, or ``session/resume`` without
  ``loadSession``) after the last event the editor saw (``state.Book.cursor``),
  then the requests that were in flight are sent again when repeatable
  (``state.REPEATABLE``; a prompt under its prompt id is admitted once by the
  server) or fail with ``connection_lost``, then what the editor sent meanwhile, in
  order. Events are forwarded at most once (``state.Session.seen``). A session the
  server no longer has (its re-attach answered ``-32602``) fails its pending requests
  with ``session_lost``; any other error answer (a store outage, ...) drops the link
  and the re-attach is tried again on the next one, within the give-up window.
* **Refused credentials.** A reconnect answered 401/403 fails every pending request
  at once with ``unauthorized`` (one line on stderr); reconnecting goes on.
* **Giving up.** Down longer than ``give_up_after_s``: every pending request gets an
  error naming the server and the last failure, and ``run`` returns 1. The window
  opens at the first loss and is not reset by links that come up and drop again: only
  a healthy link (up ``HEALTHY_AFTER_S`` by the clock, or one that answered a request
  of the editor) closes it and resets the backoff.
* **Poison messages.** A message the server refuses for its size (HTTP 413, WebSocket
  close 1009: the largest sent on that link) fails alone with ``message_too_large``
  (a notification is dropped with a line on stderr), and nothing as large is sent
  again. A request in flight on ``MAX_ATTEMPTS`` links lost within
  ``HEALTHY_AFTER_S`` of connecting fails with ``connection_lost``.
* **Seams.** ``clock`` (monotonic seconds and sleeping) and ``connect`` (``open_link``)
  are injected; tests pass a fake clock and a scripted server.
* **Bounds.** Messages waiting for the link: ``OUTBOX_BYTES`` (past it a request is
  refused at once, a notification or an answer dropped with a line on stderr).
  Editor lines: the reader's cap (past it ``-32600``).
* stdout carries only protocol (``EditorWriter``); diagnostics go to the
  ``acp_server.connect`` logger (stderr); the token is never logged.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
import uuid
from collections import deque
from collections.abc import AsyncIterable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc

from acp_server.connect import wire
from acp_server.connect.link import (
    TOO_BIG,
    Link,
    LinkLost,
    MessageTooLarge,
    StartupError,
    Target,
    open_link,
)
from acp_server.connect.reattach import (
    AGENT_META,
    CURSOR_META,
    FORGETS,
    Reattach,
    ReattachFailed,
)
from acp_server.connect.state import REPEATABLE, Asked, Book, Call, key
from acp_server.connect.stdio import EditorWriter, TooLong

log = logging.getLogger("acp_server.connect")

OUTBOX_BYTES = 64 << 20
HEALTHY_AFTER_S = 30.0   # a link up this long (or that answered the editor) was no flap
MAX_ATTEMPTS = 3         # links lost with a request in flight before it fails
PROMPT_ID_META = "acp-server/promptId"
RESUMABLE_META = "acp-server/resumable"
RESTORING = frozenset({"session/new", "session/load", "session/resume"})
REGISTERS = frozenset({"session/new", "session/fork"})
# Requests of the server kept until it reports them resolved (``_qwen/notify``).
RESOLVED_BY_EVENT = frozenset({"session/request_permission", "elicitation/create"})
RESOLVED_KINDS = frozenset({"permission_resolved", "elicitation_resolved"})
QWEN_NOTIFY = "_qwen/notify"


def _no_session(msg: wire.Message) -> bool:
    """An error answer that says the session does not exist (``-32602``)."""
    error = wire.decode(msg.members["error"]) if "error" in msg.members else None
    return isinstance(error, dict) and error.get("code") == wire.INVALID_PARAMS


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


Connect = Callable[[Target, bytes],
                   contextlib.AbstractAsyncContextManager[tuple[Link, bytes]]]


class GaveUp(Exception):
    pass


_NOT_A_REQUEST = object()


def _request_id(item: bytes | TooLong) -> Any:
    """The id of ``item`` when it is a request, else ``_NOT_A_REQUEST``."""
    try:
        msg = wire.parse(item) if isinstance(item, bytes) else None
    except Exception:
        return _NOT_A_REQUEST
    return msg.id if msg is not None and msg.is_request else _NOT_A_REQUEST


class Relay(Reattach):
    def __init__(self, target: Target, *, out: EditorWriter, agent: str | None = None,
                 give_up_after_s: float = 600.0, clock: Clock | None = None,
                 backoff: Backoff = Backoff(), connect: Connect = open_link) -> None:
        self.target = target
        self.connect = connect
        self.out = out
        self.agent = agent
        self.give_up_after_s = give_up_after_s
        self.clock = clock or Clock()
        self.backoff = backoff
        self.book = Book()
        self.outbox: deque[Outgoing] = deque()
        self.outbox_bytes = 0
        self._wake = anyio.Event()
        self.init_members: wire.Members | None = None   # the editor's initialize, ours added
        self.server_init: dict[str, Any] | None = None
        self.link: Link | None = None
        self.exit_code = 0
        self._tg: anyio.abc.TaskGroup | None = None
        self._connecting = anyio.Lock()
        self._healthy = False                  # this link answered the editor
        self._short_lived = False              # the last link lost within HEALTHY_AFTER_S
        self._blameless = False                # ... by a re-attach refused for now
        self._largest_sent: Outgoing | None = None   # on this link (a close 1009 blames it)
        self.refused_size: int | None = None   # the smallest message the server refused
        self._dropping = False                 # past OUTBOX_BYTES: dropping notifications
        self._refused = False                  # the server refuses the credentials now
        self._reading: anyio.CancelScope | None = None   # the editor's input (``stop``)
        self._stop_requested = False

    # -- the editor --------------------------------------------------------------------
    async def run(self, lines: AsyncIterable[bytes | TooLong]) -> int:
        async with anyio.create_task_group() as tg:
            self._tg = tg
            self._reading = anyio.CancelScope()
            if self._stop_requested:
                self._reading.cancel()
            with self._reading:
                async for item in lines:
                    await self._one_line(item)
            await self._quit()
            tg.cancel_scope.cancel()
        return self.exit_code

    def stop(self, exit_code: int = 0) -> None:
        """End ``run`` as if the editor had closed stdin (its turns are cancelled
        first): a signal to the adapter."""
        self.exit_code, self._stop_requested = exit_code, True
        if self._reading is not None:
            self._reading.cancel()

    async def _one_line(self, item: bytes | TooLong) -> None:
        """``from_editor``, where nothing a line can do ends the adapter: an unexpected
        failure is logged and a request gets ``-32603``."""
        try:
            await self.from_editor(item)
        except Exception as exc:
            log.exception("failed to relay a message of the editor")
            rpc_id = _request_id(item)
            if rpc_id is not _NOT_A_REQUEST:
                await self.out.send(wire.error(rpc_id, wire.INTERNAL_ERROR,
                                               f"acp-server connect: internal error "
                                               f"({type(exc).__name__})"))

    async def from_editor(self, item: bytes | TooLong) -> None:
        try:
            await self._from_editor(item)
        except wire.InvalidParams as exc:   # a method whose params we add to
            msg = wire.parse(item) if isinstance(item, bytes) else None
            if msg is not None and msg.is_request:
                await self.out.send(wire.error(msg.id, exc.code, str(exc)))
            else:
                log.warning("dropped a notification of the editor: %s", exc)

    async def _from_editor(self, item: bytes | TooLong) -> None:
        if isinstance(item, TooLong):
            await self.out.send(wire.error(None, wire.INVALID_REQUEST,
                                           f"Message too large: {item.size} bytes (limit "
                                           f"{self.target.max_bytes})"))
            return
        try:
            msg = wire.parse_editor(item)
        except wire.ParseError as exc:
            await self.out.send(wire.error(None, exc.code, str(exc)))
            return
        except wire.InvalidRequest as exc:
            await self.out.send(wire.error(exc.id, exc.code, str(exc)))
            return
        if msg.is_response:
            self._answer_server(msg)
        elif msg.method == "initialize":
            if msg.is_request:
                await self._initialize(msg)
            else:
                log.warning("dropped initialize sent as a notification (it needs an id)")
        elif self.server_init is None:
            if msg.is_request:
                await self.out.send(wire.error(msg.id, wire.INVALID_REQUEST,
                                               "Not initialized: send initialize first"))
        elif msg.method == "$/cancel_request":
            await self._cancel_request(msg)
        else:
            await self._to_server(msg)

    async def _to_server(self, msg: wire.Message) -> None:
        params = msg.params()
        sid = params.get("sessionId") if isinstance(params.get("sessionId"), str) else None
        members = msg.members
        method = msg.method or ""
        if self.agent is not None and method in RESTORING:
            members = wire.set_meta(members, AGENT_META, self.agent, replace=False)
        if not msg.is_request:
            if self.refused_size is not None and len(msg.raw) >= self.refused_size:
                log.error("dropped a notification of %d bytes: the server refused %d as "
                          "too large", len(msg.raw), self.refused_size)
                return
            self._enqueue(Outgoing(wire.encode(members) if members is not msg.members
                                   else msg.raw, sid))
            return
        if method == "session/prompt":
            members = wire.set_meta(members, PROMPT_ID_META, uuid.uuid4().hex, replace=False)
        if method == "session/load" and sid in self.book.sessions and self.resumable:
            # the server sends a connection only what it has not sent it: ask for the
            # whole history again, which the editor wants (``Session.replay``)
            members = wire.set_meta(members, CURSOR_META, 0, replace=False)
            self.book.sessions[sid].replay()
        server_id = self.book.next_id()
        call = self.book.add_call(msg.id, method, wire.with_id(members, server_id), sid,
                                  server_id=server_id)
        if method in RESTORING or method == "session/fork":
            call.params = params
        if method in ("session/load", "session/resume") and sid is not None:
            call.new_session = sid not in self.book.sessions
            self._register(sid, params)   # its replay may come before the answer
        if self.refused_size is not None and len(call.payload) >= self.refused_size:
            del self.book.calls[server_id]
            await self._fail(call, f"the server refused a message of {self.refused_size} "
                                   f"bytes as too large; this one has {len(call.payload)}",
                             "message_too_large", {"size": len(call.payload)})
            return
        if self.outbox_bytes + len(call.payload) > OUTBOX_BYTES:
            del self.book.calls[server_id]
            await self.out.send(wire.error(msg.id, wire.INTERNAL_ERROR,
                                           "acp-server connect: too much waiting for the "
                                           "connection to the server; try again later",
                                           {"errorKind": "queue_full"}))
            return
        self._enqueue(Outgoing(call.payload, sid, call))

    def _register(self, sid: str, params: dict[str, Any]) -> None:
        session = self.book.session(sid)
        cwd = params.get("cwd")
        session.cwd = cwd if isinstance(cwd, str) else session.cwd
        servers = params.get("mcpServers")
        session.mcp_servers = servers if isinstance(servers, list) else session.mcp_servers

    def _answer_server(self, msg: wire.Message) -> None:
        """The editor answers a request of the server (a permission, ...)."""
        asked = self.book.asked.get(key(msg.id))
        self.book.remember_answered(msg.id)
        if asked is None:
            self._enqueue(Outgoing(msg.raw, None))
            return
        asked.answer = msg.raw
        if asked.method in RESOLVED_BY_EVENT:
            self._enqueue(Outgoing(msg.raw, asked.session_id))
            return

        def delivered(request_key: Any = key(msg.id)) -> None:
            self.book.asked.pop(request_key, None)

        self._enqueue(Outgoing(msg.raw, asked.session_id, on_sent=delivered))

    async def _cancel_request(self, msg: wire.Message) -> None:
        target = msg.params().get("requestId")
        call = next((c for c in self.book.calls.values()
                     if not c.internal and c.editor_id == target
                     and type(c.editor_id) is type(target)), None)
        if call is None:
            return
        if not call.sent:   # still here: it never reaches the server
            self._drop_outgoing(call)
            del self.book.calls[call.server_id]
            if call.editor_id is not None:
                await self.out.send(wire.error(call.editor_id, wire.REQUEST_CANCELLED,
                                               "Request cancelled"))
            return
        self._enqueue(Outgoing(wire.notification("$/cancel_request",
                                                 {"requestId": call.server_id}),
                               call.session_id))

    def _enqueue(self, item: Outgoing) -> None:
        """Queue ``item`` for the link; past ``OUTBOX_BYTES`` a notification or an answer
        is dropped (one stderr line until the queue drains; requests are refused
        before they get here)."""
        if item.call is None and self.outbox_bytes + len(item.payload) > OUTBOX_BYTES:
            if not self._dropping:
                log.error("too much waiting for the connection to the server (%d bytes): "
                          "dropping the editor's notifications and answers until it "
                          "drains", self.outbox_bytes)
            self._dropping = True
            return
        self.outbox.append(item)
        self.outbox_bytes += len(item.payload)
        self._wake.set()

    def _drop_outgoing(self, call: Call) -> None:
        for item in list(self.outbox):
            if item.call is call:
                self.outbox.remove(item)
                self.outbox_bytes -= len(item.payload)

    # -- initialize and the link's life ----------------------------------------------
    async def _initialize(self, msg: wire.Message) -> None:
        if self.server_init is not None:   # again: the same answer
            await self.out.send(wire.result(msg.id, self.server_init))
            return
        members = wire.set_meta(msg.members, RESUMABLE_META, True)
        self.init_members = members
        assert self._tg is not None
        answer = await self._tg.start(self._supervise)
        if isinstance(answer, StartupError):
            log.error("%s", answer)
            await self.out.send(wire.error(msg.id, wire.INTERNAL_ERROR,
                                           f"acp-server connect: {answer}",
                                           {"errorKind": answer.kind}))
            return
        await self.out.send(wire.with_id(answer.members, msg.id))

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
            if item.call is not None:
                item.call.sent = True   # before the write: an answer may come at once
            try:
                await link.send(item.payload, session_id=item.session_id)
            except LinkLost:
                if item.call is not None:
                    item.call.sent = False
                raise
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

    # -- the server ------------------------------------------------------------------------
    async def _from_server(self, link: Link, payload: bytes) -> None:
        try:
            msg = wire.parse(payload)
        except (wire.ParseError, wire.InvalidRequest) as exc:
            log.warning("dropped a message from the server: %s", exc)
            return
        if msg.is_response:
            await self._answered(link, msg)
            return
        event = wire.event_meta(msg.members)
        if event is not None:
            sid, event_id, epoch = event.get("sessionId"), event.get("id"), event.get("epoch")
            if isinstance(sid, str) and isinstance(event_id, int) and isinstance(epoch, str):
                session = self.book.session(sid)
                if session.epoch is not None and epoch != session.epoch:
                    await self._withdraw_stale(sid, epoch)
                if epoch == session.epoch and event_id > session.last_id + 1 \
                        and session.last_id:
                    log.warning("session %s: events %d to %d are no longer on the server",
                                sid, session.last_id + 1, event_id - 1)
                if not session.seen(event_id, epoch):
                    return
            payload = wire.without_event_meta(msg.members)
        withdrawn: bytes | None = None
        if msg.is_request:
            request_key = key(msg.id)
            if request_key in self.book.asked or self.book.was_answered(msg.id):
                return   # asked again after a reconnect: the editor has it already
            sid = msg.params().get("sessionId")
            self.book.asked[request_key] = Asked(
                sid if isinstance(sid, str) else None,
                event.get("id") if event is not None else None, msg.method or "",
                epoch=event.get("epoch") if event is not None else None)
        elif msg.method == QWEN_NOTIFY:
            withdrawn = self._resolved(msg.params())
        elif msg.method == "$/cancel_request" \
                and isinstance(target := msg.params().get("requestId"), (str, int)) \
                and self.book.was_answered(target):
            return   # withdrawn already (``_resolved``), or answered by the editor
        await self.out.send(payload)
        if withdrawn is not None:
            await self.out.send(withdrawn)

    def _resolved(self, params: dict[str, Any]) -> bytes | None:
        """A question of the server was resolved: forgotten; one the editor was asked
        and has not answered is withdrawn (``$/cancel_request``, returned to send), also
        when the resolution comes in a replay after a reconnect or a restart, where the
        server's own ``$/cancel_request`` went to a connection that is gone."""
        data = params.get("data")
        if params.get("kind") not in RESOLVED_KINDS or not isinstance(data, dict):
            return None
        request_id = data.get("requestId")
        if not isinstance(request_id, (str, int)):
            return None
        asked = self.book.asked.pop(key(request_id), None)
        if asked is None or asked.answer is not None:
            return None
        self.book.remember_answered(request_id)   # the server's own withdrawal is dropped
        return wire.notification("$/cancel_request", {"requestId": request_id})

    async def _answered(self, link: Link, msg: wire.Message) -> None:
        call = self.book.calls.pop(msg.id, None) if type(msg.id) is int else None
        if call is None:
            return   # answered on an earlier link, or not ours
        if call.internal:
            call.answer = msg.raw
            call.done.set()
            return
        self._healthy = True
        ok = "result" in msg.members
        result = wire.decode(msg.members["result"]) if ok else None
        if call.method in FORGETS and call.session_id in self.book.sessions \
                and not ok and _no_session(msg):
            # the editor's session ended meanwhile (reaped, or this request's first
            # copy took effect before a drop): ended is what it asked for
            await self._ended(call.session_id)   # type: ignore[arg-type]
            await self.out.send(wire.result(call.editor_id, {}))
            return
        if ok and call.method in REGISTERS and isinstance(result, dict) \
                and isinstance(result.get("sessionId"), str):
            self._register(result["sessionId"], call.params or {})
            await link.watch_session(result["sessionId"])
        elif call.method in FORGETS and ok and call.session_id is not None:
            await self._ended(call.session_id)
        elif not ok and call.new_session and call.session_id is not None:
            self.book.sessions.pop(call.session_id, None)   # it never was the editor's
        await self.out.send(wire.with_id(msg.members, call.editor_id))

    async def _ended(self, session_id: str) -> None:
        """The editor's session is closed or deleted: forgotten; a request of it still
        waiting (the server answers a closing session's prompts before the close, so
        none should be) gets an error rather than no answer ever."""
        for pending in self.book.forget_session(session_id):
            self._drop_outgoing(pending)
            await self._fail(pending, f"session {session_id} was closed",
                             "session_closed", {"sessionId": session_id})

    # -- after a reconnect -----------------------------------------------------------------
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

    async def _fail(self, call: Call, message: str, kind: str,
                    data: dict[str, Any] | None = None) -> None:
        if call.editor_id is None and call.internal:
            return
        await self.out.send(wire.error(call.editor_id, wire.INTERNAL_ERROR,
                                       f"acp-server connect: {message}",
                                       {"errorKind": kind, **(data or {})}))

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

    # -- the end -------------------------------------------------------------------------
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
            await link.close()
