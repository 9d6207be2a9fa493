"""Malformed lines from the editor get JSON-RPC 2.0's codes, the same the server's
``/acp`` gives the same input (``acp_server.acp_http.inbound``): -32700 for text that is
not JSON (also when the typed decoder stopped early at a value of the wrong type:
``[1,2``, ``12x``), -32600 for JSON that is not a message, with the id when it could be
read. Checked on ``wire.parse_editor`` (against the server's reader, row by row and on
mutated messages), on the in-process relay (nothing malformed reaches the server) and
through the real ``acp-server connect`` child (each answered, the next request served).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from acp_server.acp_http.inbound import BatchRefused, read_message
from acp_server.connect import wire
from bridge.jsonrpc import JsonRpcError, JsonRpcInvalidRequest
from tests.acp_http.server import running_acp_server
from tests.connect.fakes import FakeClock, FakeServer, editor_and_relay
from tests.connect.harness import spawn_adapter

INIT = {"protocolVersion": 1, "clientCapabilities": {}}
PARSE, INVALID = -32700, -32600
REQ = b'{"jsonrpc":"2.0","id":7,"method":"session/list"'

# (line, code, the id of the answer): every row differs from a message the relay serves
MALFORMED: list[tuple[bytes, int, Any]] = [
    # not JSON: cut short, garbage after a value, before the typed decoder could tell
    (b"[1,2", PARSE, None),
    (b"12x", PARSE, None),
    (b'"abc', PARSE, None),
    (b"[1,2,3", PARSE, None),
    (b'[{"jsonrpc":"2.0","id":1,"method":"x"}', PARSE, None),
    (b"tru", PARSE, None),
    (b'{"jsonrpc":2,', PARSE, None),
    (b'{"jsonrpc":2,"id":1', PARSE, None),
    (b'{"id":[', PARSE, None),
    (b'{"jsonrpc":"2.0","id":[1,2,"method":"x"}', PARSE, None),
    (b'{"jsonrpc":"2.0","id":7,"method":[1,2}', PARSE, None),
    (REQ + b',"params":{"a":[1,}}', PARSE, None),
    (REQ + b"}x", PARSE, None),
    (REQ + b'} {"a":1}', PARSE, None),
    (REQ + b",}", PARSE, None),
    (b"this is not json", PARSE, None),
    (b"NaN", PARSE, None),
    (b"{'a':1}", PARSE, None),
    (b"\xef\xbb\xbf{}", PARSE, None),   # a byte order mark
    # invalid UTF-8 anywhere, nested past the server's limits
    (REQ + b',"params":{"text":"\xff"}}', PARSE, None),
    (b'{"jsonrpc":"2.0","id":"\xff","method":"x"}', PARSE, None),
    (REQ + b',"zz":"\xc3"}', PARSE, None),
    (REQ + b',"params":{"a":' + b"[" * 127 + b"]" * 127 + b"}}", PARSE, None),  # 129 deep
    (REQ + b',"params":{"a":' + b"[" * 5000 + b"]" * 5000 + b"}}", PARSE, None),
    (REQ + b',"params":{"s":"' + b'\\"[{' * 300 + b'","a":' + b"[" * 127 + b"]" * 127 + b"}}",
     PARSE, None),
    (REQ + b',"params":[' + b"[]," * 200_000 + b"[]]}", PARSE, None),
    # JSON, not a message
    (b"[]", INVALID, None),
    (b"[1,2,3]", INVALID, None),                                       # a batch
    (b'[{"jsonrpc":"2.0","id":1,"method":"session/list"}]', INVALID, None),
    (b"12", INVALID, None),
    (b'"x"', INVALID, None),
    (b"true", INVALID, None),
    (b"null", INVALID, None),
    (b"{}", INVALID, None),
    (b'{"id":6,"method":"session/list"}', INVALID, 6),                  # no "jsonrpc"
    (b'{"jsonrpc":"1.0","id":7,"method":"x"}', INVALID, 7),
    (b'{"jsonrpc":2,"id":"s","method":"x"}', INVALID, "s"),
    (b'{"jsonrpc":"2.0","id":7,"method":12}', INVALID, 7),
    (b'{"jsonrpc":"2.0","id":1.5,"method":"x"}', INVALID, None),
    (b'{"jsonrpc":"2.0","id":true,"method":"x"}', INVALID, None),
    (b'{"jsonrpc":"2.0","id":{"a":1},"method":"x"}', INVALID, None),
    (b'{"jsonrpc":"2.0","id":null,"method":"session/list","params":{}}', INVALID, None),
    (b'{"jsonrpc":"2.0","id":null,"method":"initialize","params":{}}', INVALID, None),
    (REQ + b',"params":3}', INVALID, 7),
    (REQ + b',"params":"x"}', INVALID, 7),
    (REQ + b',"params":null}', INVALID, 7),
    (REQ + b',"result":3}', INVALID, 7),
    (REQ + b',"error":{"code":1,"message":"m"}}', INVALID, 7),
    (b'{"jsonrpc":"2.0","id":8}', INVALID, 8),                          # neither kind
    (b'{"jsonrpc":"2.0","id":8,"result":3,"error":{"code":1,"message":"m"}}', INVALID, 8),
    (b'{"jsonrpc":"2.0","id":8,"result":3,"params":{}}', INVALID, 8),
    (b'{"jsonrpc":"2.0","id":8,"error":5}', INVALID, 8),
    (b'{"jsonrpc":"2.0","id":8,"error":{"code":"x","message":"m"}}', INVALID, 8),
    (b'{"jsonrpc":"2.0","id":8,"error":{"code":1}}', INVALID, 8),
    (b'{"jsonrpc":"2.0","error":{"code":1,"message":"m"}}', INVALID, None),
]
IDS = [repr(line[:48]) for line, _, _ in MALFORMED]


def editor_answer(line: bytes) -> tuple[int, Any] | None:
    """What ``wire.parse_editor`` makes of ``line``: (code, id), ``None`` when it is a
    message."""
    try:
        wire.parse_editor(line)
    except wire.ParseError as exc:
        return exc.code, None
    except wire.InvalidRequest as exc:
        return exc.code, exc.id
    return None


def server_answer(line: bytes) -> tuple[int, Any] | None:
    """What the server's ``/acp`` makes of ``line`` (a batch is a -32600 frame)."""
    try:
        read_message(line)
    except BatchRefused:
        return INVALID, None
    except JsonRpcError as exc:
        return exc.code, exc.id if isinstance(exc, JsonRpcInvalidRequest) else None
    return None


@pytest.mark.parametrize(("line", "code", "rpc_id"), MALFORMED, ids=IDS)
def test_each_malformed_line_gets_its_code_and_id(line: bytes, code: int, rpc_id: Any) -> None:
    assert editor_answer(line) == (code, rpc_id)
    assert server_answer(line) == (code, rpc_id)   # the same as the server's


def test_what_is_a_message_stays_one() -> None:
    for line in (REQ + b"}", REQ + b',"params":[]}', REQ + b',"params":{"a":' + b"[" * 126   # 128 deep
                 + b"]" * 126 + b"}}", b'{"jsonrpc":"2.0","method":"session/cancel"}',
                 b'{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"m"}}',
                 b'{"jsonrpc":"2.0","id":"q","result":null}', REQ + b',"id":8}',
                 REQ + b',"params":{"text":"caf\xc3\xa9 \\" [[[ {{{"}}',
                 # an empty method is a string: relayed, the server answers -32601
                 b'{"jsonrpc":"2.0","id":9,"method":""}', b'{"jsonrpc":"2.0","method":""}',
                 # brackets in strings (escaped quotes too) do not count towards the depth
                 REQ + b',"params":{"s":"' + b'\\"[{' * 300 + b'\\\\","a":' + b"[" * 126
                 + b"]" * 126 + b"}}"):
        assert editor_answer(line) is None, line
        assert server_answer(line) is None, line


def test_parse_tells_a_parse_error_from_an_invalid_request_too() -> None:
    """``parse`` alone (the server's messages use it): the same classification."""
    for line, code in ((b"[1,2", PARSE), (b"12x", PARSE), (b"[" * 100_000, PARSE),
                       (b"[]", INVALID), (b"[1]", INVALID), (b"3", INVALID)):
        with pytest.raises((wire.ParseError, wire.InvalidRequest)) as caught:
            wire.parse(line)
        assert caught.value.code == code, line
    with pytest.raises(wire.InvalidRequest, match="batch"):
        wire.parse(b'[{"jsonrpc":"2.0","id":1,"method":"x"}]')


VALID = [b'{"jsonrpc":"2.0","id":7,"method":"session/prompt","params":{"sessionId":"s",'
         b'"prompt":[{"type":"text","text":"hi"}]}}',
         b'{"jsonrpc":"2.0","id":"a","result":{"outcome":{"outcome":"cancelled"}}}',
         b'{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"s"}}',
         b'{"jsonrpc":"2.0","id":3,"error":{"code":-32603,"message":"m","data":[1]}}']


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A valid message cut short, with bytes put in or replaced: JSON's structural
    characters mostly, so that many are still JSON and some still messages."""
    line = bytearray(draw(st.sampled_from(VALID)))
    alphabet = st.sampled_from(list(b'{}[]",:0123 ntfx\\\xff') + [ord("e")])
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(line)))
        how = draw(st.sampled_from(["cut", "insert", "replace"]))
        if how == "cut":
            del line[at:]
        elif how == "insert":
            line[at:at] = bytes([draw(alphabet)])
        elif at < len(line):
            line[at] = draw(alphabet)
    return bytes(line)


@settings(max_examples=600, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_the_codes_are_the_servers_on_mutated_messages(line: bytes) -> None:
    assert editor_answer(line) == server_answer(line), line


# -- the relay in process: answered, never relayed ----------------------------------------
@pytest.mark.anyio
async def test_the_relay_answers_each_and_relays_none() -> None:
    server = FakeServer()
    async with editor_and_relay(server, FakeClock()) as (editor, relay):
        await editor.request("initialize", INIT, "init")
        await editor.response("init")
        for n, (line, code, rpc_id) in enumerate(MALFORMED):
            before = len(editor.got)
            await editor.lines.send(line)
            await editor.request("session/list", {}, f"after-{n}")
            answer = await editor.response(f"after-{n}")
            assert answer["result"] == {"method": "session/list"}, line[:60]
            errors = editor.got[before:-1]
            assert len(errors) == 1, (line[:60], errors)
            assert errors[0]["error"]["code"] == code, (line[:60], errors[0])
            assert errors[0]["id"] == rpc_id, (line[:60], errors[0])
        relayed = [m.get("method") for m in server.received]
        assert relayed == ["session/list"] * len(MALFORMED)
        assert relay.link is not None


# -- through the real child process ---------------------------------------------------------
@pytest.mark.anyio
async def test_the_adapter_answers_each_with_the_servers_code_and_goes_on(
        tmp_path: Path) -> None:
    async with running_acp_server(tmp_path) as srv, \
            spawn_adapter(srv.base_url + "/acp") as adapter:
        init = await adapter.request("initialize", INIT)
        assert init["result"]["protocolVersion"] == 1
        for n, (line, code, rpc_id) in enumerate(MALFORMED):
            await adapter.send_raw(line + b"\n")
            answer = await adapter.receive()
            assert answer["error"]["code"] == code, (line[:60], answer)
            assert answer["id"] == rpc_id, (line[:60], answer)
            listed = await adapter.request("session/list", {}, rpc_id=f"after-{n}")
            assert listed["result"] == {"sessions": []}, (line[:60], listed)
        # an empty method is a request: relayed, and the server does not know it
        await adapter.send_raw(b'{"jsonrpc":"2.0","id":"empty","method":""}\n')
        answer = await adapter.receive()
        assert (answer["id"], answer["error"]["code"]) == ("empty", -32601), answer
        # nothing else came: one answer per line, then the request's
        assert len(adapter.received) == 2 + 2 * len(MALFORMED)
        assert adapter.process.returncode is None
        assert not [line for line in adapter.stderr if "Traceback" in line]

