"""What the server sends, the part of ``Relay`` that handles it: its events (forwarded
at most once), its requests (put to the editor once), and its answers to requests of
the editor or of the adapter.

    await relay._from_server(link, payload)    # one message of the server

Contracts:

* An event carries the server's marker (``wire.event_meta``): it is forwarded, the
  marker removed, unless ``state.Session.seen`` says the editor has it; a new event
  epoch withdraws the questions asked under the old one (``_withdraw_stale``); a
  gap in the ids is logged.
* A request of the server is put to the editor once: asked again after a reconnect,
  or answered already, it is dropped. A question resolved by event
  (``_qwen/notify`` ``permission_resolved`` / ``elicitation_resolved``) that the
  editor has not answered is withdrawn with a ``$/cancel_request``; the server's own
  ``$/cancel_request`` of one withdrawn or answered already is dropped.
* An answer goes back under the editor's id; one to an adapter's own request
  (``Call.internal``) wakes its waiter; one to nothing pending (answered on an
  earlier link) is dropped. Answers register the sessions ``session/new`` and
  ``session/fork`` made, forget those ``session/close`` / ``delete`` ended (a
  ``-32602`` to those, the session gone meanwhile, is answered ``{}``), and drop a
  ``session/load`` / ``resume`` the server refused.
* A session the server ends but keeps (``_qwen/notify`` ``session_died``, or
  ``session_closed`` by the idle timeout) is marked (``Session.ended_here``): it is
  loaded again before the editor's next request of it goes out. A request of a
  session the editor uses answered "no such session" (``-32602``: sent before that
  notice came) is sent once more after such a load; a second refusal is the editor's.
* A message that is not JSON-RPC is dropped with a line on stderr.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from acp_server.connect import wire
from acp_server.connect.link import Link
from acp_server.connect.reattach import ENDS_OR_LOADS, FORGETS
from acp_server.connect.state import Asked, Book, Call, key

log = logging.getLogger("acp_server.connect")

REGISTERS = frozenset({"session/new", "session/fork"})
RESOLVED_KINDS = frozenset({"permission_resolved", "elicitation_resolved"})
QWEN_NOTIFY = "_qwen/notify"
KEPT_CLOSES = frozenset({"idle_timeout"})   # closes the server keeps the session through


def _invalid_params(msg: wire.Message) -> dict[str, Any] | None:
    """A ``-32602`` error answer's error, else ``None``."""
    error = wire.decode(msg.members["error"]) if "error" in msg.members else None
    return error if isinstance(error, dict) and error.get("code") == wire.INVALID_PARAMS \
        else None


def _no_session(msg: wire.Message) -> bool:
    """An error answer that says the session does not exist (``-32602``)."""
    return _invalid_params(msg) is not None


def _session_gone(msg: wire.Message) -> bool:
    """``_no_session``, and the server says so in words (``-32602`` also answers
    params that are merely invalid): ``No session with id "…"``."""
    error = _invalid_params(msg)
    return error is not None and str(error.get("message", "")).startswith("No session")


class FromServer:
    """Mixed into ``Relay``, whose state it reads (``book``, ``out``) and whose
    ``_register``, ``_withdraw_stale``, ``_fail`` and ``_drop_outgoing`` it calls."""

    book: Book
    out: Any   # the editor's writer (``EditorWriter``)
    _healthy: bool

    if TYPE_CHECKING:   # the other parts of ``Relay``
        def _register(self, sid: str, params: dict[str, Any]) -> None: ...

        async def _withdraw_stale(self, sid: str, epoch: str | None) -> None: ...

        async def _fail(self, call: Call, message: str, kind: str,
                        data: dict[str, Any] | None = None) -> None: ...

        def _drop_outgoing(self, call: Call) -> None: ...

        def _send_again(self, call: Call) -> None: ...

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
            self._ended_by_server(msg.params())
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

    def _ended_by_server(self, params: dict[str, Any]) -> None:
        """The server ended a session of the editor that it keeps (its agent died, the
        idle timeout): it is loaded again before the editor's next request of it
        (``reconnect._send_outbox``), so the conversation goes on in the same session."""
        data = params.get("data")
        kind = params.get("kind")
        if not isinstance(data, dict) or not (
                kind == "session_died"
                or (kind == "session_closed" and data.get("reason") in KEPT_CLOSES)):
            return
        session = self.book.sessions.get(data.get("sessionId"))   # type: ignore[arg-type]
        if session is not None:
            session.ended_here = True

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
        if not ok and not call.reloaded and call.method not in ENDS_OR_LOADS \
                and call.session_id in self.book.sessions and _session_gone(msg):
            # the server ended the session (its agent died) before the notice of it
            # reached us: loaded again, then this request goes once more
            self.book.sessions[call.session_id].ended_here = True   # type: ignore[index]
            call.reloaded = True
            self._send_again(call)
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
