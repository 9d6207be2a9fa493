"""What the adapter remembers across connections: the editor's sessions (with the
last event it saw of each), its requests awaiting an answer, and the server's
requests awaiting the editor.

    book = Book()
    book.session(sid).seen(event_id=5, epoch="e1")    # False: seen already (a duplicate)
    call = book.add_call(editor_id=3, method="session/prompt", payload=..., session_id=sid)
    book.cursor(sid)                                  # (last event id to resume after, epoch)

Contracts:

* ``Session.seen`` is the one dedupe rule: under the epoch it knows, an event id at
  or below the last one seen is a duplicate; a new epoch is adopted (the server
  resynchronised: ids of two epochs cannot be compared). After ``replay`` (the
  editor's own ``session/load`` of a session it saw) the history replayed from the
  first event is forwarded again, in order, until it reaches the last event seen.
* ``cursor`` resumes after the last event the editor saw, except that a server
  request the editor has not answered yet (or that the server has not reported
  resolved) moves it back before that request, so the new connection asks it again
  and can take the answer (the adapter drops the repeated question, and sends the
  answer again when the editor gave one).
* Server request ids are remembered in a bounded set once answered (``ANSWERED``),
  so a question asked again after a reconnect is not put to the editor twice.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

ANSWERED = 4096
# Requests that may be sent again after a reconnect: the same request twice does
# what it did once (a new session at worst leaves an idle one, which the server
# reaps). session/prompt is sent again under its prompt id, which the server
# admits once. Any other request in flight when the link dropped fails instead.
REPEATABLE = frozenset({
    "session/prompt", "session/new", "session/load", "session/resume", "session/list",
    "session/set_mode", "session/set_config_option", "session/set_model", "session/close",
    "session/delete", "authenticate", "logout",
})


@dataclass
class Session:
    session_id: str
    cwd: str | None = None
    mcp_servers: Any = None
    epoch: str | None = None
    last_id: int = 0
    replayed_id: int | None = None   # the editor's own load: its replay, up to here
    ended_here: bool = False   # the server ended it (its agent died): load it again first

    def replay(self) -> None:
        """The editor loads the session again: the history it asked for is not a
        duplicate. The replay comes in order from the first event; it ends once it
        reaches the last event seen."""
        self.replayed_id = 0 if self.last_id else None

    def seen(self, event_id: int, epoch: str) -> bool:
        """Record an event; ``False`` when the editor has had it already."""
        if self.replayed_id is not None and epoch == self.epoch:
            if event_id <= self.replayed_id:
                return False
            self.replayed_id = event_id if event_id < self.last_id else None
            self.last_id = max(self.last_id, event_id)
            return True
        self.replayed_id = None
        if epoch == self.epoch and event_id <= self.last_id:
            return False
        self.epoch, self.last_id = epoch, event_id
        return True


@dataclass
class Call:
    """An editor request sent to the server (or waiting to be), by server id."""

    server_id: int
    editor_id: Any
    method: str
    payload: bytes                 # the request as the server gets it (server id)
    session_id: str | None = None
    internal: bool = False         # the adapter's own (re-attaching a session)
    params: dict[str, Any] | None = None   # session/new, load, resume, fork: to register
    sent: bool = False             # on a link (else still in the outbox)
    attempts: int = 0              # links lost while it was in flight
    new_session: bool = False      # a load/resume that registered its session
    answer: bytes | None = None    # internal: the server's answer, once it came
    reloaded: bool = False         # sent again once its session was loaded again
    done: Any = None               # internal: an anyio.Event set with ``answer``


@dataclass
class Asked:
    """A request of the server to the editor (a permission, ...). A permission's
    entry lives until the server says it is resolved (``permission_resolved``): an
    answer written to a link that was already dying is sent again after reconnecting."""

    session_id: str | None
    event_id: int | None
    method: str = ""
    answer: bytes | None = None    # the editor's answer, once given
    epoch: str | None = None       # the event epoch it was asked under


@dataclass
class Book:
    sessions: dict[str, Session] = field(default_factory=dict)
    calls: dict[int, Call] = field(default_factory=dict)
    asked: dict[Any, Asked] = field(default_factory=dict)     # by key(request id)
    answered: OrderedDict[Any, None] = field(default_factory=OrderedDict)
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def session(self, session_id: str) -> Session:
        found = self.sessions.get(session_id)
        if found is None:
            found = self.sessions[session_id] = Session(session_id)
        return found

    def add_call(self, editor_id: Any, method: str, payload: bytes,
                 session_id: str | None = None, *, internal: bool = False,
                 server_id: int | None = None) -> Call:
        call = Call(server_id if server_id is not None else next(self.ids), editor_id, method,
                    payload, session_id, internal)
        self.calls[call.server_id] = call
        return call

    def next_id(self) -> int:
        return next(self.ids)

    def cursor(self, session_id: str) -> tuple[int, str | None]:
        session = self.session(session_id)
        last = session.last_id
        for asked in self.asked.values():
            if asked.session_id == session_id and asked.event_id is not None \
                    and asked.epoch in (None, session.epoch):
                last = min(last, asked.event_id - 1)
        return max(0, last), session.epoch

    def stale_asked(self, session_id: str, epoch: str | None) -> list[Any]:
        """The session's event epoch became ``epoch`` (the server resynchronised:
        its history before is gone, and with it the questions it asked then): those
        questions are forgotten; the ids of the ones the editor has not answered (to be
        withdrawn) are returned, and count as answered from now on."""
        stale = [k for k, a in self.asked.items()
                 if a.session_id == session_id and a.epoch is not None and a.epoch != epoch]
        withdrawn = []
        for request_key in stale:
            asked = self.asked.pop(request_key)
            if asked.answer is None:
                withdrawn.append(request_key[1])
                self.remember_answered(request_key[1])
        return withdrawn

    def remember_answered(self, request_id: Any) -> None:
        self.answered[key(request_id)] = None
        while len(self.answered) > ANSWERED:
            self.answered.popitem(last=False)

    def was_answered(self, request_id: Any) -> bool:
        return key(request_id) in self.answered

    def forget_session(self, session_id: str) -> list[Call]:
        """Drop a session; its calls (to be failed by the caller)."""
        self.sessions.pop(session_id, None)
        for request_id in [k for k, a in self.asked.items() if a.session_id == session_id]:
            del self.asked[request_id]
        calls = [c for c in self.calls.values() if c.session_id == session_id and not c.internal]
        for call in calls:
            del self.calls[call.server_id]
        return calls


def key(request_id: Any) -> Any:
    """A dict key for a JSON-RPC id: ``1`` and ``"1"`` are different ids."""
    return (type(request_id), request_id)
