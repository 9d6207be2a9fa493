"""The model agent: ACP prompts become streaming ``/v1/chat/completions`` calls to an
OpenAI-compatible model server (Ollama, llama.cpp server, vLLM, LM Studio).

    models = await discover_models("http://127.0.0.1:11434/v1")       # ["qwen3:14b", ...]
    factory = ModelAgentFactory("http://127.0.0.1:11434/v1", model="qwen3:14b")
    async with Bridge(factory, workspace_cwd=".") as bridge: ...

Contracts:

* Each session keeps its conversation (user and assistant turns, bounded to
  ``max_history_messages``) and sends it whole with every prompt. A ``session/new``
  with ``_meta["acp-server/transcript"]`` (``bridge.transcript``: a session the server
  restores from its journal) starts with that conversation.
* Streamed ``delta.content`` becomes ``agent_message_chunk`` updates in order.
  ``finish_reason`` maps ``stop``/``tool_calls`` → ``end_turn``, ``length`` →
  ``max_tokens``, ``content_filter`` → ``refusal``. Usage (``stream_options.include_usage``)
  is passed on as the response's ``usage`` and a ``usage_update``.
* ``session/cancel`` closes the upstream stream at once; the turn ends ``cancelled``
  with the text received so far kept in the history.
* An upstream error status, a connection failure or a timeout ends the turn with a
  JSON-RPC error (-32603) whose message names the server and the cause.
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.abc
import httpx
import msgspec
from httpx_sse import aconnect_sse

from bridge.agents.base import AgentClient
from bridge.errors import AgentDiedError, AgentError
from bridge.ids import uuid4_str
from bridge.transcript import seeded

REQUESTED_SESSION_ID_META = "acp-server/requestedSessionId"
FINISH_TO_STOP = {"stop": "end_turn", "tool_calls": "end_turn", "function_call": "end_turn",
                  "length": "max_tokens", "content_filter": "refusal"}
INTERNAL_ERROR = -32603
METHOD_NOT_FOUND = -32601
SESSION_NOT_FOUND = -32002


class _Delta(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    delta: _Delta | None = None
    finish_reason: str | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class _Chunk(msgspec.Struct):
    choices: list[_Choice] = []
    usage: _Usage | None = None


class _Models(msgspec.Struct):
    data: list[dict[str, Any]] = []


_chunk_decoder = msgspec.json.Decoder(_Chunk)
_models_decoder = msgspec.json.Decoder(_Models)


async def discover_models(base_url: str, *, api_key: str | None = None,
                          timeout_s: float = 10.0) -> list[str]:
    """The model ids the server lists at ``GET {base_url}/models``."""
    async with httpx.AsyncClient(timeout=timeout_s, headers=_auth(api_key)) as client:
        response = await client.get(base_url.rstrip("/") + "/models")
        response.raise_for_status()
        models = _models_decoder.decode(response.content)
    return [m["id"] for m in models.data if isinstance(m.get("id"), str)]


def _auth(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


class ModelAgentFactory:
    """``AgentFactory`` for one model of one OpenAI-compatible server."""

    def __init__(self, base_url: str, *, model: str, name: str | None = None,
                 api_key: str | None = None, timeout_s: float = 300.0,
                 max_history_messages: int = 200) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.name = name or model
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.max_history_messages = max_history_messages

    async def connect(self, client: AgentClient, task_group: anyio.abc.TaskGroup) -> ModelConnection:
        return ModelConnection(self, client)


class _ModelSession:
    __slots__ = ("session_id", "cwd", "history", "scope")

    def __init__(self, session_id: str, cwd: str, history: list[dict[str, str]] | None = None) -> None:
        self.session_id = session_id
        self.cwd = cwd
        self.history = history or []
        self.scope: anyio.CancelScope | None = None


class ModelConnection:
    """An in-process ``AgentConnection`` speaking to the model server over HTTP."""

    def __init__(self, factory: ModelAgentFactory, client: AgentClient) -> None:
        self._factory = factory
        self._client = client
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(factory.timeout_s, connect=10.0),
                                       headers=_auth(factory.api_key))
        self._sessions: dict[str, _ModelSession] = {}
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    async def request(self, method: str, params: Any) -> Any:
        if self._closed:
            raise AgentDiedError("Model agent connection closed")
        params = params if isinstance(params, dict) else {}
        if method == "initialize":
            return {"protocolVersion": 1, "agentInfo": {"name": "acp-server-model",
                                                        "version": "0.1.0",
                                                        "model": self._factory.model},
                    "agentCapabilities": {"loadSession": False,
                                          "promptCapabilities": {"embeddedContext": True},
                                          "sessionCapabilities": {"close": {}, "fork": {}}},
                    "authMethods": []}
        if method == "session/new":
            meta = params.get("_meta") if isinstance(params.get("_meta"), dict) else {}
            session_id = meta.get(REQUESTED_SESSION_ID_META) or uuid4_str()
            history = [{"role": "user" if role == "user" else "assistant", "content": text}
                       for role, text in seeded(meta)][-self._factory.max_history_messages:]
            self._sessions[session_id] = _ModelSession(session_id, str(params.get("cwd", "")),
                                                       history)
            return {"sessionId": session_id}
        if method == "session/fork":
            source = self._session(params)
            session_id = uuid4_str()
            self._sessions[session_id] = _ModelSession(session_id, source.cwd, list(source.history))
            return {"sessionId": session_id}
        if method == "session/close":
            self._sessions.pop(str(params.get("sessionId")), None)
            return {}
        if method == "session/prompt":
            return await self._prompt(self._session(params), params.get("prompt"))
        raise AgentError(METHOD_NOT_FOUND, "Method not found", {"method": method})

    async def notify(self, method: str, params: Any) -> None:
        if method == "session/cancel" and isinstance(params, dict):
            session = self._sessions.get(str(params.get("sessionId")))
            if session is not None and session.scope is not None:
                session.scope.cancel()

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            for session in self._sessions.values():
                if session.scope is not None:
                    session.scope.cancel()
            await self._http.aclose()

    def _session(self, params: dict[str, Any]) -> _ModelSession:
        session = self._sessions.get(str(params.get("sessionId")))
        if session is None:
            raise AgentError(SESSION_NOT_FOUND, "Session not found",
                             {"sessionId": params.get("sessionId")})
        return session

    async def _prompt(self, session: _ModelSession, prompt: Any) -> dict[str, Any]:
        if session.scope is not None:
            raise AgentError(-32602, "A prompt is already running in this session")
        session.history.append({"role": "user", "content": _prompt_text(prompt)})
        parts: list[str] = []
        outcome: dict[str, Any] = {"stopReason": "end_turn"}
        with anyio.CancelScope() as scope:
            session.scope = scope
            try:
                outcome = await self._stream(session, parts)
            finally:
                session.scope = None
        if scope.cancelled_caught:
            outcome = {"stopReason": "cancelled"}
        reply = "".join(parts)
        if reply:
            session.history.append({"role": "assistant", "content": reply})
        del session.history[:-self._factory.max_history_messages]
        return outcome

    async def _stream(self, session: _ModelSession, parts: list[str]) -> dict[str, Any]:
        url = self._factory.base_url + "/chat/completions"
        body = {"model": self._factory.model, "messages": session.history, "stream": True,
                "stream_options": {"include_usage": True}}
        stop_reason, usage = "end_turn", None
        try:
            async with aconnect_sse(self._http, "POST", url, json=body) as source:
                response = source.response
                if response.status_code >= 400:
                    detail = (await response.aread())[:500].decode("utf-8", "replace")
                    raise AgentError(INTERNAL_ERROR, f"Model server {self._factory.base_url} "
                                     f"answered {response.status_code}: {detail}")
                async for sse in source.aiter_sse():
                    if sse.data.strip() == "[DONE]":
                        break
                    chunk = _chunk_decoder.decode(sse.data)
                    if chunk.usage is not None:
                        usage = chunk.usage
                    for choice in chunk.choices:
                        text = choice.delta.content if choice.delta is not None else None
                        if text:
                            parts.append(text)
                            self._client.session_update(session.session_id, {
                                "sessionId": session.session_id,
                                "update": {"sessionUpdate": "agent_message_chunk",
                                           "content": {"type": "text", "text": text}}})
                        if choice.finish_reason:
                            stop_reason = FINISH_TO_STOP.get(choice.finish_reason, "end_turn")
        except httpx.TimeoutException as exc:
            raise AgentError(INTERNAL_ERROR, f"Model server {self._factory.base_url} timed out: "
                             f"{type(exc).__name__}") from None
        except httpx.HTTPError as exc:
            raise AgentError(INTERNAL_ERROR, f"Cannot reach model server "
                             f"{self._factory.base_url}: {exc}") from None
        except msgspec.DecodeError as exc:
            raise AgentError(INTERNAL_ERROR, f"Model server sent an invalid chunk: {exc}") from None
        result: dict[str, Any] = {"stopReason": stop_reason}
        if usage is not None:
            result["usage"] = {"inputTokens": usage.prompt_tokens,
                               "outputTokens": usage.completion_tokens,
                               "totalTokens": usage.total_tokens}
            self._client.session_update(session.session_id, {
                "sessionId": session.session_id,
                "update": {"sessionUpdate": "usage_update", "used": usage.total_tokens,
                           "size": 0, "_meta": {"acp-server/usage": result["usage"]}}})
        return result


def _prompt_text(prompt: Any) -> str:
    """The text of a prompt's blocks: text, and the text of embedded resources."""
    parts = []
    for block in prompt if isinstance(prompt, list) else ():
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            parts.append(block["text"])
        elif block.get("type") == "resource":
            resource = block.get("resource")
            if isinstance(resource, dict) and isinstance(resource.get("text"), str):
                parts.append(resource["text"])
    return "\n".join(parts)
