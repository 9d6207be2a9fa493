"""A misbehaving OpenAI-compatible model server: raw HTTP/1.1 on a loopback port, so
that it can send what no well-behaved framework would (an endless line, a reset, a
gzip bomb, a stall before the headers).

    async with hostile_model_server() as upstream:          # upstream.url ends in /v1
        factory = ModelAgentFactory(upstream.url, model="m")
        ...   # the prompt's last words pick the behaviour: "ENDLESS_LINE please"
        await wait_until(lambda: upstream.cut_off == ["ENDLESS_LINE"])

Contracts:

* ``POST /v1/chat/completions``: the first word of ``BEHAVIOURS`` found in the last
  message's text (after its last blank line) picks what is sent; none → a well-behaved ``pong: <text>`` reply in
  three chunks, a finish, a usage chunk and ``[DONE]``. Every request is recorded in
  ``requests`` (its JSON body) and the behaviour in ``seen``; the ``Authorization``
  header of each request (``/models`` too) in ``authorizations``.
* ``strict_roles``: answer 400, as vLLM or llama.cpp do with a chat template that
  requires it (Gemma's, Mistral's), a conversation whose roles do not alternate
  user/assistant starting with user (``ROLES_ERROR``).
* ``context_chars``: answer 400 as llama.cpp does (``CONTEXT_ERROR``,
  ``exceed_context_size_error``) a conversation of more characters in all (``seen``:
  ``context_refused``), as a server with a small ``--ctx-size``.
* ``refuse_stream_options``: answer 400 as older Azure OpenAI API versions do
  (``STREAM_OPTIONS_ERROR``; ``"param"``: a generic message naming the field in
  ``param`` only) a request with ``stream_options`` (``seen``:
  ``stream_options_refused``).
* ``GET /v1/models``: ``models_mode`` picks (``MODELS_MODES``); ``"ok"`` lists
  ``["m-one", "m-two"]``.
* One request per connection (``Connection: close``); bodies are close-delimited.
* Endless behaviours write until the client closes the connection (then the behaviour
  is appended to ``cut_off``) or ``budget`` bytes were sent (then to ``exhausted``: the
  client never gave up, a failure for the test to see). Stalls wait for the client to
  close (→ ``cut_off``), at most ``STALL_LIMIT_S``. Nothing here runs unbounded.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import socket
import struct
import zlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.abc
from anyio.abc import SocketAttribute

from tests.bridge.fake_model_server import chunk

STALL_LIMIT_S = 60.0
BLOCK = 64 * 1024
SSE = {"Content-Type": "text/event-stream"}
BEHAVIOURS = ("ENDLESS_LINE", "ENDLESS_EVENT", "ENDLESS_REPLY", "ENDLESS_ERROR", "STREAM_ERROR",
              "ERROR_EVENT", "HTML", "JSON_ERROR", "WHOLE", "BAD_JSON", "WRONG_TYPE", "RESET",
              "TRUNCATED", "STALL_HEADERS", "STALL_CHUNKS", "NO_DONE", "RATE_LIMITED",
              "UNAVAILABLE", "REDIRECT", "GZIP_BOMB", "GZIP_OK", "KEEPALIVE_ONLY", "BROTLI",
              "GZIP_MEMBERS", "GZIP_CUT", "GZIP_TRAILING", "DEFLATE_RAW", "DEFLATE_ZLIB",
              "BYTE_ORDER_MARK", "KEEPALIVE_AFTER_FINISH", "DEEP_CHUNK", "DEEP_ERROR",
              "DEEP_COMPLETION", "REASONING", "SPLIT_EMOJI",
              "SURROGATE_ERROR", "NULL_USAGE", "OTHER_USAGE",
              "NULL_CHOICES", "SSE_AS_TEXT", "SSE_AS_JSON", "TEXT_ERROR")
DEEP = 5000   # JSON arrays nested this deep: past any recursive decoder's depth (10 KB)
ROLES_ERROR = "Conversation roles must alternate user/assistant/user/assistant/..."
CONTEXT_ERROR = "the request exceeds the available context size, try increasing it"
STREAM_OPTIONS_ERROR = "Unrecognized request argument supplied: stream_options"
EXTRA_FIELD_ERROR = "Extra inputs are not permitted"
MODELS_MODES = ("ok", "endless", "wrong_types", "mixed", "many", "html", "stall", "missing",
                "deep")


def head(status: int, reason: str, headers: dict[str, str] | None = None) -> bytes:
    lines = [f"HTTP/1.1 {status} {reason}", "Connection: close", "Cache-Control: no-store"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def gzip_bomb_body() -> bytes:
    """``data: `` and 64 MiB of ``x`` with no newline, gzipped (~64 KiB)."""
    return gzip.compress(b"data: " + b"x" * (64 * 1024 * 1024), compresslevel=9)


class HostileModelServer:
    def __init__(self, budget: int = 64 * 1024 * 1024) -> None:
        self.budget = budget
        self.url = ""
        self.port = 0
        self.models_mode = "ok"
        self.requests: list[dict[str, Any]] = []
        self.seen: list[str] = []
        self.cut_off: list[str] = []
        self.exhausted: list[str] = []
        self.stalled: list[str] = []     # stalls under way (appended when they begin)
        self.strict_roles = False
        self.context_chars: int | None = None
        self.refuse_stream_options: bool | str = False   # "param": named in ``param`` only
        self.authorizations: list[str] = []   # each request's Authorization header
        self._bomb: bytes | None = None

    # -- the connection ----------------------------------------------------------------
    async def handle(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            try:
                request = await _read_request(stream)
                if request is None:
                    return
                method, path, headers, body = request
                self.authorizations.append(headers.get("authorization", ""))
                if method == "GET" and path.endswith("/models"):
                    await self._models(stream)
                elif method == "POST" and path.endswith("/chat/completions"):
                    await self._completions(stream, body)
                else:
                    await stream.send(head(404, "Not Found", {"Content-Type": "text/plain"})
                                      + b"no such route")
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream,
                    ConnectionError):
                pass

    async def _completions(self, stream: anyio.abc.SocketStream, raw: bytes) -> None:
        body = json.loads(raw)
        self.requests.append(body)
        roles = [m.get("role") for m in body["messages"]]
        if self.strict_roles and roles != ["user", "assistant"] * (len(roles) // 2) + \
                ["user"] * (len(roles) % 2):
            self.seen.append("roles_refused")
            error = {"error": {"message": ROLES_ERROR, "type": "BadRequestError", "code": 400}}
            await stream.send(head(400, "Bad Request", {"Content-Type": "application/json"})
                              + json.dumps(error).encode())
            return
        refusal = self._refusal(body)
        if refusal is not None:
            await stream.send(head(400, "Bad Request", {"Content-Type": "application/json"})
                              + json.dumps(refusal).encode())
            return
        content = body["messages"][-1].get("content")
        last = content if isinstance(content, str) else json.dumps(content)
        last = last.rsplit("\n\n", 1)[-1]   # the newest prompt of a joined message
        behaviour = next((b for b in BEHAVIOURS if b in last), "")
        self.seen.append(behaviour or "normal")
        if not behaviour:
            reply = f"pong: {last[:200]}"
            third = len(reply) // 3
            await stream.send(head(200, "OK", SSE) + b"".join(
                chunk(piece) for piece in (reply[:third], reply[third:2 * third], reply[2 * third:]))
                + chunk(finish="stop")
                + chunk(usage={"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8})
                + b"data: [DONE]\n\n")
            return
        await getattr(self, "_" + behaviour.lower())(stream, behaviour)

    def _refusal(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """The 400 body of ``context_chars`` / ``refuse_stream_options``, if due."""
        chars = sum(len(m.get("content") or "") for m in body["messages"])
        if self.context_chars is not None and chars > self.context_chars:
            self.seen.append("context_refused")
            return {"error": {"code": 400, "message": CONTEXT_ERROR,
                              "type": "exceed_context_size_error",
                              "n_prompt_tokens": chars, "n_ctx": self.context_chars}}
        if self.refuse_stream_options and "stream_options" in body:
            self.seen.append("stream_options_refused")
            if self.refuse_stream_options == "param":   # the field named apart
                return {"error": {"message": EXTRA_FIELD_ERROR,
                                  "type": "invalid_request_error",
                                  "param": "stream_options", "code": None}}
            return {"error": {"message": STREAM_OPTIONS_ERROR, "type": "invalid_request_error",
                              "param": None, "code": None}}
        return None

    async def _endless(self, stream: anyio.abc.SocketStream, behaviour: str,
                       block: bytes) -> None:
        sent = 0
        try:
            while sent < self.budget:
                await stream.send(block)
                sent += len(block)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, ConnectionError):
            self.cut_off.append(behaviour)
            return
        self.exhausted.append(behaviour)

    async def _stall(self, stream: anyio.abc.SocketStream, behaviour: str) -> None:
        """Send nothing until the client closes (or ``STALL_LIMIT_S``)."""
        self.stalled.append(behaviour)
        with anyio.move_on_after(STALL_LIMIT_S):
            try:
                while await stream.receive():
                    pass
            except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionError):
                pass
            self.cut_off.append(behaviour)

    # -- the behaviours -------------------------------------------------------------------
    async def _endless_line(self, stream: anyio.abc.SocketStream, behaviour: str) -> None:
        await stream.send(head(200, "OK", SSE) + b"data: ")
        await self._endless(stream, behaviour, b"x" * BLOCK)

    async def _endless_event(self, stream: anyio.abc.SocketStream, behaviour: str) -> None:
        await stream.send(head(200, "OK", SSE))
        await self._endless(stream, behaviour, b"data: " + b"x" * 1000 + b"\n")

    async def _endless_reply(self, stream: anyio.abc.SocketStream, behaviour: str) -> None:
        await stream.send(head(200, "OK", SSE))
        await self._endless(stream, behaviour, chunk("y" * 4000))

    async def _endless_error(self, stream: anyio.abc.SocketStream, behaviour: str) -> None:
        await stream.send(head(500, "Internal Server Error", {"Content-Type": "text/plain"})
                          + b"upstream trouble: ")
        await self._endless(stream, behaviour, b"z" * BLOCK)

    async def _keepalive_only(self, stream: anyio.abc.SocketStream, behaviour: str) -> None:
        await stream.send(head(200, "OK", SSE))
        await self._endless(stream, behaviour, b": keep-alive\n\n" * 1000)

    async def _stream_error(self, stream: anyio.abc.SocketStream, behaviour: str) -> None:
        error = {"error": {"message": "The upstream model crashed", "type": "server_error",
                           "code": "model_crashed"}}
        await stream.send(head(200, "OK", SSE) + chunk("partial ")
                          + b"data: " + json.dumps(error).encode() + b"\n\n")

    async def _error_event(self, stream: anyio.abc.SocketStream, behaviour: str) -> None:
        error = {"error": {"message": "context window exceeded", "code": 400}}
        await stream.send(head(200, "OK", SSE) + b"event: error\ndata: "
                          + json.dumps(error).encode() + b"\n\n")

    async def _html(self, stream: anyio.abc.SocketStream, behaviour: str) -> None:
        await stream.send(head(200, "OK", {"Content-Type": "text/html; charset=utf-8"})
                          + b"<html><body><h1>Sign in to the proxy</h1></body></html>")

    async def _json_error(self, stream: anyio.abc.SocketStream, behaviour: str) -> None:
        error = {"error": {"message": "Invalid API key", "type": "invalid_request_error"}}
        await stream.send(head(200, "OK", {"Content-Type": "application/json"})
                          + json.dumps(error).encode())

    async def _whole(self, stream: anyio.abc.SocketStream, behaviour: str) -> None:
        completion = {"object": "chat.completion", "choices": [
            {"index": 0, "finish_reason": "stop",
             "message": {"role": "assistant", "content": "a whole answer",
                         "reasoning_content": "thought through"}}],
            "usage": {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}}
        await stream.send(head(200, "OK", {"Content-Type": "application/json"})
                          + json.dumps(completion).encode())

    async def _bad_json(self, stream: anyio.abc.SocketStream, behaviour: str) -> None:
        await stream.send(head(200, "OK", SSE) + chunk("ok ") + b"data: {not json\n\n")

    async def _wrong_type(self, stream: anyio.abc.SocketStream, behaviour: str) -> None:
        await stream.send(head(200, "OK", SSE) + b'data: {"choices": [{"delta": {"content": 5}}]}\n\n')

    async def _reset(self, stream: anyio.abc.SocketStream, behaviour: str) -> None:
        await stream.send(head(200, "OK", SSE) + chunk("half a "))
        sock = stream.extra(SocketAttribute.raw_socket)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.cut_off.append(behaviour)   # closing now sends a reset

    async def _truncated(self, stream: anyio.abc.SocketStream, behaviour: str) -> None:
        await stream.send(head(200, "OK", SSE) + chunk("cut short "))

    async def _stall_headers(self, stream: anyio.abc.SocketStream, behaviour: str) -> None:
        await self._stall(stream, behaviour)

    async def _stall_chunks(self, stream: anyio.abc.SocketStream, behaviour: str) -> None:
        await stream.send(head(200, "OK", SSE) + chunk("first "))
        await self._stall(stream, behaviour)

    async def _no_done(self, stream: anyio.abc.SocketStream, behaviour: str) -> None:
        await stream.send(head(200, "OK", SSE) + chunk("all of it") + chunk(finish="stop")
                          + chunk(usage={"prompt_tokens": 2, "completion_tokens": 1,
                                         "total_tokens": 3}))
        await self._stall(stream, behaviour)

    async def _rate_limited(self, stream: anyio.abc.SocketStream, behaviour: str) -> None:
        error = {"error": {"message": "Rate limit reached for requests", "type": "requests",
                           "code": "rate_limit_exceeded"}}
        await stream.send(head(429, "Too Many Requests", {"Content-Type": "application/json",
                                                          "Retry-After": "30"})
                          + json.dumps(error).encode())

    async def _unavailable(self, stream: anyio.abc.SocketStream, behaviour: str) -> None:
        await stream.send(head(503, "Service Unavailable", {"Content-Type": "text/html",
                                                            "Retry-After": "120"})
                          + b"<html><body>model is loading</body></html>")

    async def _redirect(self, stream: anyio.abc.SocketStream, behaviour: str) -> None:
        await stream.send(head(307, "Temporary Redirect",
                               {"Location": f"http://127.0.0.1:{self.port}/elsewhere/v1"}))

    async def _gzip_bomb(self, stream: anyio.abc.SocketStream, behaviour: str) -> None:
        if self._bomb is None:
            self._bomb = gzip_bomb_body()
        await stream.send(head(200, "OK", {**SSE, "Content-Encoding": "gzip"}))
        try:
            await stream.send(self._bomb)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, ConnectionError):
            pass
        self.cut_off.append(behaviour)

    async def _gzip_ok(self, stream: anyio.abc.SocketStream, behaviour: str) -> None:
        body = chunk("zipped ") + chunk("reply") + chunk(finish="stop") + b"data: [DONE]\r\n\r\n"
        await stream.send(head(200, "OK", {**SSE, "Content-Encoding": "gzip"})
                          + gzip.compress(body.replace(b"\n", b"\r\n")))

    async def _gzip_members(self, stream: anyio.abc.SocketStream, behaviour: str) -> None:
        """Two gzip members, one body (RFC 1952 allows it): the second holds the end."""
        first, second = chunk("one "), chunk("two") + chunk(finish="stop") + b"data: [DONE]\n\n"
        await stream.send(head(200, "OK", {**SSE, "Content-Encoding": "gzip"})
                          + gzip.compress(first) + gzip.compress(second))

    async def _gzip_cut(self, stream: anyio.abc.SocketStream, behaviour: str) -> None:
        """A gzipped reply (a finish, no [DONE]) whose body ends before its gzip trailer
        (the CRC and length that say it arrived whole)."""
        body = gzip.compress(chunk("cut short ") + chunk(finish="stop"))
        await stream.send(head(200, "OK", {**SSE, "Content-Encoding": "gzip"}) + body[:-8])

    async def _gzip_trailing(self, stream: anyio.abc.SocketStream, behaviour: str) -> None:
        """A whole gzip member (no finish yet), then bytes that are no gzip member."""
        await stream.send(head(200, "OK", {**SSE, "Content-Encoding": "gzip"})
                          + gzip.compress(chunk("so far ")) + b"not gzip at all")

    async def _deflate_raw(self, stream: anyio.abc.SocketStream, behaviour: str) -> None:
        """``deflate`` as some servers send it: raw DEFLATE, no zlib header."""
        squeeze = zlib.compressobj(wbits=-zlib.MAX_WBITS)
        body = chunk("raw ") + chunk("deflate") + chunk(finish="stop") + b"data: [DONE]\n\n"
        await stream.send(head(200, "OK", {**SSE, "Content-Encoding": "deflate"})
                          + squeeze.compress(body) + squeeze.flush())

    async def _deflate_zlib(self, stream: anyio.abc.SocketStream, behaviour: str) -> None:
        body = chunk("zlib ") + chunk("deflate") + chunk(finish="stop") + b"data: [DONE]\n\n"
        await stream.send(head(200, "OK", {**SSE, "Content-Encoding": "deflate"})
                          + zlib.compress(body))

    async def _byte_order_mark(self, stream: anyio.abc.SocketStream, behaviour: str) -> None:
        """A stream that begins with a UTF-8 byte order mark (the SSE format allows one)."""
        await stream.send(head(200, "OK", SSE) + b"\xef\xbb\xbf" + chunk("marked")
                          + chunk(finish="stop") + b"data: [DONE]\n\n")

    async def _keepalive_after_finish(self, stream: anyio.abc.SocketStream,
                                      behaviour: str) -> None:
        """The reply finishes, then comments follow for ever: no [DONE], no end."""
        await stream.send(head(200, "OK", SSE) + chunk("done talking") + chunk(finish="stop")
                          + chunk(usage={"prompt_tokens": 2, "completion_tokens": 2,
                                         "total_tokens": 4}))
        await self._endless(stream, behaviour, b": keep-alive\n\n" * 1000)

    async def _deep_chunk(self, stream: anyio.abc.SocketStream, behaviour: str) -> None:
        await stream.send(head(200, "OK", SSE) + chunk("before ") + b'data: {"error": '
                          + b"[" * DEEP + b"]" * DEEP + b"}\n\n")

    async def _deep_error(self, stream: anyio.abc.SocketStream, behaviour: str) -> None:
        await stream.send(head(500, "Internal Server Error", {"Content-Type": "application/json"})
                          + b'{"error": ' + b"[" * DEEP + b"]" * DEEP + b"}")

    async def _deep_completion(self, stream: anyio.abc.SocketStream, behaviour: str) -> None:
        await stream.send(head(200, "OK", {"Content-Type": "application/json"})
                          + b'{"error": ' + b"[" * DEEP + b"]" * DEEP + b"}")

    async def _reasoning(self, stream: anyio.abc.SocketStream, behaviour: str) -> None:
        """A thinking model: its reasoning first (``reasoning_content`` as vLLM, DeepSeek
        and LM Studio send it, ``reasoning`` as Ollama and OpenRouter do), then the answer."""
        def delta(**fields: str) -> bytes:
            return b"data: " + json.dumps({"object": "chat.completion.chunk", "choices": [
                {"index": 0, "delta": fields, "finish_reason": None}]}).encode() + b"\n\n"
        await stream.send(head(200, "OK", SSE) + delta(role="assistant", content="")
                          + delta(reasoning_content="Let me think. ")
                          + delta(reasoning="Still thinking.") + chunk("the answer")
                          + chunk(finish="stop") + b"data: [DONE]\n\n")

    async def _split_emoji(self, stream: anyio.abc.SocketStream, behaviour: str) -> None:
        """An emoji in two chunks, a UTF-16 surrogate escape in each (a proxy cutting text
        by UTF-16 units, as JavaScript strings are), then a lone low surrogate."""
        def raw(content: bytes) -> bytes:
            return (b'data: {"choices": [{"index": 0, "delta": {"content": "' + content
                    + b'"}, "finish_reason": null}]}\n\n')
        await stream.send(head(200, "OK", SSE) + chunk("smile ") + raw(b"\\ud83d")
                          + raw(b"\\ude00 then ") + raw(b"lone \\udc00") + chunk(finish="stop")
                          + b"data: [DONE]\n\n")

    async def _surrogate_error(self, stream: anyio.abc.SocketStream, behaviour: str) -> None:
        await stream.send(head(200, "OK", SSE)
                          + b'data: {"error": {"message": "bad \\ud800 thing"}}\n\n')

    async def _null_usage(self, stream: anyio.abc.SocketStream, behaviour: str) -> None:
        """Usage counts given as null (some servers and models do)."""
        await stream.send(head(200, "OK", SSE) + chunk("counted") + chunk(finish="stop")
                          + b'data: {"choices": [], "usage": {"prompt_tokens": null, '
                            b'"completion_tokens": 2, "total_tokens": null}}\n\n'
                          + b"data: [DONE]\n\n")

    async def _other_usage(self, stream: anyio.abc.SocketStream, behaviour: str) -> None:
        """Usage named as mlx-vlm names it (``input_tokens``/``output_tokens``)."""
        await stream.send(head(200, "OK", SSE) + chunk("counted") + chunk(finish="stop")
                          + chunk(usage={"input_tokens": 11, "output_tokens": 5,
                                         "total_tokens": 16, "prompt_tps": 21.5})
                          + b"data: [DONE]\n\n")

    async def _null_choices(self, stream: anyio.abc.SocketStream, behaviour: str) -> None:
        """The usage chunk with ``choices: null`` (DeepSeek, Groq, OpenWebUI, Azure)."""
        await stream.send(head(200, "OK", SSE) + chunk("counted") + chunk(finish="stop")
                          + b'data: {"choices": null, "usage": {"prompt_tokens": 3, '
                            b'"completion_tokens": 1, "total_tokens": 4}}\n\n'
                          + b"data: [DONE]\n\n")

    async def _mislabelled(self, stream: anyio.abc.SocketStream, kind: str) -> None:
        await stream.send(head(200, "OK", {"Content-Type": kind}) + b"\n" + chunk("labelled ")
                          + chunk("wrong") + chunk(finish="stop") + b"data: [DONE]\n\n")

    async def _sse_as_text(self, stream: anyio.abc.SocketStream, behaviour: str) -> None:
        """An event stream labelled text/plain (as ramalama's RAG proxy sent it)."""
        await self._mislabelled(stream, "text/plain; charset=utf-8")

    async def _sse_as_json(self, stream: anyio.abc.SocketStream, behaviour: str) -> None:
        """An event stream labelled application/json (as vLLM-Ascend's proxy sent it)."""
        await self._mislabelled(stream, "application/json")

    async def _text_error(self, stream: anyio.abc.SocketStream, behaviour: str) -> None:
        await stream.send(head(200, "OK", {"Content-Type": "text/plain"})
                          + b"upstream says no")

    async def _brotli(self, stream: anyio.abc.SocketStream, behaviour: str) -> None:
        await stream.send(head(200, "OK", {**SSE, "Content-Encoding": "br"}) + b"\x0b\x02\x80")

    # -- /models ----------------------------------------------------------------------------
    async def _models(self, stream: anyio.abc.SocketStream) -> None:
        mode = self.models_mode
        self.seen.append("models:" + mode)
        json_head = head(200, "OK", {"Content-Type": "application/json"})
        if mode == "ok":
            await stream.send(json_head + json.dumps({"object": "list", "data": [
                {"id": "m-one", "object": "model"}, {"id": "m-two", "object": "model"}]}).encode())
        elif mode == "endless":
            await stream.send(json_head + b'{"data": [')
            await self._endless(stream, "models:endless", b'{"id": "m"},' * 4096)
        elif mode == "wrong_types":
            await stream.send(json_head + b'{"data": "all of them"}')
        elif mode == "mixed":
            await stream.send(json_head + json.dumps({"data": [
                {"id": 5}, {"id": "m-one"}, "m-str", {"id": "m-one"}, {"id": ""},
                {"id": "bad\nid"}, {"id": "x" * 300}, {"name": "no id"}, {"id": "m-two"}]}).encode())
        elif mode == "many":
            await stream.send(json_head + json.dumps({"data": [
                {"id": f"m-{n}"} for n in range(1500)]}).encode())
        elif mode == "html":
            await stream.send(head(200, "OK", {"Content-Type": "text/html"})
                              + b"<html><body>Welcome to the proxy</body></html>")
        elif mode == "stall":
            await self._stall(stream, "models:stall")
        elif mode == "deep":
            await stream.send(json_head + b'{"data": ' + b"[" * DEEP + b"]" * DEEP + b"}")
        elif mode == "missing":
            await stream.send(head(404, "Not Found", {"Content-Type": "application/json"})
                              + b'{"error": {"message": "no such route /v1/models"}}')


async def _read_request(stream: anyio.abc.SocketStream
                        ) -> tuple[str, str, dict[str, str], bytes] | None:
    """Method, path, headers (lower-case names) and body of one request
    (``Content-Length`` bodies only)."""
    data = b""
    while b"\r\n\r\n" not in data:
        if len(data) > 1024 * 1024:
            return None
        try:
            data += await stream.receive()
        except anyio.EndOfStream:
            return None
    header_block, _, body = data.partition(b"\r\n\r\n")
    lines = header_block.decode("latin-1").split("\r\n")
    method, path, _version = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        body += await stream.receive()
    return method, path, headers, body


@contextlib.asynccontextmanager
async def hostile_model_server(budget: int = 64 * 1024 * 1024) -> AsyncIterator[HostileModelServer]:
    """Serve a ``HostileModelServer`` on a loopback port for the block."""
    server = HostileModelServer(budget)
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    server.port = listener.extra(SocketAttribute.local_port)
    server.url = f"http://127.0.0.1:{server.port}/v1"
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, server.handle)
        try:
            yield server
        finally:
            tg.cancel_scope.cancel()


def refused_url() -> str:
    """A loopback URL nothing listens on (the port was bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
