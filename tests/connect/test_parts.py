"""The adapter's parts on their own: backoff, the capped line reader, the JSON-RPC
codec that keeps bytes, and the bookkeeping that decides what is a duplicate."""

from __future__ import annotations

import json

import msgspec
import pytest

from acp_server.connect import wire
from acp_server.connect.relay import Backoff
from acp_server.connect.state import Asked, Book
from acp_server.connect.stdio import LineReader, TooLong


def test_backoff_doubles_up_to_the_cap_with_jitter_in_the_upper_half() -> None:
    backoff = Backoff(first_s=0.5, cap_s=30.0)
    assert [backoff.delay(n, rng=lambda: 1.0) for n in range(8)] == \
        [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert [backoff.delay(n, rng=lambda: 0.0) for n in range(3)] == [0.25, 0.5, 1.0]
    assert backoff.delay(10_000, rng=lambda: 0.5) == 22.5   # no overflow, still capped


@pytest.mark.anyio
async def test_the_line_reader_is_bounded() -> None:
    chunks = [b'{"a":1}\n{"b"', b":2}\r\n\n", b"x" * 10, b"y" * 10, b"\nlast"]

    async def read() -> bytes:
        return chunks.pop(0) if chunks else b""

    got = [item async for item in LineReader(read, max_bytes=12)]
    assert got[:2] == [b'{"a":1}', b'{"b":2}']
    assert isinstance(got[2], TooLong) and got[2].size == 20
    assert got[3] == b"last"


def test_parse_keeps_what_it_does_not_read() -> None:
    line = b'{"jsonrpc":"2.0","id":7,"method":"x/y","params":{"a":1.0,"b":[1e400]},"zz":1}'
    msg = wire.parse(line)
    assert (msg.kind, msg.id, msg.method) == ("request", 7, "x/y")
    rewritten = json.loads(wire.with_id(msg.members, 99))
    assert rewritten["id"] == 99 and rewritten["zz"] == 1
    assert b'"params":{"a":1.0,"b":[1e400]}' in wire.with_id(msg.members, 99)
    assert wire.parse(b'{"jsonrpc":"2.0","method":"n"}').kind == "notification"
    assert wire.parse(b'{"jsonrpc":"2.0","id":"r","result":null}').kind == "response"
    for bad, error in ((b"nope", wire.ParseError), (b"[]", wire.InvalidRequest),
                       (b'{"jsonrpc":"2.0","id":true,"method":"m"}', wire.InvalidRequest),
                       (b'{"jsonrpc":"2.0","id":1,"result":1,"error":{}}', wire.InvalidRequest)):
        with pytest.raises(error):
            wire.parse(bad)


def test_event_markers_come_off_and_meta_goes_on() -> None:
    members = wire.parse(json.dumps({"jsonrpc": "2.0", "method": "session/update", "params": {
        "sessionId": "s", "update": {}, "_meta": {"acp-server/event": {
            "sessionId": "s", "id": 3, "epoch": "e"}}}}).encode()).members
    assert wire.event_meta(members) == {"sessionId": "s", "id": 3, "epoch": "e"}
    assert json.loads(wire.without_event_meta(members))["params"] == {"sessionId": "s",
                                                                      "update": {}}
    kept = wire.set_meta({"params": msgspec.Raw(b'{"_meta":{"x":1}}')}, "k", 2)
    assert json.loads(bytes(kept["params"])) == {"_meta": {"x": 1, "k": 2}}
    mine = wire.set_meta({"params": msgspec.Raw(b'{"_meta":{"k":"editor"}}')}, "k", 2,
                         replace=False)
    assert json.loads(bytes(mine["params"])) == {"_meta": {"k": "editor"}}


def test_duplicates_and_the_resume_cursor() -> None:
    book = Book()
    session = book.session("s")
    assert session.seen(1, "e") and session.seen(2, "e")
    assert not session.seen(2, "e") and not session.seen(1, "e")
    assert session.seen(1, "e2")          # a new epoch: adopted
    assert book.cursor("s") == (1, "e2")
    session.seen(9, "e2")
    book.asked[("str", "q")] = Asked("s", 5, "session/request_permission")
    assert book.cursor("s") == (4, "e2")  # before the unanswered question
    book.remember_answered("q")
    assert book.was_answered("q") and not book.was_answered(1)


def test_a_replay_the_editor_asked_for_is_no_duplicate() -> None:
    book = Book()
    session = book.session("s")
    assert [session.seen(n, "e") for n in (1, 2, 3)] == [True] * 3
    session.replay()                       # the editor's own session/load
    assert [session.seen(n, "e") for n in (1, 1, 2, 3)] == [True, False, True, True]
    assert session.replayed_id is None     # caught up: the usual rule again
    assert [session.seen(n, "e") for n in (3, 4, 4)] == [False, True, False]
    session.replay()
    assert session.seen(1, "other") and session.replayed_id is None   # a new epoch


def test_the_adapter_gives_stdin_its_blocking_mode_back() -> None:
    """review7 #10: the adapter makes stdin non-blocking to poll it; the mode belongs
    to the open file, shared with the shell's terminal: at exit it is restored."""
    import os
    import subprocess
    import sys

    from tests.connect.harness import ROOT

    read, write = os.pipe()
    try:
        assert os.get_blocking(read)
        child = subprocess.Popen([sys.executable, "-m", "acp_server.connect.cli",
                                  "http://127.0.0.1:9/acp"], stdin=read,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 env={**os.environ, "PYTHONPATH": ROOT})
        os.write(write, b"not json\n")
        os.close(write)
        assert child.wait(timeout=60) == 0, child.stderr.read() if child.stderr else ""
        assert os.get_blocking(read)
    finally:
        os.close(read)


def test_the_token_stays_out_of_reprs_and_clear_text_is_warned_of() -> None:
    """review7 #15: Target's repr has no token; a token sent over http:// to another
    machine gets a warning on stderr (loopback does not)."""
    import os
    import subprocess
    import sys

    from acp_server.connect import Target
    from tests.connect.harness import ROOT

    assert "s3cret" not in repr(Target("http://h/acp", "s3cret"))

    def stderr_of(url: str) -> str:
        return subprocess.run([sys.executable, "-m", "acp_server.connect.cli", url],
                              input=b"", capture_output=True, timeout=60,
                              env={**os.environ, "PYTHONPATH": ROOT,
                                   "ACP_SERVER_TOKEN": "s3cret"}).stderr.decode()

    remote = stderr_of("http://192.0.2.1:4170/acp")
    assert "clear text" in remote and "s3cret" not in remote
    assert stderr_of("http://127.0.0.1:4170/acp") == ""
