"""The model agent against a misbehaving upstream (``hostile_model_server``: raw HTTP
on a loopback port): every fault ends the turn with an error naming the server and the
cause, or a documented stop; what the agent keeps is bounded by its caps; the next
prompt works. Small caps are given to the factory; the defaults are the modules'."""

from __future__ import annotations

import re

import anyio
import httpx
import pytest

from bridge import Bridge, BridgeOptions
from bridge.agents.model import MAX_MODELS, ModelAgentFactory, discover_models
from bridge.agents.upstream import (INFLATE_STEP, BoundedBody, SseParser, UpstreamError,
                                    error_detail)
from bridge.errors import AgentError, PromptDeadlineExceededError
from tests.bridge.helpers import drain, envelope, text, wait_until
from tests.bridge.hostile_model_server import hostile_model_server, refused_url

pytestmark = pytest.mark.anyio

KIB = 1024
CAP = 64 * KIB

FAULTS = [
    ("ENDLESS_LINE", r"sent an SSE line or event over 64 KiB"),
    ("ENDLESS_EVENT", r"sent an SSE line or event over 64 KiB"),
    ("GZIP_BOMB", r"sent an SSE line or event over 64 KiB"),
    ("KEEPALIVE_ONLY", r"sent more than 1 MiB in one reply"),
    ("ENDLESS_ERROR", r"answered 500: upstream trouble: z+$"),
    ("STREAM_ERROR", r"reported an error: The upstream model crashed "
                     r"\(type server_error, code model_crashed\)"),
    ("ERROR_EVENT", r"reported an error: context window exceeded \(code 400\)"),
    ("JSON_ERROR", r"reported an error: Invalid API key \(type invalid_request_error\)"),
    ("HTML", r"answered 200 with Content-Type 'text/html', not an event stream: "
             r"<html><body><h1>Sign in to the proxy"),
    ("TEXT_ERROR", r"answered 200 with Content-Type 'text/plain', not an event stream: "
                   r"upstream says no$"),
    ("BAD_JSON", r"sent a chunk that is not a chat.completion.chunk \(JSON is malformed"),
    ("WRONG_TYPE", r"sent a chunk that is not a chat.completion.chunk \(Expected `str \| null`, "
                   r"got `int`"),
    ("RESET", r"broke off the reply \((ReadError|RemoteProtocolError)"),
    ("TRUNCATED", r"ended the stream before the reply finished \(no finish_reason, no \[DONE\]\)"),
    ("RATE_LIMITED", r"answered 429 \(Retry-After: 30\): Rate limit reached for requests "
                     r"\(type requests, code rate_limit_exceeded\)"),
    ("UNAVAILABLE", r"answered 503 \(Retry-After: 120\): <html><body>model is loading"),
    ("REDIRECT", r"answered 307, a redirect to 'http://127.0.0.1:\d+/elsewhere/v1' \(not "
                 r"followed"),
    ("BROTLI", r"sent Content-Encoding 'br', which the model agent does not decode"),
    ("GZIP_CUT", r"sent a gzip body cut off before its end"),
    ("GZIP_TRAILING", r"sent bytes after the end of its gzip body"),
    # JSON nested past the decoder's depth (a RecursionError, not a DecodeError)
    ("DEEP_CHUNK", r"sent a chunk that is not a chat.completion.chunk \(JSON nested too "
                   r"deeply\): '\{\"error\": \[\[\["),
    ("DEEP_ERROR", r"answered 500: \{\"error\": \[\[\["),
    ("DEEP_COMPLETION", r"answered 200 with JSON that is neither a stream nor a completion: "
                        r"\{\"error\": \[\[\["),
]
ENDLESS = {"ENDLESS_LINE", "ENDLESS_EVENT", "KEEPALIVE_ONLY", "ENDLESS_ERROR", "GZIP_BOMB"}


def small_caps(url: str, **options: float) -> ModelAgentFactory:
    return ModelAgentFactory(url, model="m-one", max_event_bytes=CAP, max_reply_bytes=CAP,
                             max_stream_bytes=1024 * KIB, **options)  # type: ignore[arg-type]


@pytest.mark.parametrize(("behaviour", "cause"), FAULTS, ids=[b for b, _ in FAULTS])
async def test_a_fault_ends_the_turn_with_its_cause_and_the_next_turn_works(
        tmp_path, behaviour: str, cause: str) -> None:
    async with hostile_model_server() as upstream:
        async with Bridge(small_caps(upstream.url), workspace_cwd=str(tmp_path)) as bridge:
            sid = (await bridge.create_session()).session_id
            with pytest.raises(AgentError) as caught:
                await bridge.send_prompt(sid, text(f"{behaviour} please"))
            message = caught.value.message
            assert message.startswith(f"Model server {upstream.url} "), message
            assert re.search(cause, message), message
            assert len(message) < 800   # an endless error body is cut, not kept
            if behaviour in ENDLESS:    # the agent closed the connection; it did not read on
                await wait_until(lambda: upstream.cut_off == [behaviour])
            assert upstream.exhausted == []
            assert upstream.seen == [behaviour]   # once: no retry
            result = await bridge.send_prompt(sid, text("fine now"))
            assert result.stop_reason == "end_turn"
            sent = upstream.requests[-1]["messages"][-1]["content"]   # joined when no reply
            assert sent in ("fine now", f"{behaviour} please\n\nfine now"), sent


async def test_an_endless_reply_ends_max_tokens_and_keeps_at_most_the_cap(tmp_path) -> None:
    async with hostile_model_server() as upstream:
        async with Bridge(small_caps(upstream.url), workspace_cwd=str(tmp_path)) as bridge:
            sid = (await bridge.create_session()).session_id
            sub = bridge.subscribe(sid)
            result = await bridge.send_prompt(sid, text("ENDLESS_REPLY please"))
            assert result.stop_reason == "max_tokens"
            await wait_until(lambda: upstream.cut_off == ["ENDLESS_REPLY"])
            shown = "".join(u["content"]["text"] for u in _updates(sub)
                            if u["sessionUpdate"] == "agent_message_chunk")
            assert 0 < len(shown.encode()) <= CAP
            await bridge.send_prompt(sid, text("next"))
            kept = upstream.requests[-1]["messages"]
            assert [m["role"] for m in kept] == ["user", "assistant", "user"]
            assert kept[1]["content"] == shown   # the history holds what was shown, no more


async def test_the_history_is_bounded_in_characters_newest_kept(tmp_path) -> None:
    async with hostile_model_server() as upstream:
        factory = ModelAgentFactory(upstream.url, model="m-one", max_history_chars=100)
        async with Bridge(factory, workspace_cwd=str(tmp_path)) as bridge:
            sid = (await bridge.create_session()).session_id
            await bridge.send_prompt(sid, text("a" * 60))
            await bridge.send_prompt(sid, text("b" * 60))
            assert upstream.requests[-1]["messages"] == [{"role": "user", "content": "b" * 60}]
            await bridge.send_prompt(sid, text("c" * 500))   # alone over the cap: still sent
            assert upstream.requests[-1]["messages"] == [{"role": "user", "content": "c" * 500}]
            await bridge.send_prompt(sid, text("d"))   # the 206-character reply went first
            assert upstream.requests[-1]["messages"] == [{"role": "user", "content": "d"}]
            await bridge.send_prompt(sid, text("e"))
            assert [m["content"] for m in upstream.requests[-1]["messages"]] == [
                "d", "pong: d", "e"]


async def test_text_before_a_fault_stays_in_the_history(tmp_path) -> None:
    async with hostile_model_server() as upstream:
        async with Bridge(small_caps(upstream.url), workspace_cwd=str(tmp_path)) as bridge:
            sid = (await bridge.create_session()).session_id
            with pytest.raises(AgentError, match="reported an error"):
                await bridge.send_prompt(sid, text("STREAM_ERROR"))
            await bridge.send_prompt(sid, text("and then"))
            assert [(m["role"], m["content"]) for m in upstream.requests[-1]["messages"]] == [
                ("user", "STREAM_ERROR"), ("assistant", "partial "), ("user", "and then")]


async def test_a_whole_json_completion_and_a_gzipped_crlf_stream_are_understood(tmp_path) -> None:
    async with hostile_model_server() as upstream:
        async with Bridge(small_caps(upstream.url), workspace_cwd=str(tmp_path)) as bridge:
            sid = (await bridge.create_session()).session_id
            sub = bridge.subscribe(sid)
            whole = await bridge.send_prompt(sid, text("WHOLE please"))
            assert whole.stop_reason == "end_turn"
            assert whole.response["usage"] == {"inputTokens": 4, "outputTokens": 3,
                                               "totalTokens": 7}
            zipped = await bridge.send_prompt(sid, text("GZIP_OK please"))
            assert zipped.stop_reason == "end_turn"
            shown = [u["content"]["text"] for u in _updates(sub)
                     if u["sessionUpdate"] == "agent_message_chunk"]
            assert shown == ["a whole answer", "zipped ", "reply"]
    assert upstream.requests[0]["stream"] is True


@pytest.mark.parametrize(("behaviour", "shown"), [
    ("GZIP_MEMBERS", ["one ", "two"]),            # gzip members one after another
    ("DEFLATE_RAW", ["raw ", "deflate"]),         # deflate without its zlib header
    ("DEFLATE_ZLIB", ["zlib ", "deflate"]),
    ("BYTE_ORDER_MARK", ["marked"]),              # a BOM before the first line
    ("SSE_AS_TEXT", ["labelled ", "wrong"]),      # an event stream labelled text/plain
    ("SSE_AS_JSON", ["labelled ", "wrong"]),      # ... or application/json
])
async def test_each_valid_encoding_of_a_stream_is_understood(tmp_path, behaviour: str,
                                                             shown: list[str]) -> None:
    async with hostile_model_server() as upstream:
        async with Bridge(small_caps(upstream.url), workspace_cwd=str(tmp_path)) as bridge:
            sid = (await bridge.create_session()).session_id
            sub = bridge.subscribe(sid)
            result = await bridge.send_prompt(sid, text(f"{behaviour} please"))
            assert result.stop_reason == "end_turn"
            assert [u["content"]["text"] for u in _updates(sub)
                    if u["sessionUpdate"] == "agent_message_chunk"] == shown


async def test_comments_after_the_finish_do_not_hold_the_turn_open(tmp_path) -> None:
    """The grace after a finish_reason is a deadline, not a silence: a server that
    sends keep-alives for ever after finishing does not keep the turn (or read on)."""
    async with hostile_model_server() as upstream:
        factory = ModelAgentFactory(upstream.url, model="m-one", finish_grace_s=0.2)
        async with Bridge(factory, workspace_cwd=str(tmp_path)) as bridge:
            sid = (await bridge.create_session()).session_id
            result = await bridge.send_prompt(sid, text("KEEPALIVE_AFTER_FINISH please"))
            assert result.stop_reason == "end_turn"
            assert result.response["usage"]["totalTokens"] == 4
            await wait_until(lambda: upstream.cut_off == ["KEEPALIVE_AFTER_FINISH"])
            assert upstream.exhausted == []


async def test_a_finish_without_done_ends_the_turn_after_the_grace(tmp_path) -> None:
    async with hostile_model_server() as upstream:
        factory = small_caps(upstream.url, finish_grace_s=0.2)
        async with Bridge(factory, workspace_cwd=str(tmp_path)) as bridge:
            sid = (await bridge.create_session()).session_id
            result = await bridge.send_prompt(sid, text("NO_DONE please"))
            assert result.stop_reason == "end_turn"
            assert result.response["usage"]["totalTokens"] == 3
            await wait_until(lambda: upstream.cut_off == ["NO_DONE"])


@pytest.mark.parametrize("behaviour", ["STALL_HEADERS", "STALL_CHUNKS"])
async def test_cancel_ends_a_stalled_turn_at_once(tmp_path, behaviour: str) -> None:
    async with hostile_model_server() as upstream:
        async with Bridge(small_caps(upstream.url), workspace_cwd=str(tmp_path)) as bridge:
            sid = (await bridge.create_session()).session_id
            ticket = bridge.send_prompt(sid, text(behaviour))
            await wait_until(lambda: upstream.stalled == [behaviour])
            await bridge.cancel_session(sid)
            with anyio.fail_after(5):   # a bound against a hang, not a timing assertion
                assert (await ticket).stop_reason == "cancelled"
            await wait_until(lambda: upstream.cut_off == [behaviour])
            await bridge.send_prompt(sid, text("after"))
            history = [m["content"] for m in upstream.requests[-1]["messages"]]
            assert history == ([f"{behaviour}\n\nafter"] if behaviour == "STALL_HEADERS"
                               else [behaviour, "first ", "after"])


async def test_silence_past_the_read_timeout_is_a_clear_error(tmp_path) -> None:
    async with hostile_model_server() as upstream:
        factory = small_caps(upstream.url, timeout_s=0.3)
        async with Bridge(factory, workspace_cwd=str(tmp_path)) as bridge:
            sid = (await bridge.create_session()).session_id
            for behaviour in ("STALL_HEADERS", "STALL_CHUNKS"):
                with pytest.raises(AgentError, match=r"sent nothing for 0.3 s \(the read timeout\)"):
                    await bridge.send_prompt(sid, text(behaviour))
            await wait_until(lambda: upstream.cut_off == ["STALL_HEADERS", "STALL_CHUNKS"])


# -- /models -------------------------------------------------------------------------------

async def test_discover_models_keeps_usable_ids_once() -> None:
    async with hostile_model_server() as upstream:
        assert await discover_models(upstream.url) == ["m-one", "m-two"]
        upstream.models_mode = "mixed"
        assert await discover_models(upstream.url) == ["m-one", "m-two"]
        upstream.models_mode = "many"
        many = await discover_models(upstream.url)
        assert len(many) == MAX_MODELS and many[-1] == f"m-{MAX_MODELS - 1}"


@pytest.mark.parametrize(("mode", "cause"), [
    ("wrong_types", r"listed its models at /models in an unknown shape \(Expected `array`"),
    ("html", r"answered /models with text/html, not JSON: '<html><body>Welcome to the proxy"),
    ("endless", r"sent more than 64 KiB in one reply"),
    ("stall", r"did not list its models at /models within 0.3 s"),
    ("missing", r"answered 404 at /models: no such route /v1/models"),
    ("deep", r"listed its models at /models in an unknown shape \(JSON nested too deeply"),
])
async def test_discover_models_names_what_is_wrong(mode: str, cause: str) -> None:
    async with hostile_model_server() as upstream:
        upstream.models_mode = mode
        # only the stall waits for the timeout; the others must not race it on a
        # loaded machine (a 0.3 s bound on every answer failed under CI's load)
        timeout_s = 0.3 if mode == "stall" else 30
        with pytest.raises(UpstreamError, match=cause):
            await discover_models(upstream.url, timeout_s=timeout_s, max_bytes=CAP)
        if mode == "endless":
            await wait_until(lambda: upstream.cut_off == ["models:endless"])
        elif mode == "stall":   # the client hung up on whatever reached the server (the
            # server runs in this process: on a loaded machine 0.3 s may pass before the
            # request is even written, and then nothing did)
            await wait_until(lambda: upstream.cut_off == upstream.stalled)
        assert upstream.exhausted == []


async def test_discover_models_hints_at_v1_on_a_404() -> None:
    async with hostile_model_server() as upstream:
        upstream.models_mode = "missing"
        with pytest.raises(UpstreamError, match=r"usually ends in /v1\)$"):
            await discover_models(upstream.url.removesuffix("/v1"))


async def test_discover_models_names_an_unreachable_server() -> None:
    with pytest.raises(UpstreamError, match=r"cannot be reached \(ConnectError"):
        await discover_models(refused_url())


# -- the readers themselves ----------------------------------------------------------------

async def test_a_gzip_bomb_is_read_no_further_than_the_cap() -> None:
    async with hostile_model_server() as upstream, httpx.AsyncClient() as client:
        async with client.stream("POST", upstream.url + "/chat/completions", json={
                "messages": [{"role": "user", "content": "GZIP_BOMB"}]}) as response:
            body = BoundedBody(response, limit=CAP)
            with pytest.raises(UpstreamError, match="more than 64 KiB"):
                while await body.read():
                    assert body.total <= CAP
            assert body.total <= CAP + INFLATE_STEP   # the step that passed it, no more


async def test_an_error_body_is_read_only_as_far_as_kept() -> None:
    async with hostile_model_server() as upstream, httpx.AsyncClient() as client:
        async with client.stream("POST", upstream.url + "/chat/completions", json={
                "messages": [{"role": "user", "content": "ENDLESS_ERROR"}]}) as response:
            detail = await error_detail(response, limit=100)
            assert detail == "upstream trouble: " + "z" * 82
        await wait_until(lambda: upstream.cut_off == ["ENDLESS_ERROR"])


class _Pieces:
    """What ``BoundedBody`` reads of a response (its headers, its raw body), in pieces
    of ``size`` bytes: how the network may cut it."""

    def __init__(self, coding: str, body: bytes, size: int) -> None:
        self.headers = {"content-encoding": coding}
        self._pieces = [body[i:i + size] for i in range(0, len(body), size)]

    async def aiter_raw(self):  # type: ignore[no-untyped-def]
        for piece in self._pieces:
            yield piece


@pytest.mark.parametrize("size", [1, 2, 7, 1 << 20])
async def test_compressed_bodies_inflate_whole_however_cut(size: int) -> None:
    import gzip
    import zlib
    plain = bytes(range(256)) * 600   # more than INFLATE_STEP decoded
    raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    for coding, body in (("gzip", gzip.compress(plain[:1000]) + gzip.compress(plain[1000:])),
                         ("deflate", raw.compress(plain) + raw.flush()),
                         ("deflate", zlib.compress(plain)), ("gzip", b"")):
        reader = BoundedBody(_Pieces(coding, body, size), limit=len(plain))  # type: ignore[arg-type]
        decoded = bytearray()
        while chunk := await reader.read():
            assert len(chunk) <= INFLATE_STEP
            decoded += chunk
        assert decoded == (plain if body else b""), (coding, size)
    with pytest.raises(UpstreamError, match="cut off before its end"):
        reader = BoundedBody(_Pieces("deflate", zlib.compress(plain)[:-4], size),  # type: ignore[arg-type]
                             limit=len(plain))
        while await reader.read():
            pass


async def test_each_inflate_step_lets_the_other_tasks_run() -> None:
    """A small compressed body that expands to many steps is read a step at a time with
    a checkpoint between steps: it holds neither the event loop (every session, every
    request of the server) nor a cancel until all of it is parsed. Without, 256 MiB of
    gzipped keep-alive lines (~256 KiB sent) kept the loop for about half a minute."""
    import gzip
    plain = b": keep-alive\n\n" * (40 * INFLATE_STEP // 14)   # 40 steps, in one raw piece
    reader = BoundedBody(_Pieces("gzip", gzip.compress(plain), 1 << 20),  # type: ignore[arg-type]
                         limit=len(plain))
    ticks = steps = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await anyio.sleep(0)

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        while await reader.read():
            steps += 1
        tg.cancel_scope.cancel()
    assert steps >= 40
    assert ticks >= steps - 1   # the other task ran between (nearly) every two steps


def test_the_sse_parser_splits_lines_on_any_ending_and_any_chunking() -> None:
    stream = (b": comment\r\nevent: error\rdata: a\r\ndata:  b\n\r\n"
              b"id: 7\nretry: 10\n\n"            # no data: no event
              b"data: {\"x\": 1}\r\n\r\n" b"data: tail")   # an unended event is dropped
    expected = [("error", "a\n b"), ("message", '{"x": 1}')]
    for size in (1, 2, 3, 5, len(stream)):
        parser = SseParser(max_event_bytes=100)
        events = []
        for start in range(0, len(stream), size):
            events += parser.feed(stream[start:start + size])
        assert events == expected, size


def test_the_sse_parser_drops_a_leading_byte_order_mark_however_split() -> None:
    stream = b"\xef\xbb\xbfdata: a\n\n\xef\xbb\xbfdata: b\n\n"   # only the first is one
    for size in (1, 2, 3, 4, len(stream)):
        parser = SseParser(max_event_bytes=100)
        events = []
        for start in range(0, len(stream), size):
            events += parser.feed(stream[start:start + size])
        assert events == [("message", "a")], size   # "\ufeffdata" is no field: ignored
    assert SseParser().feed(b"\xef\xbbdata: x\n\n") == []   # half a mark is no mark
    assert SseParser().feed(b"\xef") == [] and SseParser().feed(b"data: y\n\n") == [
        ("message", "y")]


def test_the_sse_parser_counts_an_events_data_in_bytes() -> None:
    parser = SseParser(max_event_bytes=1000)
    line = b"data: " + "\u00e9".encode() * 100 + b"\n"   # 100 characters, 200 bytes
    with pytest.raises(UpstreamError, match=r"over 1000 bytes"):
        for _ in range(6):
            parser.feed(line)
            assert parser.kept <= 1000


def test_the_sse_parser_keeps_no_more_than_its_cap() -> None:
    for first, block in ((b"data: ", b"x" * 1000), (b"", b"data: " + b"y" * 100 + b"\n")):
        parser = SseParser(max_event_bytes=10 * KIB)
        parser.feed(first)
        with pytest.raises(UpstreamError, match=r"over 10 KiB"):
            for _ in range(1000):
                parser.feed(block)
                assert parser.kept <= 10 * KIB


def _updates(sub) -> list[dict]:  # type: ignore[no-untyped-def]
    return [envelope(f).data["update"] for f in drain(sub) if f.type == "session_update"]


async def test_the_prompt_deadline_ends_a_trickling_turn_and_closes_the_upstream(
        tmp_path) -> None:
    """The read timeout is between bytes: a server that keeps sending a little never
    meets it. ``--prompt-deadline-ms`` bounds the turn, and the connection is closed.
    On a loaded machine the 300 ms may pass before the request is written (the server
    then never sees it, and has nothing to see closed): the prompt is sent again until
    one reached the server, and every one that did was hung up on."""
    async with hostile_model_server() as upstream:
        async with Bridge(small_caps(upstream.url), workspace_cwd=str(tmp_path),
                          options=BridgeOptions(prompt_deadline_ms=300)) as bridge:
            sid = (await bridge.create_session()).session_id
            with anyio.fail_after(120):   # a hang bound
                while not upstream.stalled:
                    with pytest.raises(PromptDeadlineExceededError):
                        await bridge.send_prompt(sid, text("STALL_CHUNKS"))
                    await wait_until(lambda: upstream.cut_off == upstream.stalled)
            assert set(upstream.cut_off) == {"STALL_CHUNKS"}
            await wait_until(lambda: upstream.cut_off == upstream.stalled)
