"""The reference agent's logic, independent of transport (see ``bridge.agents.reference``
for the directives it understands and for the in-process and stdio front ends)::

    agent = ReferenceAgent(peer)            # peer: an AgentPeer (notify/request/crash)
    result = await agent.dispatch("session/new", {"cwd": "/w", "mcpServers": []})
    agent.handle_notification("session/cancel", {"sessionId": result["sessionId"]})

Contracts: ``dispatch`` returns a coroutine that answers the request or raises
``RequestError`` (a JSON-RPC error); its bookkeeping runs synchronously before it
returns. Agent-to-client traffic goes only through the peer.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio

from bridge.agents.base import RequestError
from bridge.agents.reference_settings import SessionSettings
from bridge.ids import uuid4_str
from bridge.jsonrpc import INTERNAL_ERROR, INVALID_PARAMS, METHOD_NOT_FOUND, RESOURCE_NOT_FOUND
from bridge.transcript import seeded

__all__ = [
    "AgentPeer",
    "Directives",
    "History",
    "ReferenceAgent",
    "SessionStore",
    "StoredSession",
    "parse_directives",
    "prompt_text",
    "split_chunks",
]

logger = logging.getLogger(__name__)

REQUESTED_SESSION_ID_META = "acp-server/requestedSessionId"
CRASH_EXIT_CODE = 3
AGENT_INFO = {"name": "acp-server-reference", "version": "0.1.0"}
PERMISSION_OPTIONS = (
    {"optionId": "allow_once", "name": "Allow once", "kind": "allow_once"},
    {"optionId": "allow_always", "name": "Allow always", "kind": "allow_always"},
    {"optionId": "reject_once", "name": "Reject", "kind": "reject_once"},
)
_ALLOWING = frozenset({"allow_once", "allow_always"})


class AgentPeer(Protocol):
    """The client side as the agent logic sees it (in-process or a stdio pipe)."""

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        """Send a notification; returns once it is delivered/written (ordered)."""

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        """Send a request and wait for the answer; an error answer raises ``RequestError``."""

    async def crash(self, exit_code: int) -> None:
        """Die now (never returns normally)."""


# --- session history -------------------------------------------------------------


MAX_HISTORY_CHARS = 16 * 1024 * 1024   # one session's history: its newest messages within
MAX_STORE_CHARS = 64 * 1024 * 1024     # every history kept: the least recently used lose first


class History(deque[tuple[str, str]]):
    """A session's messages, oldest first: at most ``max_messages`` of at most
    ``max_chars`` characters in all (the oldest go first, a message over the bound goes
    whole); ``chars`` is their sum, reported to ``on_change`` (the store's total)."""

    def __init__(self, messages: Iterable[tuple[str, str]] = (), *, max_messages: int,
                 max_chars: int, on_change: Callable[[int], None] | None = None) -> None:
        super().__init__()
        self.chars = 0
        self.max_messages = max_messages
        self.max_chars = max_chars
        self._on_change = on_change
        self.extend(messages)

    def append(self, message: tuple[str, str]) -> None:
        super().append(message)
        self._count(len(message[1]))
        while self and (len(self) > self.max_messages or self.chars > self.max_chars):
            self.popleft()

    def extend(self, messages: Iterable[tuple[str, str]]) -> None:
        for message in messages:
            self.append(message)

    def popleft(self) -> tuple[str, str]:
        message = super().popleft()
        self._count(-len(message[1]))
        return message

    def _count(self, delta: int) -> None:
        self.chars += delta
        if self._on_change is not None:
            self._on_change(delta)


@dataclass(eq=False)
class StoredSession:
    session_id: str
    cwd: str
    history: History  # ("user" | "agent", text)
    settings: SessionSettings = field(default_factory=SessionSettings)
    counter: itertools.count = field(default_factory=lambda: itertools.count(1))


class SessionStore:
    """Bounded session histories: LRU over ``max_sessions``, each within ``max_messages``
    and ``max_chars`` characters, all of them within ``max_total_chars`` (past it the
    least recently used sessions lose their oldest messages first). Closed sessions
    keep their history (a later ``session/load``), so without the total a client could
    fill ``max_sessions`` histories with prompts just under the body cap."""

    def __init__(self, max_sessions: int = 256, max_messages: int = 1000,
                 max_chars: int = MAX_HISTORY_CHARS,
                 max_total_chars: int = MAX_STORE_CHARS) -> None:
        self._sessions: OrderedDict[str, StoredSession] = OrderedDict()
        self._max_sessions = max_sessions
        self._max_messages = max_messages
        self._max_chars = max_chars
        self._max_total_chars = max_total_chars
        self.chars = 0   # every kept history's characters

    def create(self, session_id: str, cwd: str, history: Iterable[tuple[str, str]] = ()) -> StoredSession:
        self._drop(self._sessions.pop(session_id, None))
        session = StoredSession(session_id, cwd, History(
            history, max_messages=self._max_messages, max_chars=self._max_chars,
            on_change=self._counted))
        self._sessions[session_id] = session
        while len(self._sessions) > self._max_sessions:
            self._drop(self._sessions.popitem(last=False)[1])
        self._within_total()
        return session

    def get(self, session_id: str) -> StoredSession | None:
        session = self._sessions.get(session_id)
        if session is not None:
            self._sessions.move_to_end(session_id)
        return session

    def all(self) -> list[StoredSession]:
        return list(self._sessions.values())

    def _drop(self, session: StoredSession | None) -> None:
        if session is not None:
            self.chars -= session.history.chars
            session.history._on_change = None   # what it keeps no longer counts here

    def _counted(self, delta: int) -> None:
        self.chars += delta
        if delta > 0:
            self._within_total()

    def _within_total(self) -> None:
        if self.chars <= self._max_total_chars:
            return
        for session in list(self._sessions.values()):   # least recently used first
            while session.history and self.chars > self._max_total_chars:
                session.history.popleft()
            if self.chars <= self._max_total_chars:
                return


# --- directives ------------------------------------------------------------------

_DIRECTIVE_RE = re.compile(   # (the whitespace before it: ``\s`` is ``str.isspace``)
    r"\s*/(?:sleep[ \t]+(?P<sleep>\d+)(?P<unit>ms|s)"
    r"|chunks[ \t]+(?P<chunks>\d+)"
    r"|tool[ \t]+write[ \t]+(?P<path>\S+)"
    r"|(?P<flag>permission|fail|max_tokens|refuse|crash|history))(?=\s|\Z)"
)
_MAX_CHUNKS = 100_000


@dataclass
class Directives:
    sleep_s: float = 0.0
    chunks: int = 3
    permission: bool = False
    write_path: str | None = None
    fail: bool = False
    max_tokens: bool = False
    refuse: bool = False
    crash: bool = False
    history: bool = False
    message: str = ""


def parse_directives(text: str) -> Directives:
    """Parse the leading directives of ``text``; the remainder (stripped) is ``message``."""
    found = Directives()
    pos = 0
    while True:
        match = _DIRECTIVE_RE.match(text, pos)
        if match is None:
            break
        pos = match.end()
        if match["sleep"] is not None:
            amount = int(match["sleep"])
            found.sleep_s = amount / 1000 if match["unit"] == "ms" else float(amount)
        elif match["chunks"] is not None:
            found.chunks = min(max(int(match["chunks"]), 1), _MAX_CHUNKS)
        elif match["path"] is not None:
            found.write_path = match["path"]
        else:
            setattr(found, match["flag"], True)
    found.message = text[pos:].strip()
    return found


def split_chunks(text: str, count: int) -> list[str]:
    """Exactly ``count`` pieces whose concatenation is ``text`` (the first ones longer)."""
    size, extra = divmod(len(text), count)
    pieces, start = [], 0
    for index in range(count):
        end = start + size + (1 if index < extra else 0)
        pieces.append(text[start:end])
        start = end
    return pieces


def embedded_texts(prompt: list[Any]) -> list[str]:
    """The text of the prompt's embedded resources (``{"type": "resource"}`` blocks)."""
    texts = []
    for block in prompt:
        resource = block.get("resource") if isinstance(block, dict) and \
            block.get("type") == "resource" else None
        if isinstance(resource, dict) and isinstance(resource.get("text"), str):
            texts.append(resource["text"])
    return texts


def prompt_text(prompt: list[Any]) -> str:
    return "\n".join(
        block["text"]
        for block in prompt
        if isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str)
    )


# --- the agent logic ---------------------------------------------------------------


def _require_dict(params: Any) -> dict[str, Any]:
    if not isinstance(params, dict):
        raise RequestError(INVALID_PARAMS, "Invalid params: expected an object")
    return params


def _require_str(params: dict[str, Any], key: str) -> str:
    value = params.get(key)
    if not isinstance(value, str) or not value:
        raise RequestError(INVALID_PARAMS, f'Invalid params: "{key}" must be a non-empty string')
    return value


async def _raise(exc: Exception) -> Any:
    raise exc


@dataclass(eq=False)
class _Turn:
    session: StoredSession
    scope: anyio.CancelScope


class ReferenceAgent:
    """The ACP agent logic. ``dispatch`` is the only way requests enter.

    Contract: ``dispatch`` runs its bookkeeping synchronously (a ``session/prompt`` is
    registered as the running turn before it returns) so that a ``session/cancel``
    read right after the prompt always finds the turn, however the caller schedules
    the returned coroutine.
    """

    def __init__(self, peer: AgentPeer, store: SessionStore | None = None) -> None:
        self._peer = peer
        self._store = store if store is not None else SessionStore()
        self._turns: dict[str, _Turn] = {}
        self._handlers: dict[str, Callable[[dict[str, Any]], Awaitable[Any]]] = {
            "initialize": self._initialize,
            "session/new": self._new,
            "session/load": self._load,
            "session/resume": self._resume,
            "session/fork": self._fork,
            "session/close": self._close,
            "session/list": self._list,
            "session/set_mode": self._set_mode,
            "session/set_model": self._set_model,
            "session/set_config_option": self._set_config_option,
        }

    def dispatch(self, method: str, params: Any) -> Coroutine[Any, Any, Any]:
        """The coroutine answering ``method``; it raises ``RequestError`` for errors."""
        if method == "session/prompt":
            try:
                return self._run_turn(*self._begin_turn(params))
            except RequestError as exc:
                return _raise(exc)
        handler = self._handlers.get(method)
        if handler is None:
            return _raise(RequestError(METHOD_NOT_FOUND, "Method not found", {"method": method}))
        if not isinstance(params, dict):
            return _raise(RequestError(INVALID_PARAMS, "Invalid params: expected an object"))
        return handler(params)

    def cancel_turns(self) -> None:
        """Every running turn ends, as by ``session/cancel`` (its connection is gone)."""
        for turn in list(self._turns.values()):
            turn.scope.cancel()

    def handle_notification(self, method: str, params: Any) -> None:
        if method == "session/cancel" and isinstance(params, dict):
            turn = self._turns.get(params.get("sessionId"))  # type: ignore[arg-type]
            if turn is not None:
                turn.scope.cancel()
        else:
            logger.debug("reference agent ignores notification %s", method)

    # -- session management

    def _session(self, params: dict[str, Any]) -> StoredSession:
        session_id = _require_str(params, "sessionId")
        session = self._store.get(session_id)
        if session is None:
            raise RequestError(RESOURCE_NOT_FOUND, "Session not found", {"sessionId": session_id})
        return session

    async def _initialize(self, params: dict[str, Any]) -> dict[str, Any]:
        return {
            "protocolVersion": 1,
            "agentCapabilities": {
                "loadSession": True,
                "promptCapabilities": {"image": False, "audio": False, "embeddedContext": True},
                "sessionCapabilities": {"resume": {}, "close": {}, "list": {}, "fork": {}},
            },
            "agentInfo": dict(AGENT_INFO),
            "authMethods": [],
        }

    async def _new(self, params: dict[str, Any]) -> dict[str, Any]:
        cwd = _require_str(params, "cwd")
        meta = params.get("_meta")
        requested = meta.get(REQUESTED_SESSION_ID_META) if isinstance(meta, dict) else None
        session_id = requested if isinstance(requested, str) and requested else uuid4_str()
        session = self._store.create(session_id, cwd, seeded(meta))   # restored: its transcript
        return {"sessionId": session_id, **session.settings.state()}

    async def _load(self, params: dict[str, Any]) -> dict[str, Any]:
        session = self._session(params)
        session.cwd = params.get("cwd") if isinstance(params.get("cwd"), str) else session.cwd
        for role, text in list(session.history):
            kind = "user_message_chunk" if role == "user" else "agent_message_chunk"
            await self._update(session.session_id, {"sessionUpdate": kind, "content": _text(text)})
        return session.settings.state()

    async def _resume(self, params: dict[str, Any]) -> dict[str, Any]:
        session = self._session(params)
        session.cwd = params.get("cwd") if isinstance(params.get("cwd"), str) else session.cwd
        return session.settings.state()

    async def _fork(self, params: dict[str, Any]) -> dict[str, Any]:
        source = self._session(params)
        cwd = params.get("cwd") if isinstance(params.get("cwd"), str) else source.cwd
        fork = self._store.create(uuid4_str(), cwd, list(source.history))
        return {"sessionId": fork.session_id, **fork.settings.state()}

    async def _close(self, params: dict[str, Any]) -> dict[str, Any]:
        # Keeps the history (a later session/load still works); stops the running turn.
        session = self._session(params)
        turn = self._turns.get(session.session_id)
        if turn is not None:
            turn.scope.cancel()
        return {}

    async def _list(self, params: dict[str, Any]) -> dict[str, Any]:
        cwd = params.get("cwd")
        sessions = [
            {"sessionId": s.session_id, "cwd": s.cwd}
            for s in self._store.all()
            if not isinstance(cwd, str) or s.cwd == cwd
        ]
        return {"sessions": sessions}

    # -- settings (bridge.agents.reference_settings)

    async def _set_mode(self, params: dict[str, Any]) -> dict[str, Any]:
        session = self._session(params)
        await self._update(session.session_id, session.settings.set_mode(params.get("modeId")))
        return {}

    async def _set_model(self, params: dict[str, Any]) -> dict[str, Any]:
        self._session(params).settings.set_model(params.get("modelId"))
        return {}

    async def _set_config_option(self, params: dict[str, Any]) -> dict[str, Any]:
        session = self._session(params)
        update = session.settings.set_option(params.get("configId"), params.get("value"))
        await self._update(session.session_id, update)
        return {"configOptions": update["configOptions"]}

    # -- prompt turns

    def _begin_turn(self, params: Any) -> tuple[_Turn, str, list[str]]:
        session = self._session(_require_dict(params))
        prompt = params.get("prompt")
        if not isinstance(prompt, list):
            raise RequestError(INVALID_PARAMS, 'Invalid params: "prompt" must be an array')
        if session.session_id in self._turns:
            raise RequestError(INVALID_PARAMS, "A prompt is already running in this session")
        turn = _Turn(session, anyio.CancelScope())
        self._turns[session.session_id] = turn
        return turn, prompt_text(prompt), embedded_texts(prompt)

    async def _run_turn(self, turn: _Turn, text: str, context: list[str]) -> dict[str, Any]:
        try:
            with turn.scope:
                return await self._play(turn.session, text, context)
            return {"stopReason": "cancelled"}  # session/cancel interrupted the turn
        finally:
            if self._turns.get(turn.session.session_id) is turn:
                del self._turns[turn.session.session_id]

    async def _play(self, session: StoredSession, text: str,
                    context: Sequence[str] = ()) -> dict[str, Any]:
        directives = parse_directives(text)
        lines: list[str] = []
        if directives.history:
            lines.append("History:")
            lines.extend(f"{'user' if role == 'user' else 'assistant'}: {said}"
                         for role, said in session.history)
            lines.extend(context)
        if directives.sleep_s > 0:
            await anyio.sleep(directives.sleep_s)
        if directives.permission:
            tool_call = {
                "toolCallId": f"ref-permission-{next(session.counter)}",
                "title": "Reference permission check",
                "kind": "other",
                "status": "pending",
            }
            option = await self._ask_permission(session, tool_call)
            if option is None:
                return {"stopReason": "cancelled"}
            verdict = "allowed" if option in _ALLOWING else "rejected"
            lines.append(f"Permission {verdict} ({option}).")
        if directives.write_path is not None:
            line = await self._tool_write(session, directives.write_path, directives.message)
            if line is None:
                return {"stopReason": "cancelled"}
            lines.append(line)
        if directives.fail:
            raise RequestError(INTERNAL_ERROR, "Reference agent failure (/fail)")
        lines.append(f"Echo: {directives.message}")
        reply = "\n".join(lines)
        if directives.crash:
            await self._chunk(session, reply[: max(len(reply) // 2, 1)])
            await self._peer.crash(CRASH_EXIT_CODE)
        for piece in split_chunks(reply, directives.chunks):
            await self._chunk(session, piece)
        session.history.append(("user", text))
        session.history.append(("agent", reply))
        if directives.refuse:
            return {"stopReason": "refusal"}
        return {"stopReason": "max_tokens" if directives.max_tokens else "end_turn"}

    async def _ask_permission(self, session: StoredSession, tool_call: dict[str, Any]) -> str | None:
        """The selected optionId, or ``None`` when the client answered ``cancelled``."""
        params = {
            "sessionId": session.session_id,
            "toolCall": tool_call,
            "options": [dict(option) for option in PERMISSION_OPTIONS],
        }
        try:
            answer = await self._peer.request("session/request_permission", params)
        except RequestError as exc:
            raise RequestError(INTERNAL_ERROR, f"Permission request failed: {exc.message}") from None
        outcome = answer.get("outcome") if isinstance(answer, dict) else None
        kind = outcome.get("outcome") if isinstance(outcome, dict) else None
        if kind == "cancelled":
            return None
        if kind == "selected" and isinstance(outcome.get("optionId"), str):
            return outcome["optionId"]
        raise RequestError(INTERNAL_ERROR, "Invalid permission response", {"response": answer})

    async def _tool_write(self, session: StoredSession, path: str, message: str) -> str | None:
        """Run ``/tool write``: the reply line, or ``None`` if permission was cancelled."""
        target = os.path.normpath(os.path.join(session.cwd, path))
        tool_id = f"ref-write-{next(session.counter)}"
        title = f"Write {path}"
        await self._update(session.session_id, {
            "sessionUpdate": "tool_call", "toolCallId": tool_id, "title": title, "kind": "edit",
            "status": "pending", "locations": [{"path": target}], "rawInput": {"path": target},
        })
        tool_call = {"toolCallId": tool_id, "title": title, "kind": "edit", "status": "pending"}
        option = await self._ask_permission(session, tool_call)
        if option is None or option not in _ALLOWING:
            await self._tool_status(session, tool_id, "failed")
            return None if option is None else f"Write to {target} rejected."
        content = f"{message}\n" if message else "Written by the acp-server reference agent.\n"
        write = {"sessionId": session.session_id, "path": target, "content": content}
        try:
            await self._peer.request("fs/write_text_file", write)
        except RequestError as exc:
            await self._tool_status(session, tool_id, "failed")
            return f"Write to {target} failed: {exc.message}"
        await self._tool_status(session, tool_id, "completed")
        return f"Wrote {target}."

    async def _tool_status(self, session: StoredSession, tool_id: str, status: str) -> None:
        update = {"sessionUpdate": "tool_call_update", "toolCallId": tool_id, "status": status}
        await self._update(session.session_id, update)

    async def _chunk(self, session: StoredSession, piece: str) -> None:
        update = {"sessionUpdate": "agent_message_chunk", "content": _text(piece)}
        await self._update(session.session_id, update)

    async def _update(self, session_id: str, update: dict[str, Any]) -> None:
        await self._peer.notify("session/update", {"sessionId": session_id, "update": update})


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}
