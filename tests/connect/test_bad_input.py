"""What the adapter does with bad input from the editor, a bad server at start-up,
and a server that never comes back: an error in JSON-RPC's terms, one line on stderr
where it helps, never a crash, never anything but protocol on stdout."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from tests.acp_http.server import running_acp_server
from tests.connect.harness import port_of, spawn_adapter, tcp_relay
from tests.harness import free_port

pytestmark = pytest.mark.anyio

INIT = {"protocolVersion": 1, "clientCapabilities": {}}


def no_h2(anyio_backend: str) -> tuple[str, ...]:
    """Under trio the test server is hypercorn, whose HTTP/2 fails by itself when it
    answers a request early (401, 404) and the request's body arrives after (a
    KeyError in its stream table, which ends the whole server): HTTP/1.1 there."""
    return ("--transport", "http1") if anyio_backend == "trio" else ()


async def test_bad_lines_are_answered_and_the_adapter_goes_on(tmp_path: Path) -> None:
    async with running_acp_server(tmp_path) as srv, \
            spawn_adapter(srv.base_url + "/acp", "--max-line-bytes", "4096") as adapter:
        early = await adapter.request("session/list", {})
        assert early["error"]["code"] == -32600 and "initialize" in early["error"]["message"]
        cases = [
            (b"this is not json\n", -32700, None),
            (b'{"jsonrpc": "2.0", "id": 5, "method": \n', -32700, None),   # cut short
            (b"[1, 2, 3]\n", -32600, None),
            (b'{"id": 6, "method": "session/list"}\n', -32600, 6),         # no "jsonrpc"
            (b'{"jsonrpc": "1.0", "id": 7, "method": "x"}\n', -32600, 7),
            (b'{"jsonrpc": "2.0", "id": {"a": 1}, "method": "x"}\n', -32600, None),
            (b'{"jsonrpc": "2.0", "id": 8}\n', -32600, 8),                 # neither kind
            (b'{"jsonrpc": "2.0", "method": 12}\n', -32600, None),
            (b'{"jsonrpc": "2.0", "id": 9, "method": "' + b"x" * 8000 + b'"}\n', -32600, None),
        ]
        for line, code, rpc_id in cases:
            await adapter.send_raw(line)
            answer = await adapter.receive()
            assert answer["error"]["code"] == code, (line[:60], answer)
            assert answer["id"] == rpc_id
        assert "too large" in adapter.received[-1]["error"]["message"]
        # a huge line in pieces, without a newline for a while: refused, not buffered
        for _ in range(8):
            await adapter.send_raw(b"y" * 4096)
        await adapter.send_raw(b"\n")
        assert "too large" in (await adapter.receive())["error"]["message"]
        init = await adapter.request("initialize", INIT)   # still working
        assert init["result"]["protocolVersion"] == 1
        listed = await adapter.request("session/list", {})
        assert listed["result"] == {"sessions": []}
        await adapter.send_raw(b"\n\n  \n")   # blank lines are no messages
        assert (await adapter.request("session/list", {}))["result"] == {"sessions": []}
        assert adapter.stderr == []


async def test_params_that_are_not_an_object_are_refused_not_fatal(tmp_path: Path) -> None:
    """review7 #3: the adapter adds to ``params._meta`` of initialize, session/prompt and
    (with ``--agent``) session/new|load|resume; params that are an array there get
    ``-32602`` (a notification is dropped with a line on stderr) and the adapter goes on.
    Params neither an object nor an array are no JSON-RPC request (§4.2): ``-32600``,
    as the server answers them."""
    async with running_acp_server(tmp_path) as srv, \
            spawn_adapter(srv.base_url + "/acp", "--agent", "reference") as adapter:
        for rpc_id, (params, code) in enumerate((([], -32602), (None, -32600), (3, -32600),
                                                 ("x", -32600)), start=100):
            await adapter.send({"jsonrpc": "2.0", "id": rpc_id, "method": "initialize",
                                "params": params})
            assert (await adapter.response(rpc_id))["error"]["code"] == code, params
        init = await adapter.request("initialize", INIT)
        assert init["result"]["protocolVersion"] == 1
        for method in ("session/prompt", "session/new", "session/load", "session/resume"):
            answer = await adapter.request(method, [])
            assert answer["error"]["code"] == -32602, (method, answer)
            assert "object" in answer["error"]["message"]
        await adapter.send({"jsonrpc": "2.0", "method": "session/new", "params": [1]})
        created = await adapter.request("session/new", {"cwd": srv.workspace,
                                                        "mcpServers": []})
        sid = created["result"]["sessionId"]
        done = await adapter.request("session/prompt", {
            "sessionId": sid, "prompt": [{"type": "text", "text": "still here"}]})
        assert done["result"]["stopReason"] == "end_turn"
        assert adapter.process.returncode is None
        assert not [line for line in adapter.stderr if "Traceback" in line]
        assert any("dropped a notification" in line for line in adapter.stderr)


@pytest.mark.parametrize("transport", ["websocket", "http"])
async def test_a_message_over_the_servers_cap_fails_alone(tmp_path: Path, transport: str,
                                                           anyio_backend: str) -> None:
    """review7 #1: a prompt under the adapter's line cap but over the server's body cap
    (HTTP 413, WebSocket close 1009) fails with ``message_too_large``; no reconnect
    loop, and the next messages go through."""
    args = ("--transport", transport) if transport == "websocket" else \
        no_h2(anyio_backend) or ("--transport", "http")
    async with running_acp_server(tmp_path, max_body_bytes=64 * 1024) as srv, \
            spawn_adapter(srv.base_url + "/acp", *args, "--give-up-after", "20s") as adapter:
        await adapter.request("initialize", INIT)
        sid = (await adapter.request("session/new", {"cwd": srv.workspace,
                                                     "mcpServers": []}))["result"]["sessionId"]
        big = [{"type": "text", "text": "x" * 100_000}]
        refused = await adapter.request("session/prompt", {"sessionId": sid, "prompt": big})
        assert refused["error"]["data"]["errorKind"] == "message_too_large", adapter.stderr
        listed = await adapter.request("session/list", {})
        assert sid in [s["sessionId"] for s in listed["result"]["sessions"]]
        again = await adapter.request("session/prompt", {"sessionId": sid, "prompt": big})
        assert again["error"]["data"]["errorKind"] == "message_too_large"
        done = await adapter.request("session/prompt", {
            "sessionId": sid, "prompt": [{"type": "text", "text": "small"}]})
        assert done["result"]["stopReason"] == "end_turn"
        assert len([line for line in adapter.stderr if "reconnected" in line]) <= 1


async def test_an_unreachable_server_fails_initialize() -> None:
    port = free_port()
    async with spawn_adapter(f"http://127.0.0.1:{port}/acp") as adapter:
        answer = await adapter.request("initialize", INIT)
        error = answer["error"]
        assert error["code"] == -32603
        assert "unreachable" in error["message"] and str(port) in error["message"]
        # the cause, not httpx's "All connection attempts failed"
        assert error["message"].endswith(" is unreachable: connection refused"), error
        assert error["data"] == {"errorKind": "server_unreachable"}
        with anyio.fail_after(10):
            while not adapter.stderr:
                await anyio.sleep(0.02)
        assert len(adapter.stderr) == 1 and "unreachable" in adapter.stderr[0]
        # it keeps running: the editor may try again
        again = await adapter.request("initialize", INIT)
        assert again["error"]["data"] == {"errorKind": "server_unreachable"}


async def test_stdin_closed_after_a_failed_initialize_exits_1(tmp_path: Path) -> None:
    """The editor (or a script piping ``initialize`` in) gave up after the adapter
    could not start: exit status 1, not 0 as if all went well. One ``initialize``
    that succeeds after failures makes the adapter's run a success again (0)."""
    port = free_port()
    async with spawn_adapter(f"http://127.0.0.1:{port}/acp") as adapter:
        answer = await adapter.request("initialize", INIT)
        assert answer["error"]["data"] == {"errorKind": "server_unreachable"}
        assert adapter.process.stdin is not None
        await adapter.process.stdin.aclose()
        assert await adapter.exit_code() == 1, adapter.stderr
    async with running_acp_server(tmp_path) as srv, tcp_relay(port_of(srv.base_url)) as relay, \
            spawn_adapter(f"http://127.0.0.1:{relay.port}/acp") as adapter:
        relay.refusing = True   # accepted, then closed at once
        refused = await adapter.request("initialize", INIT)
        assert "error" in refused, refused
        relay.refusing = False
        init = await adapter.request("initialize", INIT)
        assert init["result"]["protocolVersion"] == 1
        assert adapter.process.stdin is not None
        await adapter.process.stdin.aclose()
        assert await adapter.exit_code() == 0, adapter.stderr


async def test_a_wrong_token_fails_initialize_without_showing_the_token(
        tmp_path: Path, anyio_backend: str) -> None:
    async with running_acp_server(tmp_path, token="right-token") as srv:
        async with spawn_adapter(srv.base_url + "/acp", "--token", "wrong-token-123",
                                 *no_h2(anyio_backend)) as adapter:
            answer = await adapter.request("initialize", INIT)
            assert answer["error"]["data"] == {"errorKind": "unauthorized"}
            assert "credentials" in answer["error"]["message"]
            assert "401" in answer["error"]["message"]
            with anyio.fail_after(10):
                while not adapter.stderr:
                    await anyio.sleep(0.02)
        assert len(adapter.stderr) == 1
        everything = "\n".join(adapter.stderr) + repr(adapter.received)
        assert "wrong-token-123" not in everything and "right-token" not in everything
        async with spawn_adapter(srv.base_url + "/acp",
                                 env={"ACP_SERVER_TOKEN": "right-token"}) as adapter:
            assert (await adapter.request("initialize", INIT))["result"]["protocolVersion"] == 1


@pytest.mark.parametrize("path", ["/health", "/nothing-here"])
async def test_not_an_acp_endpoint(tmp_path: Path, path: str, anyio_backend: str) -> None:
    async with running_acp_server(tmp_path) as srv, \
            spawn_adapter(srv.base_url + path, *no_h2(anyio_backend)) as adapter:
        answer = await adapter.request("initialize", INIT)
        assert answer["error"]["data"] == {"errorKind": "not_acp"}
        assert "not an ACP endpoint" in answer["error"]["message"]


async def test_giving_up_fails_what_is_pending_and_exits_1(tmp_path: Path) -> None:
    async with running_acp_server(tmp_path) as srv, tcp_relay(port_of(srv.base_url)) as relay, \
            spawn_adapter(f"http://127.0.0.1:{relay.port}/acp",
                          "--give-up-after", "1500ms") as adapter:
        await adapter.request("initialize", INIT)
        sid = (await adapter.request("session/new", {"cwd": srv.workspace,
                                                     "mcpServers": []}))["result"]["sessionId"]
        await adapter.send({"jsonrpc": "2.0", "id": "long", "method": "session/prompt",
                            "params": {"sessionId": sid,
                                       "prompt": [{"type": "text", "text": "/sleep 30s x"}]}})
        await adapter.until(lambda m: m.get("method") == "session/update")
        relay.refusing = True
        relay.cut()
        await adapter.send({"jsonrpc": "2.0", "id": "queued", "method": "session/list",
                            "params": {}})
        for rpc_id in ("long", "queued"):
            error = (await adapter.response(rpc_id, timeout=60))["error"]
            assert error["data"]["errorKind"] == "server_unreachable"
            assert "gave up" in error["message"] and str(relay.port) in error["message"]
        assert await adapter.exit_code() == 1
        assert any("gave up" in line for line in adapter.stderr)


async def test_a_token_refused_after_a_reconnect_fails_what_is_pending(
        tmp_path: Path, anyio_backend: str) -> None:
    """review7 #8: the server comes back refusing the token (revoked, rotated): the
    pending requests fail at once with ``unauthorized`` and one line on stderr, instead
    of waiting out the give-up window; the token is shown nowhere."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with running_acp_server(tmp_path / "a", token="token-a") as first, \
            running_acp_server(tmp_path / "b", token="token-b") as second, \
            tcp_relay(port_of(first.base_url)) as relay, \
            spawn_adapter(f"http://127.0.0.1:{relay.port}/acp", *no_h2(anyio_backend),
                          env={"ACP_SERVER_TOKEN": "token-a"}) as adapter:
        await adapter.request("initialize", INIT)
        await adapter.request("session/new", {"cwd": first.workspace, "mcpServers": []})
        relay.target_port = port_of(second.base_url)
        relay.cut()
        answer = await adapter.request("session/list", {}, timeout=30)
        assert answer["error"]["data"]["errorKind"] == "unauthorized", answer
        assert "401" in answer["error"]["message"]
        refused = [line for line in adapter.stderr if "credentials" in line]
        assert len(refused) == 1
        everything = "\n".join(adapter.stderr) + repr(adapter.received)
        assert "token-a" not in everything and "token-b" not in everything
        assert adapter.process.returncode is None


async def test_an_initialize_notification_and_a_failed_load_leave_nothing(
        tmp_path: Path) -> None:
    """review7 #20: initialize sent as a notification gets no answer (a line on stderr);
    an editor's session/load the server refuses does not stay registered, so the next
    reconnect does not try to re-attach it."""
    async with running_acp_server(tmp_path) as srv, \
            tcp_relay(port_of(srv.base_url)) as relay, \
            spawn_adapter(f"http://127.0.0.1:{relay.port}/acp", "--verbose") as adapter:
        await adapter.send({"jsonrpc": "2.0", "method": "initialize", "params": INIT})
        init = await adapter.request("initialize", INIT, rpc_id="i")
        assert init["result"]["protocolVersion"] == 1
        assert [m.get("id") for m in adapter.received] == ["i"]   # nothing for the first
        refused = await adapter.request("session/load", {
            "sessionId": "no-such-session", "cwd": srv.workspace, "mcpServers": []})
        assert refused["error"]["code"] == -32602
        relay.cut()
        with anyio.fail_after(30):
            while not any("reconnected" in line for line in adapter.stderr):
                await anyio.sleep(0.02)
        assert (await adapter.request("session/list", {}))["result"] == {"sessions": []}
        assert not [line for line in adapter.stderr if "could not be re-attached" in line]
        assert any("notification" in line for line in adapter.stderr)


@pytest.mark.parametrize("value", ["0", "-1", "1023", "abc", ""])
def test_a_line_cap_below_1_kib_is_a_usage_error(value: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """``--max-line-bytes 0`` used to start an adapter that refused every message."""
    import argparse

    from acp_server.connect.cli import add_connect_arguments

    parser = add_connect_arguments(argparse.ArgumentParser(prog="acp-server connect"))
    with pytest.raises(SystemExit) as stopped:
        parser.parse_args(["http://127.0.0.1:1/acp", "--max-line-bytes", value])
    assert stopped.value.code == 2 and "--max-line-bytes" in capsys.readouterr().err
    assert parser.parse_args(["http://127.0.0.1:1/acp", "--max-line-bytes", "1024"]
                             ).max_line_bytes == 1024


@pytest.mark.parametrize(("token", "how"), [("s3crét", "--token"),
                                             ("s3cret\r\nX-Injected: 1", "env"),
                                             ("s3c\x01ret", "env")])
def test_a_token_no_header_can_carry_is_a_usage_error_that_does_not_show_it(
        token: str, how: str) -> None:
    """A token with a control character or a non-ASCII one: before, each ``initialize``
    failed with httpx's message, which quoted the header, token and all, to stderr and
    to the editor. Now: exit 2 at start, the token not shown."""
    import os
    import subprocess
    import sys

    from tests.connect.harness import ROOT

    env = {**os.environ, "PYTHONPATH": ROOT, "ACP_SERVER_TOKEN": token}
    args = ["--token", token] if how == "--token" else []
    done = subprocess.run([sys.executable, "-m", "acp_server.connect.cli",
                           "http://127.0.0.1:9/acp", *args],
                          input=b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}\n',
                          capture_output=True, timeout=60, env=env)
    said = done.stderr.decode(errors="replace") + done.stdout.decode(errors="replace")
    assert done.returncode == 2, said
    assert "s3c" not in said and "the token holds" in said, said


async def test_a_token_with_blanks_around_it_is_sent_without_them(tmp_path: Path) -> None:
    """A token pasted with a space or newline around it (an editor's ``env``): the
    server strips the blanks of a bearer; over a WebSocket the adapter failed at
    every ``initialize`` ("Illegal header value", the token quoted). Now it is sent
    stripped, on either transport."""
    async with running_acp_server(tmp_path, token="s3cret") as srv:
        for transport in ("websocket", "http1"):
            async with spawn_adapter(srv.base_url, "--transport", transport,
                                     env={"ACP_SERVER_TOKEN": " s3cret\n"}) as adapter:
                init = await adapter.request("initialize", {"protocolVersion": 1})
                assert "result" in init, init
                assert not any("s3cret" in line for line in adapter.stderr)


@pytest.mark.parametrize("status", [502, 503])
async def test_a_proxy_with_no_server_behind_it_is_unavailable_not_another_protocol(
        status: int) -> None:
    """A balancer with no healthy server (or one still starting) answers 502/503 with
    its own page: ``initialize`` said "not an ACP endpoint" (``not_acp``), which sends
    the user to check the URL; it is ``server_unreachable``, to be tried again."""
    from tests.sdk.rawserver import Conn, raw_server

    async def unavailable(conn: Conn) -> None:
        await conn.answer(status, b"<html>No server is available</html>",
                          content_type="text/html")

    async with raw_server(unavailable) as server, \
            spawn_adapter(f"{server.url}/acp", "--transport", "http1") as adapter:
        answer = await adapter.request("initialize", INIT)
        assert answer["error"]["data"] == {"errorKind": "server_unreachable"}, answer
        assert f"unavailable for now (HTTP {status}" in answer["error"]["message"]
