"""A scripted in-process agent for bridge tests: the test decides when each turn ends.

Prompt text drives it: ``hold <key>`` waits until ``agent.release(key, stop_reason)``
(or a cancel: then it answers ``cancelled``); ``stubborn <key>`` waits for release and
ignores cancel; ``fail`` answers a JSON-RPC error (``hostile`` a huge one); ``perm`` asks for a permission and
answers with the chosen option id as the stop reason; anything else ends the turn at
once with ``end_turn``. Every call is recorded in ``agent.calls``. ``session/new``
answers ``<name>-<n>``, or the ids queued in ``next_ids``; it waits while
``hang_new`` is an unset event.
"""

from __future__ import annotations

import itertools
from typing import Any

import anyio
import anyio.abc

from bridge.errors import AgentDiedError, AgentError


class ScriptedAgent:
    def __init__(self, name: str = "scripted") -> None:
        self.name = name
        self.calls: list[tuple[str, Any]] = []
        self.client: Any = None
        self._releases: dict[str, anyio.Event] = {}
        self._stop: dict[str, str] = {}
        self._cancelled: set[str] = set()
        self._cancel_events: dict[str, anyio.Event] = {}
        self._ids = itertools.count(1)
        self.closed = False
        self.fork_supported = True
        self.hang_new: anyio.Event | None = None   # set: session/new waits for it
        self.next_ids: list[str] = []              # session/new answers these first

    # factory
    async def connect(self, client: Any, task_group: anyio.abc.TaskGroup) -> ScriptedAgent:
        self.client = client
        self.closed = False
        return self

    def release(self, key: str, stop_reason: str = "end_turn") -> None:
        self._stop[key] = stop_reason
        self._event(key).set()

    def _event(self, key: str) -> anyio.Event:
        if key not in self._releases:
            self._releases[key] = anyio.Event()
        return self._releases[key]

    def prompts(self) -> list[str]:
        return [p["prompt"][0]["text"] for m, p in self.calls if m == "session/prompt"]

    def die(self) -> None:
        self.closed = True
        self.client.connection_lost(AgentDiedError("scripted agent died", exit_code=9))
        for event in self._cancel_events.values():
            event.set()

    # connection
    async def request(self, method: str, params: Any) -> Any:
        if self.closed:
            raise AgentDiedError("scripted agent is closed")
        self.calls.append((method, params))
        if method == "initialize":
            caps: dict[str, Any] = {"loadSession": True,
                                    "sessionCapabilities": {"resume": {}, "close": {}}}
            if self.fork_supported:
                caps["sessionCapabilities"]["fork"] = {}
            return {"protocolVersion": 1, "agentCapabilities": caps}
        if method in ("session/new", "session/fork"):
            if self.hang_new is not None:
                await self.hang_new.wait()
            if self.next_ids:
                return {"sessionId": self.next_ids.pop(0)}
            requested = (params.get("_meta") or {}).get("acp-server/requestedSessionId")
            return {"sessionId": requested or f"{self.name}-{next(self._ids)}"}
        if method in ("session/load", "session/resume", "session/close"):
            return {}
        if method == "session/prompt":
            return await self._prompt(params)
        raise AgentError(-32601, f"Method not found: {method}")

    async def _prompt(self, params: dict[str, Any]) -> dict[str, Any]:
        sid = params["sessionId"]
        text = params["prompt"][0].get("text", "")
        word, _, key = text.partition(" ")
        self.client.session_update(sid, {"sessionId": sid, "update": {
            "sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}})
        if word == "fail":
            raise AgentError(-32603, "scripted failure")
        if word == "hostile":   # an embedder's connection passing on a huge error
            raise AgentError(-32603, "r" * 100_000, {"errorKind": "k", "blob": "x" * 100_000})
        if word == "perm":
            answer = await self.client.request_permission(sid, {
                "sessionId": sid, "toolCall": {"toolCallId": "t1", "title": "x"},
                "options": [{"optionId": "yes", "name": "Yes", "kind": "allow_once"},
                            {"optionId": "no", "name": "No", "kind": "reject_once"}]})
            outcome = answer["outcome"]
            return {"stopReason": outcome.get("optionId", outcome["outcome"])}
        if word in ("hold", "stubborn"):
            cancel = self._cancel_events.setdefault(sid, anyio.Event())
            release = self._event(key)
            async with anyio.create_task_group() as tg:
                async def wait_release() -> None:
                    await release.wait()
                    tg.cancel_scope.cancel()

                async def wait_cancel() -> None:
                    await cancel.wait()
                    if word == "hold":
                        tg.cancel_scope.cancel()

                tg.start_soon(wait_release)
                tg.start_soon(wait_cancel)
            if self.closed:
                raise AgentDiedError("scripted agent died", exit_code=9)
            if not release.is_set():
                self._cancel_events.pop(sid, None)
                return {"stopReason": "cancelled"}
            self._cancel_events.pop(sid, None)
            return {"stopReason": self._stop.get(key, "end_turn"), "extra": {"kept": True}}
        return {"stopReason": "end_turn"}

    async def notify(self, method: str, params: Any) -> None:
        if self.closed:
            raise AgentDiedError("scripted agent is closed")
        self.calls.append((method, params))
        if method == "session/cancel":
            event = self._cancel_events.get(params["sessionId"])
            if event is not None:
                event.set()

    async def aclose(self) -> None:
        self.closed = True
