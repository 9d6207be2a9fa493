"""The reference agent: a deterministic ACP agent with no model, the server's default.

In process (the connection calls the agent logic directly)::

    factory = ReferenceAgentFactory()
    conn = await factory.connect(client, task_group)
    await conn.request("initialize", {"protocolVersion": 1})
    sid = (await conn.request("session/new", {"cwd": "/work", "mcpServers": []}))["sessionId"]
    await conn.request("session/prompt", {"sessionId": sid,
                       "prompt": [{"type": "text", "text": "/chunks 2 hello"}]})
    # client.session_update got 2 agent_message_chunk updates: "Echo: hello" split in two

Over stdio (newline-delimited JSON-RPC 2.0 on stdin/stdout, logs on stderr)::

    python -m bridge.agents.reference [--backend asyncio|trio]

Prompt directives
-----------------
The prompt text is the text of its ``text`` blocks joined by newlines (other blocks
are ignored). Directives are recognised only at the start of the text, each in
exactly this syntax, several combined separated by whitespace or newlines; the
first thing that is not a directive ends them and the rest is the *message*:

* ``/sleep 200ms`` or ``/sleep 2s``: sleep before replying (``session/cancel`` ends it).
* ``/chunks N``: send the reply in exactly N ``agent_message_chunk`` updates (default
  3; their concatenation is the reply, so short replies can yield empty chunks).
* ``/permission``: first ask ``session/request_permission`` (toolCall
  ``{toolCallId: "ref-permission-<n>", title: "Reference permission check",
  kind: "other", status: "pending"}``, options ``allow_once``, ``allow_always``,
  ``reject_once``). The reply starts with ``Permission allowed (<optionId>).`` or
  ``Permission rejected (<optionId>).``; a ``cancelled`` outcome ends the turn with
  stopReason ``cancelled``.
* ``/tool write <path>``: a ``tool_call`` update (``toolCallId: "ref-write-<n>"``,
  kind ``edit``, status ``pending``), then a permission request for it; on allow,
  ``fs/write_text_file {sessionId, path, content}`` with ``path`` resolved against the
  session cwd and ``content`` = the message plus ``"\\n"`` (or ``"Written by the
  acp-server reference agent.\\n"`` when the message is empty), then a
  ``tool_call_update`` ``completed`` and the reply line ``Wrote <path>.``; on reject
  or a client error a ``tool_call_update`` ``failed`` and ``Write to <path> rejected.``
  / ``Write to <path> failed: <message>``.
* ``/fail``: answer the prompt with JSON-RPC error -32603
  ``Reference agent failure (/fail)`` (after any sleep/permission/tool step).
* ``/history``: the reply starts with ``History:`` and one ``user: …`` /
  ``assistant: …`` line per earlier message of the session, then the text of the
  prompt's embedded resources (how LMSP hands a fresh session the history of a
  ``previous_response_id`` conversation).
* ``/max_tokens``, ``/refuse``: stopReason ``max_tokens`` / ``refusal`` after the reply.
* ``/crash``: send one chunk (the first half of the reply), then die: over stdio the
  process exits with status 3 (``os._exit``); in process the connection is lost
  (every pending call raises ``AgentDiedError(exit_code=3)``, ``connection_lost`` is
  called once).

Without directives the reply is ``Echo: <message>``. Reply lines (permission, tool,
echo) are joined with ``"\\n"``. Each finished turn stores (user text, reply) in the
session history that ``session/load`` replays as ``user_message_chunk`` /
``agent_message_chunk`` updates. History is bounded (256 sessions, LRU; 1000
messages and 16 Mi characters each, the oldest going first; 64 Mi characters in all,
the least recently used sessions losing their oldest messages first). ``session/new`` honours ``_meta["acp-server/requestedSessionId"]``
(an existing session under that id is replaced) and starts the session's history with
``_meta["acp-server/transcript"]`` (``bridge.transcript``: how the server restores a
journaled session on an agent that forgot it). The in-process factory keeps one
store for all its connections, like an agent that persists sessions on disk.

Each session has modes, models and a ``reasoning_effort`` option, answered by
``session/new``, ``load``, ``resume`` and ``fork`` and changed by ``session/set_mode``,
``session/set_model`` and ``session/set_config_option``
(``bridge.agents.reference_settings``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, BinaryIO

import anyio
import anyio.abc
import anyio.to_thread

from bridge.agents.base import AgentClient, Answer, PendingRequests, RequestError
from bridge.agents.reference_agent import (
    AgentPeer,
    Directives,
    ReferenceAgent,
    SessionStore,
    StoredSession,
    parse_directives,
)
from bridge.errors import AgentDiedError
from bridge.jsonrpc import (
    INTERNAL_ERROR,
    METHOD_NOT_FOUND,
    JsonRpcInvalidRequest,
    JsonRpcParseError,
    Message,
    decode_message,
    decode_value,
    encode_error,
    encode_notification,
    encode_result,
    encode_value,
)
from bridge.wire import agent_error

__all__ = [
    "AgentPeer",
    "Directives",
    "ReferenceAgent",
    "ReferenceAgentFactory",
    "ReferenceConnection",
    "SessionStore",
    "StoredSession",
    "parse_directives",
    "serve_stdio",
    "main",
]

logger = logging.getLogger(__name__)


# --- in-process connection ---------------------------------------------------------


def _plain(value: Any) -> Any:
    """A private deep copy as plain JSON values (also decodes ``msgspec.Raw``)."""
    return decode_value(encode_value(value))


def _failed(method: str, exc: Exception) -> Exception:
    """What a request raises for the agent's error: its JSON-RPC error as
    ``AgentError``, anything else (logged) as an internal error."""
    if isinstance(exc, RequestError):
        return agent_error(exc.code, exc.message, exc.data)
    logger.exception("reference agent failed on %s", method, exc_info=exc)
    return agent_error(INTERNAL_ERROR, f"Internal error: {exc}")


class _InProcessPeer:
    """What the in-process agent talks to: the ``AgentClient`` behind the connection."""

    def __init__(self, connection: ReferenceConnection) -> None:
        self._connection = connection

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        client = self._connection.client
        if method != "session/update":
            logger.debug("reference agent notification %s dropped in process", method)
            return
        try:
            client.session_update(params["sessionId"], params)
        except Exception:
            logger.exception("AgentClient.session_update failed")
            return
        wait = getattr(client, "wait_for_readers", None)
        if wait is not None:   # flow control: the agent runs at its readers' pace
            await wait(params["sessionId"])

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        # Like over stdio, the client handler runs in its own task: an agent that stops
        # waiting (session/cancel) does not cancel the client's handler.
        outcome = Answer()
        self._connection._start_client_call(method, params, outcome)
        await outcome.done.wait()
        return outcome.unwrap()

    async def crash(self, exit_code: int) -> None:
        error = AgentDiedError("Reference agent crashed (/crash)", exit_code)
        self._connection._lose(error, notify=True)
        await anyio.sleep_forever()  # our request scope was just cancelled


class ReferenceConnection:
    """An in-process ``AgentConnection`` to a ``ReferenceAgent``.

    Contracts (same as ``StdioAgentConnection``): updates reach the client before the
    request that produced them returns; JSON-RPC errors raise ``AgentError`` (bounded:
    ``bridge.wire.agent_error``); a crash fails every pending call with
    ``AgentDiedError`` and calls ``connection_lost`` once; ``aclose`` fails pending
    calls without calling ``connection_lost``.
    """

    # Its turns touch nothing outside the session unless a client answered a
    # permission request (``AgentConnection``'s contract).
    contained = True

    def __init__(self, client: AgentClient, task_group: anyio.abc.TaskGroup, store: SessionStore) -> None:
        self.client = client
        self._task_group = task_group
        self._agent = ReferenceAgent(_InProcessPeer(self), store)
        self._scopes: set[anyio.CancelScope] = set()
        self._death: AgentDiedError | None = None

    @property
    def closed(self) -> bool:
        return self._death is not None

    async def request(self, method: str, params: Any) -> Any:
        if self._death is not None:
            raise self._death
        call = self._agent.dispatch(method, _plain(params))
        if method == "session/prompt":
            # A turn runs in a cancel scope of its own, which ``_lose`` cancels too:
            # no second scope per turn here (one costs ~4 µs on asyncio).
            try:
                result = await call
            except Exception as exc:
                raise _failed(method, exc) from None
            if self._death is not None:   # its turn ended by the connection's loss
                raise self._death
            return result   # a dict made for this answer ({"stopReason": ...}): no copy
        scope = anyio.CancelScope()
        self._scopes.add(scope)
        answered = False
        try:
            with scope:
                result = await call
                answered = True
        except Exception as exc:
            raise _failed(method, exc) from None
        finally:
            self._scopes.discard(scope)
        if not answered:  # only our scope was cancelled: the connection went away
            raise self._death or AgentDiedError("Agent connection closed")
        return _plain(result)

    async def notify(self, method: str, params: Any) -> None:
        if self._death is not None:
            raise self._death
        self._agent.handle_notification(method, _plain(params))

    async def aclose(self) -> None:
        self._lose(AgentDiedError("Agent connection closed"), notify=False)

    def _lose(self, error: AgentDiedError, *, notify: bool) -> None:
        if self._death is not None:
            return
        self._death = error
        for scope in list(self._scopes):
            scope.cancel()
        self._agent.cancel_turns()   # (their requests have no scope of their own)
        if notify:
            try:
                self.client.connection_lost(error)
            except Exception:
                logger.exception("AgentClient.connection_lost failed")

    def _start_client_call(self, method: str, params: dict[str, Any], outcome: Answer) -> None:
        handlers = {
            "session/request_permission": self.client.request_permission,
            "fs/read_text_file": self.client.read_text_file,
            "fs/write_text_file": self.client.write_text_file,
        }
        handler = handlers.get(method)
        if handler is None:
            outcome.error = RequestError(METHOD_NOT_FOUND, "Method not found", {"method": method})
            outcome.done.set()
            return
        self._task_group.start_soon(self._client_call, handler, params, outcome)

    async def _client_call(self, handler: Callable[..., Awaitable[Any]], params: dict[str, Any], outcome: Answer) -> None:
        scope = anyio.CancelScope()
        self._scopes.add(scope)
        try:
            with scope:
                outcome.value = _plain(await handler(params.get("sessionId"), params))
        except RequestError as exc:
            outcome.error = exc
        except Exception as exc:
            logger.exception("AgentClient handler failed")
            outcome.error = RequestError(INTERNAL_ERROR, "Internal error", {"details": str(exc)})
        finally:
            self._scopes.discard(scope)
            if scope.cancelled_caught and outcome.error is None:
                outcome.error = RequestError(INTERNAL_ERROR, "Client call cancelled")
            outcome.done.set()


class ReferenceAgentFactory:
    """``AgentFactory`` for the in-process reference agent (name ``"reference"``).

    All connections of one factory share ``store`` (default: a new ``SessionStore``).
    """

    name = "reference"

    def __init__(self, *, store: SessionStore | None = None) -> None:
        self.store = store if store is not None else SessionStore()

    async def connect(self, client: AgentClient, task_group: anyio.abc.TaskGroup) -> ReferenceConnection:
        return ReferenceConnection(client, task_group, self.store)


# --- stdio mode ---------------------------------------------------------------------


class _StdioPeer:
    """The client across stdin/stdout. Writes are whole lines, serialized and flushed."""

    def __init__(self, out: BinaryIO) -> None:
        self._out = out
        self._lock = anyio.Lock()
        self._requests = PendingRequests()

    async def send(self, data: bytes) -> None:
        async with self._lock:
            await anyio.to_thread.run_sync(self._write, data + b"\n")

    def _write(self, data: bytes) -> None:
        self._out.write(data)
        self._out.flush()

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        await self.send(encode_notification(method, params))

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        return await self._requests.call(self.send, method, params)

    def resolve(self, msg: Message) -> None:
        if not self._requests.resolve(msg, RequestError):
            logger.debug("answer to unknown or abandoned request %r", msg.id)

    async def crash(self, exit_code: int) -> None:
        # Everything sent so far is already written and flushed (send awaits the write).
        os._exit(exit_code)


async def _answer(peer: _StdioPeer, request_id: Any, call: Coroutine[Any, Any, Any]) -> None:
    try:
        result = await call
    except RequestError as exc:
        data = encode_error(request_id, exc.code, exc.message, exc.data)
    except Exception as exc:
        logger.exception("reference agent request failed")
        data = encode_error(request_id, INTERNAL_ERROR, f"Internal error: {exc}")
    else:
        data = encode_result(request_id, result)
    await peer.send(data)


def _handle_line(line: bytes, agent: ReferenceAgent, peer: _StdioPeer, tg: anyio.abc.TaskGroup) -> None:
    try:
        msg = decode_message(line)
    except (JsonRpcParseError, JsonRpcInvalidRequest) as exc:
        logger.warning("bad message from client: %s", exc)
        request_id = getattr(exc, "id", None)
        tg.start_soon(peer.send, encode_error(request_id, exc.code, exc.message))
        return
    if msg.is_response:
        peer.resolve(msg)
    elif msg.is_notification:
        agent.handle_notification(msg.method, decode_value(msg.params))
    else:
        tg.start_soon(_answer, peer, msg.id, agent.dispatch(msg.method, decode_value(msg.params)))


async def serve_stdio(stdin: BinaryIO, stdout: BinaryIO, store: SessionStore | None = None) -> None:
    """Serve one client over binary ``stdin``/``stdout`` until stdin reaches EOF."""
    peer = _StdioPeer(stdout)
    agent = ReferenceAgent(peer, store)
    async with anyio.create_task_group() as tg:
        while True:
            # A thread reads stdin, so answers to our own requests (permission, fs)
            # are read while prompt turns run in other tasks.
            line = await anyio.to_thread.run_sync(stdin.readline, abandon_on_cancel=True)
            if not line:
                break
            line = line.rstrip(b"\r\n")
            if line.strip():
                _handle_line(line, agent, peer, tg)
        tg.cancel_scope.cancel()  # the client hung up: abandon running turns


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bridge.agents.reference")
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # stray prints must never corrupt the protocol stream
    anyio.run(serve_stdio, stdin, stdout, backend=args.backend)


if __name__ == "__main__":
    main()
