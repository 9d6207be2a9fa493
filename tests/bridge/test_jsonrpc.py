"""The JSON-RPC 2.0 codec: envelope validation, raw pass-through, encoders."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge import jsonrpc
from bridge.jsonrpc import (
    UNSET,
    JsonRpcInvalidRequest,
    JsonRpcParseError,
    decode_message,
    decode_value,
    encode_error,
    encode_notification,
    encode_request,
    encode_result,
)


def test_standard_codes() -> None:
    assert (jsonrpc.PARSE_ERROR, jsonrpc.INVALID_REQUEST, jsonrpc.METHOD_NOT_FOUND) == (-32700, -32600, -32601)
    assert (jsonrpc.INVALID_PARAMS, jsonrpc.INTERNAL_ERROR) == (-32602, -32603)
    assert (jsonrpc.AUTH_REQUIRED, jsonrpc.RESOURCE_NOT_FOUND, jsonrpc.REQUEST_CANCELLED) == (-32000, -32002, -32800)


def test_request_keeps_params_raw_and_unknown_fields() -> None:
    line = b'{"jsonrpc":"2.0","id":7,"method":"session/new","params":{"cwd":"/w","x-vendor":{"a":[1,null]}}}'
    msg = decode_message(line)
    assert msg.is_request and not msg.is_notification and not msg.is_response
    assert msg.id == 7 and msg.method == "session/new"
    assert isinstance(msg.params, msgspec.Raw)
    assert bytes(msg.params) == b'{"cwd":"/w","x-vendor":{"a":[1,null]}}'
    assert decode_value(msg.params) == {"cwd": "/w", "x-vendor": {"a": [1, None]}}
    # Re-encoding the raw params writes the agent's exact bytes.
    assert encode_request(7, "session/new", msg.params) == line


def test_notification_has_unset_id_while_null_id_is_kept() -> None:
    note = decode_message(b'{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"s"}}')
    assert note.is_notification and note.id is UNSET
    err = decode_message(b'{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}')
    assert err.is_response and err.id is None
    assert err.error.code == -32700 and err.error.data is UNSET


def test_responses() -> None:
    ok = decode_message(b'{"jsonrpc":"2.0","id":"abc","result":{"stopReason":"end_turn","_meta":{"q":1}}}')
    assert ok.id == "abc" and ok.error is UNSET
    assert decode_value(ok.result) == {"stopReason": "end_turn", "_meta": {"q": 1}}
    null_result = decode_message(b'{"jsonrpc":"2.0","id":1,"result":null}')
    assert null_result.result is not UNSET and decode_value(null_result.result) is None
    failed = decode_message(
        b'{"jsonrpc":"2.0","id":2,"error":{"code":-32601,"message":"Method not found","data":{"method":"x"}}}'
    )
    assert failed.error.code == -32601 and failed.error.message == "Method not found"
    assert decode_value(failed.error.data) == {"method": "x"}


@pytest.mark.parametrize("data", [
    b"{bad", b"", b"   ", b'{"jsonrpc":"2.0"', "\x00",
    # cut short or followed by garbage after a member of the wrong type: the typed
    # decoder stops there, the whole text still says it is not JSON
    b"[1,2", b'[{"jsonrpc":"2.0"', b'{"jsonrpc":2,', b'{"jsonrpc":"2.0","id":[1', b"12x",
    b'"text" x', b'{"jsonrpc":"2.0","id":1,"method":"m","params":' + b"[" * 100_000,
    b'{"jsonrpc":"2.0","id":1,"method":"m","params":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
])
def test_parse_errors(data: bytes) -> None:
    with pytest.raises(JsonRpcParseError) as info:
        decode_message(data)
    assert info.value.code == -32700


@pytest.mark.parametrize(
    ("data", "expected_id"),
    [
        (b"[1,2]", None),
        (b'"text"', None),
        (b"42", None),
        (b'{"id":1,"method":"m"}', 1),  # no jsonrpc member
        (b'{"jsonrpc":"1.0","id":1,"method":"m"}', 1),
        (b'{"jsonrpc":"2.0","id":1.5,"method":"m"}', None),
        (b'{"jsonrpc":"2.0","id":1e999,"method":"m"}', None),  # JSON, out of range
        (b'{"jsonrpc":"2.0","id":true,"method":"m"}', None),
        (b'{"jsonrpc":"2.0","id":3,"method":5}', 3),
        (b'{"jsonrpc":"2.0","id":4,"method":"m","params":"scalar"}', 4),
        (b'{"jsonrpc":"2.0","id":5,"method":"m","result":{}}', 5),
        (b'{"jsonrpc":"2.0","id":6,"result":{},"error":{"code":1,"message":"x"}}', 6),
        (b'{"jsonrpc":"2.0","id":7}', 7),  # response with neither
        (b'{"jsonrpc":"2.0","result":{}}', None),  # response without id
        (b'{"jsonrpc":"2.0","id":8,"error":{"code":"x","message":"m"}}', 8),
        (b'{"jsonrpc":"2.0","id":9,"error":{"message":"m"}}', 9),
        (b'{"jsonrpc":"2.0","id":10,"result":1,"params":{}}', 10),
    ],
)
def test_invalid_requests(data: bytes, expected_id: object) -> None:
    with pytest.raises(JsonRpcInvalidRequest) as info:
        decode_message(data)
    assert info.value.code == -32600
    assert info.value.id == expected_id


def test_decode_accepts_str_and_memoryview() -> None:
    assert decode_message('{"jsonrpc":"2.0","method":"m"}').method == "m"
    assert decode_message(memoryview(b'{"jsonrpc":"2.0","id":0,"result":1}')).id == 0


def test_encoders_exact_bytes() -> None:
    assert encode_request(0, "initialize", {"protocolVersion": 1}) == (
        b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}'
    )
    assert encode_request("r", "m") == b'{"jsonrpc":"2.0","id":"r","method":"m"}'
    assert encode_notification("session/cancel", {"sessionId": "s"}) == (
        b'{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"s"}}'
    )
    assert encode_notification("ping") == b'{"jsonrpc":"2.0","method":"ping"}'
    assert encode_result(3, None) == b'{"jsonrpc":"2.0","id":3,"result":null}'
    assert encode_result(3, {}) == b'{"jsonrpc":"2.0","id":3,"result":{}}'
    assert encode_error(None, -32700, "Parse error") == (
        b'{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}'
    )
    assert encode_error(4, -32601, "Method not found", {"method": "x"}) == (
        b'{"jsonrpc":"2.0","id":4,"error":{"code":-32601,"message":"Method not found","data":{"method":"x"}}}'
    )
    for data in (encode_request(1, "m", {}), encode_result(1, []), encode_error(1, 1, "x")):
        assert not data.endswith(b"\n")


def test_result_raw_passes_through() -> None:
    raw = decode_message(b'{"jsonrpc":"2.0","id":1,"result":{"models":{"z":1},"sessionId":"s"}}').result
    assert encode_result("client-9", raw) == (
        b'{"jsonrpc":"2.0","id":"client-9","result":{"models":{"z":1},"sessionId":"s"}}'
    )


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=12,
)
ids = st.none() | st.integers(-(2**31), 2**31) | st.text(max_size=8)


# no deadline: a loaded machine that does not run this process for 200 ms (Hypothesis's
# default) in one example is no failure of the code (Hypothesis reports it Flaky)
@given(ident=ids, method=st.text(min_size=1), params=st.dictionaries(st.text(), json_values, max_size=4))
@settings(deadline=None)
def test_request_round_trip(ident: int | str | None, method: str, params: dict) -> None:
    msg = decode_message(encode_request(ident, method, params))
    assert (msg.id, msg.method, decode_value(msg.params)) == (ident, method, params)
    # Our bytes are also what the stdlib reads.
    assert json.loads(encode_request(ident, method, params))["params"] == params


@given(ident=ids, result=json_values, code=st.integers(-(2**31), 2**31), data=json_values)
@settings(deadline=None)
def test_response_round_trip(ident: int | str | None, result: object, code: int, data: object) -> None:
    ok = decode_message(encode_result(ident, result))
    assert ok.id == ident and decode_value(ok.result) == result
    failed = decode_message(encode_error(ident, code, "boom", data))
    assert failed.error.code == code and failed.error.message == "boom"
    assert (failed.error.data is UNSET) if data is None else decode_value(failed.error.data) == data
