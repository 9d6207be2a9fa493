"""Conversation state across responses (``previous_response_id``).

    sessions = LiveSessions(limit=8)
    session_id = sessions.take(previous_id, "reference")    # a live ACP session, or None
    evicted = sessions.keep(response_id, "reference", bridge, session_id)
    messages = await history(store, previous_id)           # [("user", "hi"), ("assistant", …)]
    prompt = history_prompt(previous_id, messages, "next question", embedded=True)

Contracts:

* ``LiveSessions`` keeps the ACP sessions of the last ``limit`` responses that
  completed (LRU; ``0`` keeps none). A continuation *takes* the session of its
  previous response (so two continuations of one response never share a session:
  the second gets the history instead), and the session is kept again under the new
  response once that one completes. ``keep`` and ``drop`` answer the sessions the
  caller must close; a session the bridge closed meanwhile (idle reaper, agent
  exit) is never answered by ``take``. Kept sessions count against the bridge's
  ``max_sessions``: one is kept only while the bridge is at most half full
  (``may_keep``), and the runner evicts kept sessions when a new one hits the limit.
* ``history`` walks ``previous_response_id`` links through the store, oldest turn
  first: each response's input messages (their roles) and its output text
  (``assistant``). A link to a deleted or purged response ends the walk; at most
  ``MAX_DEPTH`` responses are read. The history is bounded: its transcript holds at
  most ``max_chars`` characters (``MAX_HISTORY_CHARS`` by default), the most recent
  messages; the walk stops at the first message that does not fit whole, whose end
  is kept in what room is left, and a first ``system`` message (``CUT_NOTE``) says
  that earlier ones were left out. (A chain of a thousand 1 MiB responses would
  otherwise be one prompt of gigabytes, built in memory for every continuation.)
* ``history_prompt`` gives a fresh session the history as one ACP embedded resource
  (``text/plain``, one ``role: text`` line per message, URI
  ``lmsp://responses/<previous id>/history``) before the new text; to an agent
  without the ``embeddedContext`` prompt capability, as a text block instead.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import Any

from acp_server.store.tasks import TaskStore
from acp_server.lmsp.wire import decode_any
from bridge import Bridge
from bridge.errors import SessionNotFoundError

MAX_DEPTH = 1000
MAX_HISTORY_CHARS = 4 << 20   # of the transcript (``LmspConfig.history_chars``)
CUT_NOTE = "[earlier messages of this conversation are left out]"
Message = tuple[str, str]   # (role, text)


@dataclasses.dataclass(frozen=True, slots=True)
class LiveSession:
    model: str
    bridge: Bridge
    session_id: str


class LiveSessions:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._by_response: OrderedDict[str, LiveSession] = OrderedDict()

    def __len__(self) -> int:
        return len(self._by_response)

    def take(self, response_id: str, model: str) -> str | None:
        """The live session of ``response_id`` if it runs ``model`` (removed from here)."""
        live = self._by_response.get(response_id)
        if live is None or live.model != model:
            return None
        del self._by_response[response_id]
        try:
            live.bridge.get_session(live.session_id)
        except SessionNotFoundError:
            return None
        return live.session_id

    def keep(self, response_id: str, model: str, bridge: Bridge,
             session_id: str) -> list[LiveSession]:
        """Keep a completed response's session; answers what to close (evicted, or
        this one when nothing is kept)."""
        entry = LiveSession(model, bridge, session_id)
        if self.limit <= 0:
            return [entry]
        self._by_response[response_id] = entry
        evicted = []
        while len(self._by_response) > self.limit:
            evicted.append(self._by_response.popitem(last=False)[1])
        return evicted

    def drop(self, response_id: str) -> LiveSession | None:
        return self._by_response.pop(response_id, None)

    def evict_oldest(self, bridge: Bridge) -> LiveSession | None:
        """The least recently kept session of ``bridge`` (removed), to make room."""
        for response_id, live in self._by_response.items():
            if live.bridge is bridge:
                del self._by_response[response_id]
                return live
        return None


def may_keep(bridge: Bridge) -> bool:
    """Kept sessions never crowd out the bridge's other clients: a session is kept only
    while the bridge holds at most half of its ``max_sessions``."""
    limit = bridge.options.session_limit
    return limit is None or len(bridge.sessions()) <= limit // 2


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(part["text"] for part in content
                         if isinstance(part, dict) and isinstance(part.get("text"), str))
    return ""


def input_messages(request: Any) -> list[Message]:
    """The messages of a response request's ``input`` (a string is one user message)."""
    value = request.get("input") if isinstance(request, dict) else None
    if isinstance(value, str):
        return [("user", value)]
    out: list[Message] = []
    for item in value if isinstance(value, list) else ():
        if isinstance(item, dict):
            out.append((str(item.get("role", "user")), _text_of(item.get("content"))))
    return out


def output_messages(response: bytes | None) -> list[Message]:
    """The assistant text of a stored response object (one message per output item)."""
    body = decode_any(response) if response else None
    items = body.get("output") if isinstance(body, dict) else None
    out: list[Message] = []
    for item in items if isinstance(items, list) else ():
        if isinstance(item, dict) and item.get("type") == "message":
            out.append(("assistant", _text_of(item.get("content"))))
    return out


async def history(store: TaskStore, previous_id: str, *,
                  max_chars: int = MAX_HISTORY_CHARS) -> list[Message]:
    """The conversation up to and including ``previous_id``, oldest first, its
    ``transcript`` at most ``max_chars`` long (the most recent messages; see the
    module docstring)."""
    kept: list[Message] = []   # newest first
    room = max_chars + 1   # each message counts its line break; the last has none
    seen: set[str] = set()
    response_id: Any = previous_id
    while isinstance(response_id, str) and response_id not in seen and len(seen) < MAX_DEPTH:
        seen.add(response_id)
        record = await store.get_by_response(response_id)
        if record is None:
            break
        request = decode_any(record.request)
        turn = input_messages(request) + output_messages(record.response)
        for role, text in reversed(turn):
            size = _line_chars(role, text)
            if size > room:
                return _cut([*kept, (role, text)], max_chars)
            kept.append((role, text))
            room -= size
        response_id = request.get("previous_response_id") if isinstance(request, dict) else None
    return kept[::-1]


def _line_chars(role: str, text: str) -> int:
    """What a message adds to the transcript: ``role: text`` and its line break."""
    return len(role) + 2 + len(text) + 1


def _cut(newest_first: list[Message], max_chars: int) -> list[Message]:
    """The note, then the most recent messages that fit in what room it leaves, the
    oldest of them cut to its end when it does not fit whole."""
    room = max_chars + 1 - _line_chars("system", CUT_NOTE)
    if room < 0:   # not even the note fits
        return []
    kept: list[Message] = []
    for role, text in newest_first:
        size = _line_chars(role, text)
        if size > room:
            tail = room - _line_chars(role, "")
            if tail > 0:
                kept.append((role, text[-tail:]))
            break
        kept.append((role, text))
        room -= size
    return [("system", CUT_NOTE), *kept[::-1]]


def transcript(messages: list[Message]) -> str:
    return "\n".join(f"{role}: {text}" for role, text in messages)


def history_prompt(previous_id: str, messages: list[Message], text: str, *,
                   embedded: bool) -> list[dict[str, Any]]:
    """The ACP prompt blocks of a continuation sent to a fresh session."""
    prompt: list[dict[str, Any]] = [{"type": "text", "text": text}]
    if not messages:
        return prompt
    if not embedded:
        return [{"type": "text", "text": transcript(messages)}, *prompt]
    return [{"type": "resource", "resource": {
        "uri": f"lmsp://responses/{previous_id}/history", "mimeType": "text/plain",
        "text": transcript(messages)}}, *prompt]
