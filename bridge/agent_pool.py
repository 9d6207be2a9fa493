"""The bridge's agents, by name: one shared connection each, started on first use,
initialized once, restarted on the next use after it died.

    pool = AgentPool({"reference": ReferenceAgentFactory(), "qwen": StdioAgentFactory([...])},
                     default="reference", initialize_timeout_ms=10_000)
    connection = await pool.ensure("qwen", client, task_group)
    pool.capability("qwen", "sessionCapabilities", "fork")   # None when not offered
    pool.add("llama3:8b", ModelAgentFactory(url, model="llama3:8b"))   # while running

Contracts: a running connection is returned at once (no lock, no wait: ``ensure`` of
a live agent never yields to the loop); concurrent ``ensure`` calls for one name that
find it not started (or dead) share one start; a start that fails or times out closes
what it started and raises (``AgentTimeoutError`` for the ``initialize`` timeout;
``AgentStartError``, ``agent_unavailable``, when the agent exited before answering it,
answered an error, or answered no object; its ``state`` is then ``exited``); an
unknown name raises ``AgentNotFoundError``. Agents are
added while the pool runs (``add``: a model listed later), never removed: a name
resolved once stays valid. ``capability`` and ``state`` of a name that is no agent
(yet) answer ``None`` and ``not_started``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio
import anyio.abc
import msgspec

from bridge.agents.base import AgentClient, AgentConnection, AgentFactory
from bridge.errors import (
    AgentDiedError,
    AgentError,
    AgentNotFoundError,
    AgentStartError,
    AgentTimeoutError,
    AgentUnavailableError,
    said_line,
)
from bridge.observer import NO_OBSERVER, BridgeObserver

CLIENT_INFO = {"name": "acp-server-bridge", "version": "0.1.0"}
INITIALIZE_PARAMS = {
    "protocolVersion": 1,
    "clientCapabilities": {"fs": {"readTextFile": True, "writeTextFile": True}},
    "clientInfo": CLIENT_INFO,
}


def _short(value: Any, limit: int = 200) -> str:
    """What an agent said (a message as it is, any other value as JSON), as one
    bounded line."""
    return said_line(value if isinstance(value, str) else msgspec.json.encode(value).decode(),
                     limit)


class _Slot:
    __slots__ = ("factory", "connection", "info", "lock")

    def __init__(self, factory: AgentFactory) -> None:
        self.factory = factory
        self.connection: AgentConnection | None = None
        self.info: dict[str, Any] = {}
        self.lock: anyio.Lock | None = None


class AgentPool:
    def __init__(self, factories: Mapping[str, AgentFactory], *, default: str,
                 initialize_timeout_ms: int) -> None:
        if default not in factories:
            raise ValueError(f"default agent {default!r} is not among {sorted(factories)}")
        self._slots = {name: _Slot(factory) for name, factory in factories.items()}
        self.default = default
        self.initialize_timeout_ms = initialize_timeout_ms
        self.observer: BridgeObserver = NO_OBSERVER

    @property
    def names(self) -> list[str]:
        return list(self._slots)

    def __contains__(self, name: object) -> bool:
        return name in self._slots

    def add(self, name: str, factory: AgentFactory) -> bool:
        """Offer agent ``name`` from now on; ``False`` (nothing changed) when it is one."""
        if name in self._slots:
            return False
        self._slots[name] = _Slot(factory)
        return True

    def resolve(self, name: str | None) -> str:
        """``None`` → the default agent; an unknown name → ``AgentNotFoundError``."""
        if name is None:
            return self.default
        if name not in self._slots:
            raise AgentNotFoundError(name, self.names)
        return name

    def info(self, name: str) -> dict[str, Any]:
        """The agent's ``initialize`` result (empty before its first start)."""
        return self._slots[name].info

    def state(self, name: str) -> str:
        """``not_started`` (never used), ``running``, or ``exited`` (restarted on next use)."""
        slot = self._slots.get(name)
        connection = slot.connection if slot is not None else None
        if connection is None:
            return "not_started"
        return "exited" if connection.closed else "running"

    def capability(self, name: str, *path: str) -> Any:
        slot = self._slots.get(name)
        value: Any = (slot.info.get("agentCapabilities") or {}) if slot is not None else {}
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        return value

    async def ensure(self, name: str, client: AgentClient,
                     task_group: anyio.abc.TaskGroup) -> AgentConnection:
        name = self.resolve(name)
        slot = self._slots[name]
        connection = slot.connection
        if connection is not None and not connection.closed:
            return connection   # running: no lock to take (its acquire yields to the loop)
        if slot.lock is None:
            slot.lock = anyio.Lock()
        async with slot.lock:
            if slot.connection is not None:
                if not slot.connection.closed:
                    return slot.connection
                await slot.connection.aclose()   # reap the dead one before a restart
                self.observer.agent_restarted(name)
            connection = await slot.factory.connect(client, task_group)
            try:
                slot.info = await self._initialize(name, connection)
            except BaseException:
                await connection.aclose()
                slot.connection = connection   # closed: ``exited``, started again next use
                raise
            slot.connection = connection   # only now: ``ensure`` returns it without the lock
            return connection

    async def _initialize(self, name: str, connection: AgentConnection) -> dict[str, Any]:
        """``initialize`` on a new connection: its answer, an ``InitializeResponse``
        object; ``AgentTimeoutError`` past the timeout (naming the last line it wrote
        that was no JSON-RPC, as a program started without its ACP flag does);
        ``AgentStartError`` when the agent died, answered an error or answered no
        object."""
        try:
            with anyio.fail_after(self.initialize_timeout_ms / 1000):
                info = await connection.request("initialize", INITIALIZE_PARAMS)
        except TimeoutError:
            stray = getattr(connection, "stray_line", "")   # a stdio agent's last non-JSON-RPC
            said = f"its last line on stdout was no JSON-RPC: {stray}" if stray else ""
            raise AgentTimeoutError("initialize", self.initialize_timeout_ms, said) from None
        except AgentUnavailableError:
            raise
        except AgentDiedError as exc:
            raise AgentStartError(name, str(exc), exc.exit_code) from exc
        except AgentError as exc:
            data = "" if exc.data is None else f"; data: {_short(exc.data)}"
            raise AgentStartError(name, f"it answered error {exc.rpc_code} "
                                        f"({_short(exc.message)}{data})") from exc
        if not isinstance(info, dict):
            answered = _short(msgspec.json.encode(info).decode())   # a string quoted
            raise AgentStartError(name, f"it answered {answered}, not an "
                                        f"InitializeResponse object")
        return info

    async def aclose(self) -> None:
        for slot in list(self._slots.values()):
            if slot.connection is not None:
                await slot.connection.aclose()
