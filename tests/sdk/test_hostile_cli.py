"""``acp-server prompt`` and ``acp-server tasks`` as real processes against a raw server
that misbehaves (``tests.sdk.rawserver``): each case ends with one line on stderr and
exit status 1, never a traceback; Ctrl-C (SIGINT) while waiting ends with 130.
"""

from __future__ import annotations

import signal
import subprocess
import sys

import anyio
import pytest

from tests.sdk.rawserver import Conn, json_answer, raw_server, routes
from tests.sdk.test_hostile_wire import PROXY_PAGE, never_answer, trickle_body
from tests.terminal import cli_env

pytestmark = pytest.mark.anyio

CEILING = 60


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "acp_server", *args]


async def run(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    with anyio.fail_after(CEILING):
        return await anyio.run_process(command(*args), input=stdin, check=False, env=cli_env())


def one_error_line(done: subprocess.CompletedProcess[bytes], prefix: str) -> str:
    err = done.stderr.decode()
    assert done.returncode == 1, err
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith(prefix), err
    assert all(c == "\n" or c.isprintable() for c in err), repr(err)
    return err.rstrip("\n")


PAGE = json_answer(PROXY_PAGE, 502, content_type="text/html")


@pytest.mark.parametrize("args", [["prompt", "hi"], ["tasks", "get", "task_1"]])
async def test_a_proxy_page_is_one_line(args: list[str]) -> None:
    async with raw_server(PAGE) as server:
        done = await run(*args, "--url", server.url)
    line = one_error_line(done, f"acp-server {args[0]}: ")
    assert line.endswith("502 Bad Gateway (a text/html answer)")


async def test_a_servers_text_cannot_drive_the_terminal() -> None:
    nasty = json_answer(b'{"error": "bad\\n\\u001b[2J\\u001b[31mred\\r", "code": "x\\u0007"}', 400)
    async with raw_server(nasty) as server:
        done = await run("prompt", "hi", "--url", server.url)
    assert one_error_line(done, "acp-server prompt: ") == "acp-server prompt: bad [2J[31mred (x)"


async def test_an_epoch_that_cannot_be_sent_back_is_one_line() -> None:
    script = routes({
        "POST /session/s-1/prompt": json_answer(
            b'{"promptId": "p-1", "lastEventId": 0, "eventEpoch": "\\u00e9poque"}', 202),
        "POST /session": json_answer(b'{"sessionId": "s-1"}'),
    })
    async with raw_server(script) as server:
        done = await run("prompt", "hi", "--url", server.url)
    assert "event epoch that is not a token" in one_error_line(done, "acp-server prompt: ")


@pytest.mark.parametrize("args", [["prompt", "hi"], ["tasks", "list"]])
@pytest.mark.parametrize("script", [never_answer, trickle_body], ids=["never", "trickled"])
async def test_a_server_that_does_not_finish_answering_times_out(args: list[str], script) -> None:
    async with raw_server(script) as server:
        done = await run(*args, "--url", server.url, "--timeout", "0.5")
    assert one_error_line(done, f"acp-server {args[0]}: ").endswith("failed: timed out")


@pytest.mark.parametrize("args", [["prompt", "hi"], ["tasks", "get", "task_1"]])
async def test_a_redirect_is_one_line_and_not_followed(args: list[str]) -> None:
    async with raw_server(json_answer(b"{}")) as other:
        moved = json_answer(b"", 302, headers={"Location": f"{other.url}/elsewhere"})
        async with raw_server(moved) as server:
            done = await run(*args, "--url", server.url, "--token", "secret-token")
    line = one_error_line(done, f"acp-server {args[0]}: ")
    assert line.endswith(f"redirected to {other.url}/elsewhere (not followed)")
    assert other.requests == []


async def test_a_listing_with_impossible_times_is_printed() -> None:
    page = json_answer(b'{"data": [{"id": "task_1", "status": "queued", "created_at": '
                       b'9223372036854775807}]}')
    async with raw_server(page) as server:
        done = await run("tasks", "list", "--url", server.url)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().startswith("task_1  queued")


async def test_a_status_the_cli_does_not_know_is_shown_not_a_crash() -> None:
    gets = 0

    async def get(conn: Conn) -> None:
        nonlocal gets
        gets += 1
        status = b"weird" if gets == 1 else b"succeeded"
        await conn.answer(200, b'{"id": "task_1", "status": "' + status + b'"}')

    async def events(conn: Conn) -> None:
        await conn.head()
        await conn.send(b'data: {"type": "response.completed", "sequence_number": 1}\n\n')

    script = routes({"GET /lmsp/v1/tasks/task_1/events": events, "GET /lmsp/v1/tasks/": get})
    async with raw_server(script) as server:
        done = await run("tasks", "watch", "task_1", "--url", server.url)
    err = done.stderr.decode()
    assert done.returncode == 0 and "Traceback" not in err, err
    assert err.splitlines()[0] == "task_1  weird"
    assert err.splitlines()[-1].startswith("task_1  succeeded")


@pytest.mark.parametrize("args", [["prompt", "-"], ["tasks", "create", "-"]])
async def test_a_prompt_that_is_not_utf8_is_a_usage_error(args: list[str]) -> None:
    async with raw_server(json_answer(b'{"sessionId": "s-1"}')) as server:
        done = await run(*args, "--url", server.url, stdin=b"\xff\xfe not text")
    err = done.stderr.decode()
    assert done.returncode == 2 and "Traceback" not in err, err
    assert err == f"acp-server {args[0]}: the prompt (stdin) is not UTF-8 text\n"
    assert not any("/prompt" in r.target or "/tasks" in r.target for r in server.requests)


# -- Ctrl-C --------------------------------------------------------------------------------------
async def _interrupt(args: list[str], script_table: dict, waiting: anyio.Event, *,
                     then: anyio.Event | None = None) -> tuple[int, str]:
    """Start the command, Ctrl-C it once ``waiting`` is set (and again once ``then`` is);
    its exit status and stderr."""
    async with raw_server(routes(script_table)) as server:
        process = await anyio.open_process(command(*args, "--url", server.url), env=cli_env())
        async with process:
            with anyio.fail_after(CEILING):
                await waiting.wait()
                process.send_signal(signal.SIGINT)
                if then is not None:
                    await then.wait()
                    process.send_signal(signal.SIGINT)
                code = await process.wait()
            assert process.stderr is not None
            err = b""
            async for chunk in process.stderr:
                err += chunk
    return code, err.decode()


def _prompt_daemon(waiting: anyio.Event, cancelled: anyio.Event,
                   cancel_hangs: bool = False) -> dict:
    async def events(conn: Conn) -> None:
        await conn.head()
        await conn.send(b": hello\n\n")
        waiting.set()
        await conn.until_gone()

    async def cancel(conn: Conn) -> None:
        cancelled.set()
        if cancel_hangs:
            await conn.until_gone()
        else:
            await conn.answer(204)

    return {"POST /session/s-1/prompt": json_answer(b'{"promptId": "p-1", "lastEventId": 0}',
                                                    202),
            "POST /session": json_answer(b'{"sessionId": "s-1"}'),
            "GET /session/s-1/events": events,
            "POST /session/s-1/cancel": cancel,
            "DELETE /session/s-1/pending-prompts/": cancel}


async def test_ctrl_c_while_a_prompt_waits_exits_130_and_cancels_it() -> None:
    waiting, cancelled = anyio.Event(), anyio.Event()
    code, err = await _interrupt(["prompt", "hi"], _prompt_daemon(waiting, cancelled), waiting)
    assert code == 130 and "Traceback" not in err, err
    assert cancelled.is_set()


async def test_a_second_ctrl_c_does_not_wait_for_a_cancel_that_hangs() -> None:
    waiting, cancelled = anyio.Event(), anyio.Event()
    table = _prompt_daemon(waiting, cancelled, cancel_hangs=True)
    code, err = await _interrupt(["prompt", "hi"], table, waiting, then=cancelled)
    assert code == 130 and "Traceback" not in err, err


async def test_ctrl_c_while_a_task_is_watched_exits_130() -> None:
    waiting = anyio.Event()

    async def events(conn: Conn) -> None:
        await conn.head()
        await conn.send(b'data: {"type": "response.created", "sequence_number": 1}\n\n')
        waiting.set()
        await conn.until_gone()

    table = {"GET /lmsp/v1/tasks/task_1/events": events,
             "GET /lmsp/v1/tasks/": json_answer(b'{"id": "task_1", "status": "queued"}')}
    code, err = await _interrupt(["tasks", "watch", "task_1"], table, waiting)
    assert code == 130 and "Traceback" not in err, err


# -- what a prompt's event stream can hold -------------------------------------------------------
def _prompt_with_events(*frames: bytes | None, vote: list[bytes] | None = None) -> dict:
    """A daemon whose prompt's event stream sends ``frames`` (``None``: wait until the
    client has voted on a permission) and ends; votes are kept in ``vote``."""
    voted = anyio.Event()

    async def events(conn: Conn) -> None:
        await conn.head()
        for frame in frames:
            if frame is None:
                await voted.wait()
            else:
                await conn.send(frame)

    async def permission(conn: Conn) -> None:
        body = conn.request.early
        with anyio.move_on_after(5):   # the vote's body, as far as sent
            while b"}}" not in body:
                body += await conn.stream.receive()
        if vote is not None:
            vote.append(body)
        await conn.answer(200, b"{}")
        voted.set()

    return {"POST /session/s-1/prompt": json_answer(b'{"promptId": "p-1", "lastEventId": 0}',
                                                    202),
            "POST /session/s-1/permission/": permission,
            "POST /session": json_answer(b'{"sessionId": "s-1"}'),
            "GET /session/s-1/events": events}


@pytest.mark.parametrize(("frames", "says"), [
    ((b'data: {"type": 5}\n\n',), "Malformed daemon answer"),
    ((b'id: 1\ndata: {"type": "session_update", "id": 1}\n\n',), "not resumed after 5 attempts"),
], ids=["wrong-type", "replayed-for-ever"])
async def test_a_broken_event_stream_is_one_line(frames: tuple[bytes, ...], says: str) -> None:
    async with raw_server(routes(_prompt_with_events(*frames))) as server:
        done = await run("prompt", "hi", "--url", server.url)
    assert says in one_error_line(done, "acp-server prompt: ")


async def test_a_permission_request_of_the_wrong_shape_is_answered_cancelled() -> None:
    vote: list[bytes] = []
    frames = (b'data: {"type": "permission_request", "id": 1, "promptId": "p-1", "data": '
              b'{"requestId": "r-1", "options": "abc", "toolCall": "not an object"}}\n\n',
              b'data: {"type": "permission_resolved", "id": 2, "data": {"requestId": "r-9"}}'
              b'\n\n', None,
              b'data: {"type": "turn_complete", "id": 3, "data": {"promptId": "p-1"}}\n\n')
    async with raw_server(routes(_prompt_with_events(*frames, vote=vote))) as server:
        done = await run("prompt", "hi", "--url", server.url)
    err = done.stderr.decode()
    assert done.returncode == 0 and "Traceback" not in err, err
    assert "answered cancelled" in err
    assert vote == [b'{"outcome":{"outcome":"cancelled"}}']


@pytest.mark.parametrize("args", [["prompt", "hi"], ["tasks", "list"]])
async def test_an_address_that_is_not_a_url_is_a_usage_error(args: list[str]) -> None:
    done = await run(*args, "--url", "http://[::1")
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert err == (f"acp-server {args[0]}: the daemon's address (--url or $ACP_SERVER_URL) "
                   "is not a URL: 'http://[::1' is malformed: its IPv6 host has no closing "
                   "']' (e.g. http://127.0.0.1:4170, or http://[::1]:4170)\n"), err


@pytest.mark.parametrize(("url", "wrong"), [
    # httpx said "Invalid port: ':1'" of the first: the part that is wrong is the host
    ("http://[::1", "its IPv6 host has no closing ']'"),
    ("http://[::1]x/", "after the IPv6 host ']' comes 'x', not ':PORT'"),
    ("http://::1:4170", "its host has several ':' (an IPv6 address goes in brackets)"),
    ("http://:4170", "it has no host"),
    ("http://u:secret@host:http/", "its port 'http' is not a number from 1 to 65535"),
    ("http://host:70000", "its port '70000' is not a number from 1 to 65535"),
    ("http://host:" + "9" * 5000, "its port '99999999999999999999' is not a number from 1 "
                                  "to 65535"),
])
def test_a_malformed_address_says_which_part_is_wrong(url: str, wrong: str) -> None:
    import httpx

    from acp_server.client.arguments import daemon_url

    with pytest.raises(httpx.InvalidURL) as refused:
        daemon_url(url)
    assert str(refused.value).endswith(f" is malformed: {wrong} (e.g. http://127.0.0.1:4170, "
                                       "or http://[::1]:4170)")
    assert "secret" not in str(refused.value)


@pytest.mark.parametrize("url", ["http://[::1]:4170/", "https://[fe80::1%eth0]:4170",
                                 "http://u@host", "http://host:4170/x?a=b:c#d"])
def test_a_well_formed_address_is_taken_as_it_is(url: str) -> None:
    from acp_server.client.arguments import daemon_url

    assert daemon_url(url) == url


@pytest.mark.parametrize("anyio_backend", ["asyncio"])   # only runs the CLI as a child
@pytest.mark.parametrize("args", [["prompt", "hi"], ["tasks", "list"]])
@pytest.mark.parametrize("url", ["127.0.0.1:4170", "localhost:4170", "ftp://127.0.0.1:4170"])
async def test_an_address_without_http_is_a_usage_error_that_shows_one(
        args: list[str], url: str) -> None:
    """``--url 127.0.0.1:4170`` (what the listening line's address looks like without
    its scheme) was "POST /session failed: Request URL is missing an 'http://' or
    'https://' protocol.", exit 1."""
    done = await run(*args, "--url", url)
    assert done.returncode == 2, done.stderr
    assert done.stderr.decode() == (
        f"acp-server {args[0]}: the daemon's address (--url or $ACP_SERVER_URL) is not a "
        f"URL: {url!r} is not http:// or https:// (e.g. http://127.0.0.1:4170)\n")
