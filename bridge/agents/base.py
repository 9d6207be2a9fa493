"""The seam between the bridge and an agent.

An agent is reached through an ``AgentConnection``: ACP client-to-agent requests and
notifications as async calls. Traffic in the other direction (``session/update``
notifications and agent-to-client requests) is delivered to the ``AgentClient`` that
the bridge hands to ``AgentFactory.connect``::

    connection = await factory.connect(client, task_group)
    info = await connection.request("initialize", {"protocolVersion": 1, ...})
    result = await connection.request("session/new", {"cwd": cwd, "mcpServers": []})
    await connection.notify("session/cancel", {"sessionId": result["sessionId"]})
    await connection.aclose()

Contracts:

* Params and results are plain JSON values (dicts, lists, ...) decoded without a
  narrowing schema, so unknown fields survive. ``session/update`` params reach the
  client as the raw JSON bytes the agent sent (``msgspec.Raw``) or as a dict from an
  in-process agent; both encode back unchanged.
* ``session_update`` is called synchronously, in the order the agent sent the
  notifications, and before the response to the request that produced them.
* A JSON-RPC error answer raises ``AgentError``; a lost agent raises
  ``AgentDiedError`` in every waiting call and calls ``client.connection_lost`` once.
* Agent-to-client requests run concurrently (a waiting permission request must not
  block updates); an ``AgentClient`` method answers by returning the result or by
  raising ``RequestError``.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

import anyio
import anyio.abc
import msgspec

from bridge.errors import AgentDiedError
from bridge.jsonrpc import UNSET, Message, decode_value, encode_request


class Answer:
    """One awaited JSON-RPC answer: set ``value`` or ``error``, then ``done``."""

    __slots__ = ("done", "value", "error")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.value: Any = None
        self.error: BaseException | None = None

    def unwrap(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


class PendingRequests:
    """Our outgoing JSON-RPC requests awaiting answers: ids from 0, one table per
    direction of a connection.

        answer = await table.call(send_line, "session/new", params)   # in one task
        table.resolve(message, AgentError)                             # in the reader
    """

    def __init__(self) -> None:
        self._ids = itertools.count()
        self._waiting: dict[int, Answer] = {}

    async def call(self, send: Callable[[bytes], Awaitable[None]], method: str, params: Any) -> Any:
        request_id = next(self._ids)
        answer = self._waiting[request_id] = Answer()
        try:
            await send(encode_request(request_id, method, params))
            await answer.done.wait()
        finally:
            self._waiting.pop(request_id, None)
        return answer.unwrap()

    def resolve(self, msg: Message, error_type: Callable[[int, str, Any], BaseException]) -> bool:
        """Settle the request ``msg`` answers; ``False`` for an unknown or abandoned id,
        or for an id already answered: the first answer wins (it leaves the table at
        once, so a second answer to the same id is unknown and changes nothing)."""
        answer = self._waiting.pop(msg.id, None) if type(msg.id) is int else None  # type: ignore[arg-type]
        if answer is None:
            return False
        if msg.error is not UNSET:
            answer.error = error_type(msg.error.code, msg.error.message, decode_value(msg.error.data))
        else:
            answer.value = decode_value(msg.result)
        answer.done.set()
        return True

    def fail_all(self, error: BaseException) -> None:
        for answer in self._waiting.values():
            answer.error = error
            answer.done.set()


class RequestError(Exception):
    """Raised by an ``AgentClient`` handler: becomes a JSON-RPC error answer."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
RESOURCE_NOT_FOUND = -32002


class AgentClient(Protocol):
    """What the bridge offers an agent (the ACP client side)."""

    def session_update(self, session_id: str, params: msgspec.Raw | dict[str, Any]) -> None:
        """A ``session/update`` notification; ``params`` is the whole params object."""

    async def request_permission(self, session_id: str, params: dict[str, Any]) -> dict[str, Any]:
        """``session/request_permission``: returns ``{"outcome": {...}}``."""

    async def read_text_file(self, session_id: str, params: dict[str, Any]) -> dict[str, Any]:
        """``fs/read_text_file``: returns ``{"content": str}``."""

    async def write_text_file(self, session_id: str, params: dict[str, Any]) -> dict[str, Any]:
        """``fs/write_text_file``: returns ``{}``."""

    def connection_lost(self, error: AgentDiedError) -> None:
        """The agent went away; called once."""


@runtime_checkable
class AgentConnection(Protocol):
    """An agent's connection. A connection may also have ``contained = True``: its
    turns have no effect outside the session's own events unless a client answered one
    of them (an in-process agent of ours). The bridge then hands it a prompt without
    waiting for the prompt's start to be committed (``bridge.session``): a turn it ran
    whose start a crash lost left nothing anyone saw, and runs again after a restart.
    One with ``out_of_process = True`` (a stdio child) runs a request in another process,
    where it goes on when the bridge stops waiting: ``bridge.turn`` then keeps waiting
    for a cancelled turn's answer past its grace (``Session.straggler``)."""

    @property
    def closed(self) -> bool: ...

    async def request(self, method: str, params: Any) -> Any: ...

    async def notify(self, method: str, params: Any) -> None: ...

    async def aclose(self) -> None:
        """Stop the agent; pending calls fail with ``AgentDiedError``. Idempotent."""


class AgentFactory(Protocol):
    """Starts an agent. Background work of the connection runs in ``task_group``."""

    name: str

    async def connect(
        self, client: AgentClient, task_group: anyio.abc.TaskGroup
    ) -> AgentConnection: ...
