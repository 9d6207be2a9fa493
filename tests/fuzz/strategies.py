"""Hypothesis strategies: JSON bodies (shaped like each door's and not), raw bytes,
deep nesting, hostile strings, headers, query strings and path ids."""

from __future__ import annotations

import base64
import json
import urllib.parse
from typing import Any

from hypothesis import strategies as st

HOSTILE_TEXT = st.sampled_from([
    "", " ", "\u0000", "/tmp\u0000x", "..", "../..", "/", "%2F", "a/b", "\ud7ff\ue000",
    "x" * 300, "-1", "1e400", "null", "/sleep 1ms", "/chunks 3 hi", "/permission p",
    "/fail", "/max_tokens", "/refuse", "/tool write ../escape", "/tool write a\u0000b"])
TEXT = st.one_of(st.text(max_size=30), HOSTILE_TEXT)
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
                    st.floats(allow_nan=False, allow_infinity=False), TEXT)
JSON = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)), max_leaves=12)


def _encoded(value: Any) -> bytes:
    return json.dumps(value).encode()


def deep(depth: int) -> bytes:
    return b'{"z":' + b"[" * depth + b"]" * depth + b"}"


def objects(keys: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """Objects with some of ``keys`` (their strategy or any JSON) and maybe extras."""
    optional = {k: st.one_of(v, JSON) for k, v in keys.items()}
    return st.fixed_dictionaries({}, optional=optional)


# Number tokens no float or machine integer holds (msgspec refuses some, accepts others
# as Python ints of hundreds of digits), and the non-JSON ones some encoders write.
HOSTILE_NUMBERS = ["1e999", "-1e999", "1" + "0" * 400, "-" + "9" * 4300, "1" + "0" * 4400,
                   "-0", "4.9e-325", "1E+308", "0.1e-999999", "NaN", "Infinity", "-Infinity"]
_HOLE = "\u0001number\u0001"


def _numbered(keys: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[bytes]:
    """A door-shaped body with one of its members (or a member's item) a hostile
    number token: ``{"model": "reference", "max_output_tokens": 1e999}``."""
    def place(body: dict[str, Any], key: str, nested: bool, token: str) -> bytes:
        body = {**body, key: [_HOLE] if nested else _HOLE}
        return _encoded(body).replace(json.dumps(_HOLE).encode(), token.encode())

    return st.builds(place, objects(keys), st.sampled_from(sorted(keys) or ["x"]),
                     st.booleans(), st.sampled_from(HOSTILE_NUMBERS))


def bodies(keys: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[bytes]:
    return st.one_of(
        objects(keys).map(_encoded),
        _numbered(keys),
        JSON.map(_encoded),
        st.binary(max_size=64),
        st.integers(min_value=100, max_value=4000).map(deep),
        st.sampled_from([b"", b"{", b"[]", b"{}", b'{"a":1}x', b"\xff\xfe", b"nul\x00l",
                         b'{"a":"\\ud800"}', b"1" * 400]),
    )


TEXT_BLOCK = st.fixed_dictionaries({"type": st.sampled_from(["text", "image", "x"]),
                                    "text": TEXT})
PROMPT = st.one_of(st.lists(TEXT_BLOCK, max_size=3), JSON)
REST_KEYS: dict[str, st.SearchStrategy[Any]] = {
    "cwd": TEXT, "sessionScope": st.sampled_from(["single", "thread", "x"]),
    "sessionId": st.one_of(st.uuids().map(str), TEXT), "agent": TEXT, "prompt": PROMPT,
    "deadlineMs": st.one_of(st.integers(), TEXT),
    "outcome": st.one_of(st.just({"outcome": "cancelled"}), st.fixed_dictionaries(
        {"outcome": st.just("selected"), "optionId": TEXT}), JSON)}
LMSP_REQUEST = objects({"model": st.sampled_from(["reference", "nope", ""]),
                        "input": st.one_of(TEXT, st.lists(JSON, max_size=2)),
                        "instructions": TEXT, "max_output_tokens": st.integers(),
                        "metadata": JSON, "stream": st.booleans()})
LMSP_KEYS: dict[str, st.SearchStrategy[Any]] = {
    "type": st.sampled_from(["response", "x"]), "input": LMSP_REQUEST,
    "on_restart": st.sampled_from(["fail", "retry", "resume", "x"]),
    "model": st.sampled_from(["reference", "nope"]), "stream": st.just(False)}
METHODS = st.sampled_from(["initialize", "authenticate", "session/new", "session/load",
                           "session/resume", "session/list", "session/prompt",
                           "session/cancel", "session/close", "session/set_mode",
                           "session/set_model", "session/permission", "nope/x", ""])


def rpc_messages(session_ids: list[str]) -> st.SearchStrategy[Any]:
    params = objects({"sessionId": st.sampled_from(session_ids) | TEXT, "cwd": TEXT,
                      "prompt": PROMPT, "protocolVersion": st.integers(),
                      "requestId": TEXT, "outcome": JSON, "modeId": TEXT})
    return objects({"jsonrpc": st.sampled_from(["2.0", "1.0"]),
                    "id": st.one_of(st.integers(), TEXT, st.none()),
                    "method": METHODS, "params": params, "result": JSON, "error": JSON})


HEADER_VALUE = st.one_of(st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7e),
                                 max_size=40), st.sampled_from(["0", "-1", "999999999999999999",
                                                                "application/json", "*/*"])
                        ).map(str.strip)   # what a client can send: no edge whitespace
HEADERS = st.dictionaries(st.sampled_from([
    "last-event-id", "x-qwen-event-epoch", "x-qwen-client-id", "idempotency-key",
    "accept", "x-other", "acp-session-id"]), HEADER_VALUE, max_size=3)
CONTENT_TYPE = st.sampled_from(["application/json", "application/json; charset=utf-8",
                                "text/plain", "", "application/problem+json"])
QUERY = st.dictionaries(st.sampled_from(["maxQueued", "starting_after", "deep", "x"]),
                        HEADER_VALUE, max_size=2)


BASE64URL = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _spliced(cursor: str, at: int, cut: int, text: str) -> str:
    at %= len(cursor) + 1
    return cursor[:at] + text + cursor[at + cut:]


def cursors(minted: str) -> st.SearchStrategy[str]:
    """``cursor`` values for the session listing: ``minted`` (a real one) as is and cut,
    spliced or extended, base64url of anything and of near-miss keys, hostile text."""
    keys = st.fixed_dictionaries({}, optional={
        "createdUs": st.one_of(st.integers(-1, 2**60), st.floats(), TEXT),
        "sessionHash": st.one_of(st.text("0123456789abcdefABC", max_size=40), JSON),
        "sessionId": TEXT, "activityTime": st.integers()})
    return st.one_of(
        st.just(minted), TEXT, HEADER_VALUE, st.text(BASE64URL, max_size=160),
        st.builds(_spliced, st.just(minted), st.integers(0, 200), st.integers(0, 3),
                  st.one_of(st.text(BASE64URL + "=+/ %é", max_size=3), TEXT)),
        JSON.map(lambda v: _b64(json.dumps(v).encode())),
        keys.map(lambda v: _b64(json.dumps(v).encode())),
        st.binary(max_size=120).map(_b64),
        st.sampled_from(["0", "20", "-1", "9" * 40, "\u00b2", "\u0661", minted + "="]))


def path_ids(real: list[str]) -> st.SearchStrategy[str]:
    quoted = st.one_of(st.sampled_from(real), st.uuids().map(str), TEXT,
                       st.just("task_" + "x" * 30)).map(
        lambda s: urllib.parse.quote(s, safe="") or "x")
    encoded = st.sampled_from(["a%2Fb", "%2F", "..", "%00", "%2e%2e", "%ZZ", "%"])
    return st.one_of(quoted, encoded)


# -- Host and head sizes (the front layer's guard) ----------------------------------------
LOOPBACK_NAMES = ["localhost", "127.0.0.1", "[::1]", "LocalHost", "127.1.2.3"]
HOST_NAMES = st.one_of(st.sampled_from([*LOOPBACK_NAMES, "evil.example", "localhost.evil",
                                        "127.0.0.1.nip.io", "[::1", "::1", "", "a b",
                                        "xn--e1afmkfd", "0x7f.1", "2130706433"]),
                       st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7e),
                               min_size=1, max_size=30).filter(lambda s: "/" not in s))


def hosts(port: int) -> st.SearchStrategy[str]:
    """``Host`` values: names, with our port, another port, a malformed one, or none."""
    ports = st.sampled_from(["", f":{port}", ":1", ":", ":99999999", f":{port}0", ":x"])
    return st.tuples(HOST_NAMES, ports).map("".join)


# (count, size) of extra header fields: around the caps of the fuzzed server
HEAD_SIZES = st.tuples(st.integers(min_value=0, max_value=140),
                       st.integers(min_value=1, max_value=2048))
