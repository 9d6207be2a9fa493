"""The model agent: ACP prompts become streaming ``/v1/chat/completions`` calls to an
OpenAI-compatible model server (Ollama, llama.cpp server, vLLM, LM Studio).

    models = await discover_models("http://127.0.0.1:11434/v1")       # ["qwen3:14b", ...]
    factory = ModelAgentFactory("http://127.0.0.1:11434/v1", model="qwen3:14b")
    async with Bridge(factory, workspace_cwd=".") as bridge: ...

Contracts:

* Each session keeps its conversation (user and assistant turns, its newest
  ``max_history_messages`` within ``max_history_chars`` (``MAX_HISTORY_CHARS``) in all,
  the newest message always) and sends it whole with every prompt. Its roles
  alternate user/assistant from a user message (strict chat templates refuse anything
  else): messages of one role in a row are joined by a blank line (a prompt that got no
  reply, on a fault or a cancel, goes with the next), an assistant message first is
  dropped. A ``session/new``
  with ``_meta["acp-server/transcript"]`` (``bridge.transcript``: a session the server
  restores from its journal) starts with that conversation. A fault that says the
  conversation is over the model's context (``model_history.context_exceeded``) ends
  the turn with a message that says so and how to go on, ``data`` ``{"errorKind":
  "context_length_exceeded"}``; the prompt is then not kept.
* Streamed ``delta.content`` becomes ``agent_message_chunk`` updates in order, a
  thinking model's ``delta.reasoning_content`` (or ``delta.reasoning``)
  ``agent_thought_chunk`` updates, never kept in the history (counted in the reply's
  cap).
  ``finish_reason`` maps ``stop``/``tool_calls`` → ``end_turn``, ``length`` →
  ``max_tokens``, ``content_filter`` → ``refusal``. Usage (``stream_options.include_usage``)
  is passed on as the response's ``usage`` and a ``usage_update``, whatever its shape
  (``bridge.agents.chat_wire.read_usage``: never a reason to fail the turn). A 400 whose
  error names ``stream_options`` (its message or its ``param``) sends the turn again
  without them, and the factory's ``upstream`` (``ModelServerState``, shared by a
  server's models) remembers it.
* Every session's turn has its own connection at once (no pool limit: the sessions
  bound them); at most 20 idle ones are kept for the next turns.
* ``session/cancel`` closes the upstream stream at once (also while it is silent, before
  or after its headers); the turn ends ``cancelled``. The text received so far is kept
  in the history, on cancel and on an error alike.
* The upstream is not trusted (``bridge.agents.upstream`` reads it): one SSE line or
  event over ``max_event_bytes`` (``MAX_EVENT_BYTES``), or a body over
  ``max_stream_bytes`` (``MAX_STREAM_BYTES``), ends the turn with an error and closes the
  connection; caps count decoded bytes (gzip included). A reply whose text passes
  ``max_reply_bytes`` (``MAX_REPLY_BYTES``) ends the turn ``max_tokens`` with the text
  up to the cap. An error body is read only as far as it is quoted.
* Every fault ends the turn with a JSON-RPC error (-32603) whose message is ``Model
  server URL <cause>`` (``Cannot reach model server URL: ...`` when unreachable; URL
  with its credentials, if any, as ``***``: they are sent as basic auth only): an
  error status (with its ``Retry-After`` and the body's error message; never retried),
  a redirect (named, not followed), an error the server streams (``data: {"error":
  ...}`` or ``event: error``), a content type that is no event stream, a chunk that is
  not a ``chat.completion.chunk``, a connection broken off, a stream that ends with
  neither a ``finish_reason`` nor ``[DONE]``, ``timeout_s`` (``READ_TIMEOUT_S``) without
  a byte, JSON nested past the decoder's depth. A JSON ``chat.completion`` (a server that
  ignores ``stream``) is taken whole. A body of another content type that opens as an
  event stream does (``data:``, ``event:``, a comment: a proxy that mislabels it) is read
  as one.
* After a ``finish_reason`` the stream may end without ``[DONE]``, or stay open: at
  ``finish_grace_s`` (``FINISH_GRACE_S``) after it the turn ends normally, whatever
  comes meanwhile (a usage chunk still counts; keep-alive comments do not hold it open).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import anyio
import anyio.abc
import httpx
import msgspec

from bridge.agents.base import AgentClient
from bridge.agents.model_history import context_exceeded, prompt_text, trim
from bridge.agents.chat_wire import (Chunk, Usage, chunk_decoder, completion_decoder,
                                     models_decoder, read_usage)
from bridge.agents.upstream import (MAX_EVENT_BYTES, MAX_STREAM_BYTES, BoundedBody, SseParser,
                                    Surrogates, UpstreamError, body_message, decode_lenient,
                                    error_body, error_detail, error_message, public_url, size_text,
                                    split_credentials)
from bridge.errors import AgentDiedError, AgentError
from bridge.wire import CONTEXT_LENGTH_EXCEEDED, agent_error_data, agent_error_kind
from bridge.ids import uuid4_str
from bridge.transcript import seeded

logger = logging.getLogger(__name__)

REQUESTED_SESSION_ID_META = "acp-server/requestedSessionId"
FINISH_TO_STOP = {"stop": "end_turn", "tool_calls": "end_turn", "function_call": "end_turn",
                  "length": "max_tokens", "content_filter": "refusal"}
INTERNAL_ERROR = -32603
METHOD_NOT_FOUND = -32601
SESSION_NOT_FOUND = -32002

MAX_REPLY_BYTES = 4 * 1024 * 1024   # one reply's text (UTF-8): past it the turn ends max_tokens
MAX_HISTORY_CHARS = 16 * 1024 * 1024   # a session's conversation: the oldest messages go first
READ_TIMEOUT_S = 300.0              # silence allowed before headers and between bytes
CONNECT_TIMEOUT_S = 10.0
FINISH_GRACE_S = 5.0                # after a finish_reason: wait this long for [DONE] or the end
MAX_MODEL_ID_CHARS = 256
MAX_MODELS = 1000                   # model ids taken from /models; the rest are skipped
_STREAM_HEADERS = {"Accept": "text/event-stream", "Accept-Encoding": "identity",
                   "Cache-Control": "no-store"}




async def discover_models(base_url: str, *, api_key: str | None = None,
                          timeout_s: float = 10.0, max_bytes: int = MAX_EVENT_BYTES) -> list[str]:
    """The model ids the server lists at ``GET {base_url}/models``: each string ``id``
    once, in order, the first ``MAX_MODELS`` (an id that is empty, over
    ``MAX_MODEL_ID_CHARS`` or holds control characters is skipped; logged). Within
    ``timeout_s`` in all and ``max_bytes`` of body, else ``UpstreamError`` naming the
    cause (an error status, not JSON, the wrong shape, unreachable)."""
    shown = public_url(base_url.rstrip("/"))
    base, basic = split_credentials(base_url.rstrip("/"))
    headers = {**_auth(api_key), "Accept": "application/json", "Accept-Encoding": "identity"}
    try:
        with anyio.fail_after(timeout_s):
            async with httpx.AsyncClient(timeout=timeout_s, headers=headers,
                                         auth=basic) as client, \
                    client.stream("GET", base + "/models") as response:
                if response.status_code >= 300:
                    hint = (" (an OpenAI-compatible base URL usually ends in /v1)"
                            if response.status_code == 404 and not base.endswith("/v1") else "")
                    raise UpstreamError(_status_text(response, "/models")
                                        + _colon(await error_detail(response)) + hint)
                body = BoundedBody(response, limit=max_bytes)
                data = bytearray()
                while chunk := await body.read():
                    data += chunk
                kind = _content_type(response)
    except TimeoutError:
        raise UpstreamError(f"did not list its models at /models within {timeout_s:g} s") from None
    except httpx.HTTPError as exc:
        raise UpstreamError(_transport_text(exc, timeout_s)) from None
    try:
        models = models_decoder.decode(data)
    except (msgspec.ValidationError, RecursionError) as exc:
        why = "JSON nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise UpstreamError(f'listed its models at /models in an unknown shape ({why}; '
                            f'expected {{"data": [{{"id": ...}}]}})') from None
    except msgspec.DecodeError:
        raise UpstreamError(f"answered /models with {kind or 'no Content-Type'}, not JSON: "
                            f"{body_message(bytes(data[:200]))[:120]!r}") from None
    ids: dict[str, None] = {}
    skipped = 0
    for item in models.data:
        model = item.get("id") if isinstance(item, dict) else None
        if isinstance(model, str) and 0 < len(model) <= MAX_MODEL_ID_CHARS \
                and model.isprintable() and model.strip() == model:
            ids[model] = None
        else:
            skipped += 1
    if skipped:
        logger.warning("model server %s: skipped %d /models entries without a usable id",
                       shown, skipped)
    if len(ids) > MAX_MODELS:
        logger.warning("model server %s lists %d models: offering the first %d",
                       shown, len(ids), MAX_MODELS)
    return list(ids)[:MAX_MODELS]


def _auth(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _content_type(response: httpx.Response) -> str:
    return response.headers.get("content-type", "").partition(";")[0].strip().lower()


def _colon(detail: str) -> str:
    return f": {detail}" if detail else ""


def _status_text(response: httpx.Response, where: str) -> str:
    """``answered 429 (Retry-After: 30)``; a redirect names where it points."""
    status = response.status_code
    text = f"answered {status}"
    if where:
        text += f" at {where}"
    if 300 <= status < 400:
        location = response.headers.get("location", "")[:200]
        return (text + f", a redirect to {location!r} (not followed: give the model "
                f"server's final URL)")
    retry = response.headers.get("retry-after", "")[:40]
    return text + (f" (Retry-After: {retry})" if retry else "")


def _transport_text(exc: httpx.HTTPError, read_timeout_s: float) -> str:
    """What a transport failure says after the server's name."""
    cause = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
        return f"cannot be reached ({cause})"
    if isinstance(exc, httpx.ReadTimeout):
        return f"sent nothing for {read_timeout_s:g} s (the read timeout)"
    if isinstance(exc, httpx.TimeoutException):
        return f"timed out ({cause})"
    return f"broke off the reply ({cause})"


def _turn_error(base_url: str, cause: str) -> AgentError:
    if cause.startswith("cannot be reached "):
        return AgentError(INTERNAL_ERROR, f"Cannot reach model server {base_url}: "
                          f"{cause.removeprefix('cannot be reached (').removesuffix(')')}")
    return AgentError(INTERNAL_ERROR, f"Model server {base_url} {cause}")


class ModelServerState:
    """What the agents of one model server learn of it (the factories of its models
    share one): whether it takes ``stream_options``."""

    __slots__ = ("stream_options",)

    def __init__(self) -> None:
        self.stream_options = True


class _StreamOptionsRefused(Exception):
    """A 400 naming ``stream_options``: the turn is sent again without them."""


class ModelAgentFactory:
    """``AgentFactory`` for one model of one OpenAI-compatible server. The limits are
    the module's constants unless given (tests give small ones). ``api_key`` is sent as
    ``Authorization: Bearer``; ``upstream`` is shared by the models of one server."""

    def __init__(self, base_url: str, *, model: str, name: str | None = None,
                 api_key: str | None = None, timeout_s: float = READ_TIMEOUT_S,
                 max_history_messages: int = 200, max_history_chars: int = MAX_HISTORY_CHARS,
                 max_reply_bytes: int = MAX_REPLY_BYTES,
                 max_event_bytes: int = MAX_EVENT_BYTES,
                 max_stream_bytes: int = MAX_STREAM_BYTES,
                 finish_grace_s: float = FINISH_GRACE_S,
                 upstream: ModelServerState | None = None) -> None:
        # credentials in the URL (a proxy behind basic auth) are sent, never shown
        self.shown_url = public_url(base_url.rstrip("/"))
        self.base_url, self.basic_auth = split_credentials(base_url.rstrip("/"))
        self.model = model
        self.name = name or model
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.max_history_messages = max_history_messages
        self.max_history_chars = max_history_chars
        self.max_reply_bytes = max_reply_bytes
        self.max_event_bytes = max_event_bytes
        self.max_stream_bytes = max_stream_bytes
        self.finish_grace_s = finish_grace_s
        self.upstream = upstream or ModelServerState()

    async def connect(self, client: AgentClient, task_group: anyio.abc.TaskGroup) -> ModelConnection:
        return ModelConnection(self, client)


class _ModelSession:
    __slots__ = ("session_id", "cwd", "history", "scope")

    def __init__(self, session_id: str, cwd: str, history: list[dict[str, str]] | None = None) -> None:
        self.session_id = session_id
        self.cwd = cwd
        self.history = history or []
        self.scope: anyio.CancelScope | None = None


class _Reply:
    """The reply's text so far, at most ``cap`` bytes (UTF-8)."""

    __slots__ = ("parts", "size", "cap")

    def __init__(self, cap: int) -> None:
        self.parts: list[str] = []
        self.size = 0
        self.cap = cap

    def add(self, text: str, *, keep: bool = True) -> bool:
        """Count ``text`` (and keep it, unless a thought); ``False`` (and nothing
        counted) when it would pass the cap."""
        size = len(text.encode())
        if self.size + size > self.cap:
            return False
        if keep:
            self.parts.append(text)
        self.size += size
        return True


class ModelConnection:
    """An in-process ``AgentConnection`` speaking to the model server over HTTP."""

    def __init__(self, factory: ModelAgentFactory, client: AgentClient) -> None:
        self._factory = factory
        self._client = client
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(factory.timeout_s, connect=CONNECT_TIMEOUT_S),
            headers=_auth(factory.api_key), auth=factory.basic_auth,
            # one turn per session at a time: the sessions (--max-sessions) bound the
            # connections; a pool of its own would hold turns back past it
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=20))
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
                       for role, text in seeded(meta)]
            session = self._sessions[session_id] = _ModelSession(
                session_id, str(params.get("cwd", "")), history)
            self._trim(session)
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
        before = list(session.history)
        session.history.append({"role": "user", "content": prompt_text(prompt)})
        self._trim(session)
        reply = _Reply(self._factory.max_reply_bytes)
        outcome: dict[str, Any] = {"stopReason": "end_turn"}
        try:
            with anyio.CancelScope() as scope:
                session.scope = scope
                try:
                    outcome = await self._stream(session, reply)
                except AgentError as exc:   # over the context: this prompt is not kept
                    if agent_error_kind(exc.data) == CONTEXT_LENGTH_EXCEEDED:
                        session.history[:] = before
                        reply.parts.clear()
                    raise
                finally:
                    session.scope = None
            if scope.cancelled_caught:
                outcome = {"stopReason": "cancelled"}
        finally:   # the text received is kept, also when the turn fails
            if reply.parts:
                session.history.append({"role": "assistant", "content": "".join(reply.parts)})
            self._trim(session)
        return outcome

    def _trim(self, session: _ModelSession) -> None:
        trim(session.history, self._factory.max_history_messages,
              self._factory.max_history_chars)

    async def _stream(self, session: _ModelSession, reply: _Reply) -> dict[str, Any]:
        try:
            try:
                return await self._post(session, reply)
            except _StreamOptionsRefused as exc:   # once more without them, from now on
                self._factory.upstream.stream_options = False
                logger.warning("model server %s refused stream_options (%s): not sending "
                               "them again (usage only if it reports it unasked)",
                               self._factory.shown_url, exc)
                return await self._post(session, reply)
        except UpstreamError as exc:
            raise self._fault(session, str(exc)) from None
        except httpx.HTTPError as exc:
            raise self._fault(session, _transport_text(exc, self._factory.timeout_s)) from None

    def _fault(self, session: _ModelSession, cause: str) -> AgentError:
        error = _turn_error(self._factory.shown_url, cause)
        if not context_exceeded(cause):
            return error
        chars = sum(len(message["content"]) for message in session.history)
        return AgentError(INTERNAL_ERROR, (
            f"{error.message}: the conversation ({chars} characters) exceeds the model's "
            f"context window. Start a new session, or have fewer of its newest characters "
            f"sent (--model-history-chars, now {self._factory.max_history_chars})"),
            agent_error_data(CONTEXT_LENGTH_EXCEEDED))

    async def _post(self, session: _ModelSession, reply: _Reply) -> dict[str, Any]:
        url = self._factory.base_url + "/chat/completions"
        body: dict[str, Any] = {"model": self._factory.model, "messages": session.history,
                                "stream": True}
        if self._factory.upstream.stream_options:
            body["stream_options"] = {"include_usage": True}
        async with self._http.stream("POST", url, json=body,
                                     headers=_STREAM_HEADERS) as response:
            if response.status_code >= 300:
                data = await error_body(response)
                detail = body_message(data)[:500]
                if response.status_code == 400 and "stream_options" in body \
                        and b"stream_options" in data:   # its message, or its ``param``
                    raise _StreamOptionsRefused(detail)
                raise UpstreamError(_status_text(response, "") + _colon(detail))
            kind = _content_type(response)
            source = BoundedBody(response, limit=self._factory.max_stream_bytes)
            start = b""
            if kind not in ("", "text/event-stream"):   # mislabelled? what it opens with
                start = await _opening(source)
                if not start.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(_SSE_FIELDS):
                    if kind == "application/json":
                        return self._result(session, *await self._whole(
                            session, reply, source, start, response.status_code))
                    start += await _opening(source, 200 - len(start))   # to quote
                    raise UpstreamError(
                        f"answered {response.status_code} with Content-Type {kind!r}, not "
                        f"an event stream" + _colon(body_message(start[:200])[:200]))
            return self._result(session, *await self._events(session, reply, source, start))

    async def _events(self, session: _ModelSession, reply: _Reply, source: BoundedBody,
                      start: bytes) -> tuple[str, Usage | None]:
        """The event stream (``start``: its bytes read already), to ``[DONE]``, to its
        end after a ``finish_reason``, or to ``finish_grace_s`` after one (a deadline:
        comments sent meanwhile do not move it)."""
        parser = SseParser(max_event_bytes=self._factory.max_event_bytes)
        stop_reason: str | None = None
        usage: Usage | None = None
        deadline = math.inf   # set at the first finish_reason
        halves = (Surrogates(), Surrogates())   # of the thoughts, of the text
        while True:
            data, start = start, b""
            with anyio.CancelScope(deadline=deadline):
                data = data or await source.read()
            if not data:   # the end, or the grace after the finish is over
                break
            for event, text in parser.feed(data):
                if text.strip() == "[DONE]":
                    return stop_reason or "end_turn", usage
                if event == "error":
                    raise UpstreamError(f"reported an error: {body_message(text.encode())[:500]}")
                if not text.strip():
                    continue
                chunk, lenient = self._decode(text)
                usage = read_usage(chunk.usage) or usage
                for choice in chunk.choices or ():
                    delta = choice.delta
                    thought = delta.thought() if delta is not None else None
                    content = delta.content if delta is not None else None
                    if lenient or halves[0].held or halves[1].held:
                        thought = halves[0].join(thought) if thought else thought
                        content = halves[1].join(content) if content else content
                    if thought and not self._emit(session, reply, thought, thought=True):
                        return "max_tokens", usage
                    if content and not self._emit(session, reply, content):
                        return "max_tokens", usage
                    if choice.finish_reason:
                        stop_reason = FINISH_TO_STOP.get(choice.finish_reason, "end_turn")
                        deadline = min(deadline,
                                       anyio.current_time() + self._factory.finish_grace_s)
        if stop_reason is None:
            raise UpstreamError("ended the stream before the reply finished (no finish_reason, "
                                "no [DONE])")
        return stop_reason, usage

    def _decode(self, text: str) -> tuple[Chunk, bool]:
        """The chunk, and whether its strings may hold surrogate halves."""
        lenient = False
        try:
            chunk = chunk_decoder.decode(text)
        except (msgspec.DecodeError, RecursionError) as exc:   # RecursionError: nested deep
            chunk = decode_lenient(text, Chunk) if isinstance(exc, msgspec.DecodeError) \
                and not isinstance(exc, msgspec.ValidationError) else None
            if chunk is None:
                why = "JSON nested too deeply" if isinstance(exc, RecursionError) else str(exc)
                raise UpstreamError(f"sent a chunk that is not a chat.completion.chunk "
                                    f"({why}): {text[:120]!r}") from None
            lenient = True
        if chunk.error is not None:
            message = error_message(chunk.error) or repr(chunk.error)[:300]
            raise UpstreamError(f"reported an error: {Surrogates().join(message)}")
        return chunk, lenient

    def _emit(self, session: _ModelSession, reply: _Reply, text: str, *,
              thought: bool = False) -> bool:
        """One ``agent_message_chunk`` (``agent_thought_chunk``: not kept in the
        history); ``False`` (nothing sent) past the reply's cap."""
        if not reply.add(text, keep=not thought):
            logger.warning("model server %s: reply in session %s over %s, turn ended "
                           "max_tokens", self._factory.shown_url, session.session_id,
                           size_text(reply.cap))
            return False
        self._client.session_update(session.session_id, {
            "sessionId": session.session_id,
            "update": {"sessionUpdate": "agent_thought_chunk" if thought
                       else "agent_message_chunk",
                       "content": {"type": "text", "text": text}}})
        return True

    async def _whole(self, session: _ModelSession, reply: _Reply, source: BoundedBody,
                     start: bytes, status: int) -> tuple[str, Usage | None]:
        """A JSON answer (``start``: its bytes read already): a whole completion (a
        server that does not stream) or an error in the OpenAI shape."""
        data = bytearray(start)
        while chunk := await source.read():
            data += chunk
            if len(data) > self._factory.max_event_bytes:
                raise UpstreamError(f"sent more than {size_text(self._factory.max_event_bytes)}"
                                    f" in one reply")
        try:
            completion = completion_decoder.decode(data)
        except (msgspec.DecodeError, RecursionError):
            completion = None
        if completion is not None and completion.error is not None:
            message = error_message(completion.error) or repr(completion.error)[:300]
            raise UpstreamError(f"reported an error: {message}")
        if completion is None or not completion.choices:
            raise UpstreamError(f"answered {status} with JSON that is neither a "
                                f"stream nor a completion: {body_message(bytes(data[:300]))[:200]}")
        stop_reason = "end_turn"
        for choice in completion.choices[:1]:
            thought = choice.message.thought() if choice.message is not None else None
            if thought and not self._emit(session, reply, thought, thought=True):
                return "max_tokens", read_usage(completion.usage)
            content = choice.message.content if choice.message is not None else None
            if content and not self._emit(session, reply, content):
                return "max_tokens", read_usage(completion.usage)
            if choice.finish_reason:
                stop_reason = FINISH_TO_STOP.get(choice.finish_reason, "end_turn")
        return stop_reason, read_usage(completion.usage)

    def _result(self, session: _ModelSession, stop_reason: str,
                usage: Usage | None) -> dict[str, Any]:
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


_SSE_FIELDS = (b"data:", b"event:", b":", b"id:", b"retry:")


async def _opening(source: BoundedBody, enough: int = 8) -> bytes:
    """The first bytes of a body: ``enough`` past whitespace and a byte order mark (to
    tell an event stream), all of them at its end; 4 KiB at most and one chunk more."""
    start = b""
    while len(start.lstrip(b"\xef\xbb\xbf \t\r\n")) < enough and len(start) < 4096 \
            and (chunk := await source.read()):
        start += chunk
    return start
