"""Hypothesis strategies: JSON bodies (shaped like each door's and not), raw bytes,
deep nesting, huge and wide bodies near the caps, duplicate keys, invalid UTF-8 and
lone surrogates, hostile strings, headers, query strings and path ids.

The names the suite drives (``HEADER_NAMES``, ``QUERY_KEYS``, ``ACP_METHODS`` and the
routes of ``test_rest`` / ``test_lmsp``) are checked against what the server serves
and reads by ``tests/fuzz/test_coverage.py``."""

from __future__ import annotations

import base64
import json
import urllib.parse
from typing import Any

from hypothesis import strategies as st

HOSTILE_TEXT = st.sampled_from([
    "", " ", "\u0000", "/tmp\u0000x", "..", "../..", "/", "%2F", "a/b", "\ud7ff\ue000",
    "x" * 300, "-1", "1e400", "null", "/sleep 1ms", "/chunks 3 hi", "/permission p",
    "/fail", "/max_tokens", "/refuse", "/tool write ../escape", "/tool write a\u0000b",
    "\ud800", "a\udfffb", "\ufeff", "\u202e", "\U0010ffff", "x" * 4097])
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


def _duplicated(keys: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[bytes]:
    """A door-shaped body with one member written twice, the second of another type:
    ``{"model": "reference", "input": "x", "input": [{}]}``."""
    def place(body: dict[str, Any], key: str, first: Any, second: Any) -> bytes:
        rest = _encoded({k: v for k, v in body.items() if k != key})[1:-1]
        twice = b"%s:%s,%s:%s" % (_encoded(key), _encoded(first), _encoded(key), _encoded(second))
        return b"{" + (rest + b"," if rest else b"") + twice + b"}"

    return st.builds(place, objects(keys), st.sampled_from(sorted(keys) or ["x"]), JSON, JSON)


# Raw bytes in a JSON string no decoder should take: invalid UTF-8 (a lone continuation
# byte, an overlong "/", a UTF-8-encoded surrogate, past U+10FFFF), control characters,
# escapes of lone and reversed surrogate halves, a truncated escape.
BAD_STRINGS = [b"\xff", b"\x80", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x00",
               b"\n", b"\\ud800", b"\\udc00\\ud800", b"\\u00", b"\\x41", b"\\uD83D\\uDE00"]


def _bad_string(keys: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[bytes]:
    """A door-shaped body with one member (or a member's item) a string of hostile
    raw bytes: ``{"model": "reference<0xff>"}``."""
    def place(body: dict[str, Any], key: str, nested: bool, raw: bytes) -> bytes:
        body = {**body, key: [_HOLE] if nested else _HOLE}
        return _encoded(body).replace(json.dumps(_HOLE).encode(), b'"x' + raw + b'"')

    return st.builds(place, objects(keys), st.sampled_from(sorted(keys) or ["x"]),
                     st.booleans(), st.sampled_from(BAD_STRINGS))


# Sizes around the caps a body meets: HTTP/2's whole-body read (64 KiB), the hot path's
# body (1 MiB), JSON containers (200 000) and depth (128).
HUGE_STRINGS = [64 * 1024 - 16, 64 * 1024 + 16, (1 << 20) - 64, (1 << 20) + 64]


def _huge(keys: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[bytes]:
    """Big bodies: a member a string near a size cap, arrays of ~200 000 containers
    (``MAX_JSON_CONTAINERS``) or of 100 000 numbers, an object of 50 000 keys."""
    def long_member(body: dict[str, Any], key: str, size: int) -> bytes:
        return _encoded({**body, key: "x" * size})

    def wide(body: dict[str, Any], key: str, count: int) -> bytes:
        return _encoded(body)[:-1] + (b"," if body else b"") + _encoded(key) + b":[" + \
            b",".join([b"{}"] * count) + b"]}"

    return st.one_of(
        st.builds(long_member, objects(keys), st.sampled_from(sorted(keys) or ["x"]),
                  st.sampled_from(HUGE_STRINGS)),
        st.builds(wide, objects(keys), st.sampled_from(sorted(keys) or ["x"]),
                  st.sampled_from([199_998, 200_001])),
        st.sampled_from([b"[" + b",".join([b"1"] * 100_000) + b"]",
                         b"{" + b",".join(b'"k%d":0' % i for i in range(50_000)) + b"}",
                         b"[" * 127 + b"]" * 127, b"[" * 129 + b"]" * 129,
                         b'{"a":' * 200 + b"1" + b"}" * 200]))


def bodies(keys: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[bytes]:
    """Bodies of every kind; a huge one about once in 30 (each costs tens of ms)."""
    huge = _huge(keys)
    return st.one_of(
        objects(keys).map(_encoded),
        _numbered(keys),
        _duplicated(keys),
        _bad_string(keys),
        st.integers(0, 2).flatmap(lambda n: huge if n == 0 else objects(keys).map(_encoded)),
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
        {"outcome": st.just("selected"), "optionId": TEXT}), JSON),
    "promptId": st.one_of(TEXT, st.just("p" * 128), st.just("p" * 129)),
    "_meta": objects({"acp-server/origin": TEXT}), "name": TEXT, "atRecordId": JSON,
    "scopes": st.lists(st.sampled_from(["read", "prompt", "admin", "x", ""]), max_size=3),
    "expires": st.one_of(TEXT, st.sampled_from(["30d", "0s", "-1h", "9" * 30 + "d"])),
    "rateClass": st.sampled_from(["default", "unlimited", "x"])}
MESSAGE = objects({"role": st.sampled_from(["user", "system", "x"]),
                   "type": st.sampled_from(["message", "x"]),
                   "content": st.one_of(TEXT, st.lists(objects({
                       "type": st.just("input_text"), "text": TEXT}), max_size=2))})
LMSP_REQUEST = objects({"model": st.sampled_from(["reference", "nope", ""]),
                        "input": st.one_of(TEXT, st.lists(JSON, max_size=2),
                                           st.lists(MESSAGE, max_size=2)),
                        "instructions": TEXT, "max_output_tokens": st.integers(),
                        "metadata": st.one_of(JSON, st.dictionaries(
                            TEXT, TEXT, min_size=15, max_size=18)),
                        "stream": st.booleans(), "background": st.booleans(),
                        "store": st.booleans(), "previous_response_id": TEXT})
LMSP_KEYS: dict[str, st.SearchStrategy[Any]] = {
    "type": st.sampled_from(["response", "x"]), "input": LMSP_REQUEST,
    "on_restart": st.sampled_from(["fail", "retry", "resume", "x"]),
    "model": st.sampled_from(["reference", "nope"]), "stream": st.just(False)}
# every method the /acp dispatcher handles (``test_coverage`` checks the list), one an
# agent may serve (passed through), and ones nobody serves
ACP_METHODS = ["initialize", "authenticate", "session/new", "session/load", "session/resume",
               "session/list", "session/prompt", "session/cancel", "session/close",
               "session/set_mode", "session/set_model", "session/set_config_option",
               "session/permission", "session/delete", "session/fork", "logout",
               "$/cancel_request", "_x/ext", "nope/x", "", "$/", "session/"]
METHODS = st.sampled_from(ACP_METHODS)
# an ACP content block, well formed or not
BLOCK = objects({"type": st.sampled_from(["text", "image", "audio", "resource",
                                          "resource_link", "x"]),
                 "text": TEXT, "data": TEXT, "mimeType": TEXT, "uri": TEXT,
                 "resource": objects({"uri": TEXT, "text": TEXT, "blob": TEXT})})
META = objects({"acp-server/resumable": st.one_of(st.booleans(), JSON),
                "acp-server": JSON, "promptId": st.one_of(TEXT, st.just("p" * 129))})


def rpc_messages(session_ids: list[str]) -> st.SearchStrategy[Any]:
    params = objects({"sessionId": st.sampled_from(session_ids) | TEXT, "cwd": TEXT,
                      "prompt": st.one_of(PROMPT, st.lists(BLOCK, max_size=3)),
                      "protocolVersion": st.one_of(st.integers(), st.floats()),
                      "requestId": st.one_of(TEXT, st.integers(), st.booleans()),
                      "outcome": JSON, "modeId": TEXT, "modelId": TEXT,
                      "configId": TEXT, "value": JSON, "cursor": TEXT,
                      "mcpServers": st.lists(JSON, max_size=2),
                      "additionalDirectories": st.lists(TEXT, max_size=2),
                      "clientCapabilities": objects({"fs": JSON, "terminal": JSON,
                                                     "elicitation": JSON}),
                      "methodId": TEXT, "_meta": META})
    return objects({"jsonrpc": st.sampled_from(["2.0", "1.0"]),
                    "id": st.one_of(st.integers(), TEXT, st.none(), st.floats(), JSON),
                    "method": METHODS, "params": params, "result": JSON, "error": JSON})


HEADER_VALUE = st.one_of(st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7e),
                                 max_size=40), st.sampled_from(["0", "-1", "999999999999999999",
                                                                "application/json", "*/*"])
                        ).map(str.strip)   # what a client can send: no edge whitespace
# values at and past the header values' own caps (a client id: 128 characters, an
# Idempotency-Key: 255), numbers past 64 bits, lists, quoted strings, forwarding chains
HEADER_VALUE_EDGES = st.sampled_from([
    "a" * 128, "a" * 129, "k" * 255, "k" * 256, '"' + "k" * 255 + '"', '""', '"', "1" * 40,
    "18446744073709551616", "-9223372036854775809", "1e999", "0x10", "1.5", "NaN", "a, b",
    "1, 2", "null", "https://evil.example", "http://localhost", "file://", "*",
    ", ".join(["10.0.0.1"] * 40), "Bearer", "Bearer x", "GET", "gzip", "br"])
# every request header the server reads (``test_coverage`` checks the list), and one it does not
HEADER_NAMES = [
    "last-event-id", "x-qwen-event-epoch", "x-qwen-client-id", "idempotency-key",
    "accept", "x-other", "acp-session-id", "acp-connection-id", "origin",
    "access-control-request-method", "authorization", "x-forwarded-for",
    "x-acp-forwarded-by", "x-acp-forwarded-for", "x-acp-forwarded-proof",
    "content-encoding", "sec-websocket-protocol"]
HEADERS = st.dictionaries(st.sampled_from(HEADER_NAMES),
                          st.one_of(HEADER_VALUE, HEADER_VALUE_EDGES), max_size=3)
CONTENT_TYPE = st.sampled_from(["application/json", "application/json; charset=utf-8",
                                "text/plain", "", "application/problem+json"])
# every query parameter a REST or LMSP route reads (``test_coverage`` checks the list)
QUERY_KEYS = ["maxQueued", "starting_after", "deep", "x", "detail", "all", "size", "cursor",
              "principal", "action", "since", "until", "after", "limit", "before", "order",
              "status", "stream", "include"]
QUERY_VALUES = st.one_of(HEADER_VALUE, HEADER_VALUE_EDGES, st.sampled_from([
    "\x00", "a\x00b", "é", "\u202e", "\U0001f600", "1" * 5000, "true", "TRUE", "full",
    "summary", "-0", "+1", " 1", "\u0661"]))
QUERY = st.dictionaries(st.sampled_from(QUERY_KEYS), QUERY_VALUES, max_size=3)
# query strings sent as they are: invalid UTF-8 and bad escapes, repeated keys, no value
RAW_QUERIES = st.sampled_from([
    "", "", "", "size=%FF", "cursor=%ED%A0%80", "detail=%00", "all=%C0%AF", "deep=1&deep=0",
    "limit=1e999", "%ZZ=1", "limit", "=x", "&&&", "stream=true&stream=false", "after=%",
    "starting_after=18446744073709551616", "maxQueued=%F0%9F%98%80", "principal=%FF%FE",
    "since=9999999999999999999999", "until=-1e308", "x=" + "y" * 6000])


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
        st.sampled_from(["0", "20", "-1", "9" * 40, "\u00b2", "\u0661", minted + "="])
    ).map(_encodable)


def _encodable(text: str) -> str:
    """``text`` with its lone surrogates as ``?``: a query parameter httpx can encode
    (``RAW_QUERIES`` sends invalid UTF-8 as it is)."""
    return text.encode("utf-8", "replace").decode() if any(
        "\ud800" <= c <= "\udfff" for c in text) else text


def path_ids(real: list[str]) -> st.SearchStrategy[str]:
    quoted = st.one_of(st.sampled_from(real), st.uuids().map(str), TEXT,
                       st.just("task_" + "x" * 30)).map(
        lambda s: urllib.parse.quote(s.encode("utf-8", "surrogatepass"), safe="") or "x")
    encoded = st.sampled_from(["a%2Fb", "%2F", "..", "%00", "%2e%2e", "%ZZ", "%", "%FF",
                               "%C0%AF", "%ED%A0%80", "%E2%80%AE", "%u002F", "%252F",
                               "x" * 3000, "." * 300, "~", "a;b", "a%3Fb", "a%23b"])
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
