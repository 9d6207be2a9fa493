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
  Should stdin close with no ``initialize`` answered after one failed, ``run``
  returns ``EXIT_NOT_STARTED`` (1), not 0.
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
* **A session the server ended but keeps** (its agent died, the idle timeout) is
  loaded again before the editor's next request of it (``from_server``,
  ``reconnect._load_ended``); a request answered "no such session" meanwhile is sent
  once more after that load.
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
* **Cancels do not wait behind a 503** (Streamable HTTP): while the message at the
  head of the outbox waits to go again after a 503, the editor's cancels behind it
  (``session/cancel``, ``$/cancel_request``) that no message of their session
  precedes go at once; a cancel of that message withdraws it (a prompt is answered
  ``stopReason: "cancelled"``, a request ``-32800``; ``reconnect._cancel_early``).
* **Seams.** ``clock`` (monotonic seconds and sleeping) and ``connect`` (``open_link``)
  are injected; tests pass a fake clock and a scripted server.
* **Bounds.** Messages waiting for the link: ``OUTBOX_BYTES`` (past it a request is
  refused at once, a notification or an answer dropped with a line on stderr).
  Editor lines: the reader's cap (past it ``-32600``).
* stdout carries only protocol (``EditorWriter``); diagnostics go to the
  ``acp_server.connect`` logger (stderr); the token is never logged.

``Relay`` is put together from its parts: the editor's side is here (its lines, the
outbox, ``initialize``), what the server sends in ``from_server``, the link's life
(connecting, reconnecting, resending, giving up) in ``reconnect``, re-attaching the
sessions in ``reattach``. Their names stay importable from here.
"""

from __future__ import annotations

import logging
import uuid
from collections import deque
from collections.abc import AsyncIterable
from typing import Any

import anyio
import anyio.abc

from acp_server.connect import wire
from acp_server.connect.from_server import (
    QWEN_NOTIFY,
    REGISTERS,
    RESOLVED_KINDS,
    FromServer,
)
from acp_server.connect.link import Link, StartupError, Target, open_link
from acp_server.connect.reattach import AGENT_META, CURSOR_META, Reattach
from acp_server.connect.reconnect import (
    HEALTHY_AFTER_S,
    MAX_ATTEMPTS,
    RESOLVED_BY_EVENT,
    Backoff,
    Clock,
    Connect,
    GaveUp,
    Outgoing,
    Reconnect,
)
from acp_server.connect.state import Book, Call, key
from acp_server.connect.stdio import EditorWriter, TooLong

__all__ = ["HEALTHY_AFTER_S", "MAX_ATTEMPTS", "OUTBOX_BYTES", "PROMPT_ID_META", "QWEN_NOTIFY",
           "REGISTERS", "RESOLVED_BY_EVENT", "RESOLVED_KINDS", "RESTORING", "RESUMABLE_META",
           "Backoff", "Clock", "Connect", "GaveUp", "Outgoing", "Relay"]

log = logging.getLogger("acp_server.connect")

EXIT_NOT_STARTED = 1   # stdin closed after a failed initialize, none answered since
OUTBOX_BYTES = 64 << 20
PROMPT_ID_META = "acp-server/promptId"
RESUMABLE_META = "acp-server/resumable"
RESTORING = frozenset({"session/new", "session/load", "session/resume"})

_NOT_A_REQUEST = object()


def _request_id(item: bytes | TooLong) -> Any:
    """The id of ``item`` when it is a request, else ``_NOT_A_REQUEST``."""
    try:
        msg = wire.parse(item) if isinstance(item, bytes) else None
    except Exception:
        return _NOT_A_REQUEST
    return msg.id if msg is not None and msg.is_request else _NOT_A_REQUEST


class Relay(FromServer, Reconnect, Reattach):
    """The editor's side here (its lines, the outbox, ``initialize``); the server's in
    ``FromServer``, the link's life in ``Reconnect``, re-attaching in ``Reattach``."""

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
        self._start_failed = False             # an ``initialize`` got a StartupError

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
        if self.exit_code == 0 and self._start_failed and self.server_init is None:
            return EXIT_NOT_STARTED   # the editor went away: the adapter never started
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
                                   else msg.raw, sid,
                                   cancels=sid if method == "session/cancel" else None))
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
                               call.session_id, cancel_of=call))

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

    async def _initialize(self, msg: wire.Message) -> None:
        if self.server_init is not None:   # again: the same answer
            await self.out.send(wire.result(msg.id, self.server_init))
            return
        members = wire.set_meta(msg.members, RESUMABLE_META, True)
        self.init_members = members
        assert self._tg is not None
        answer = await self._tg.start(self._supervise)
        if isinstance(answer, StartupError):
            self._start_failed = True
            log.error("%s", answer)
            await self.out.send(wire.error(msg.id, wire.INTERNAL_ERROR,
                                           f"acp-server connect: {answer}",
                                           {"errorKind": answer.kind}))
            return
        await self.out.send(wire.with_id(answer.members, msg.id))

    async def _fail(self, call: Call, message: str, kind: str,
                    data: dict[str, Any] | None = None) -> None:
        if call.editor_id is None and call.internal:
            return
        await self.out.send(wire.error(call.editor_id, wire.INTERNAL_ERROR,
                                       f"acp-server connect: {message}",
                                       {"errorKind": kind, **(data or {})}))
