"""``acp-server prompt`` end to end against the real daemon: streamed output, exit
statuses, the in-process function and the ``python -m`` module."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import anyio
import pytest

from acp_server.client.prompt_cli import build_parser, chunk_text, prompt_command, run_prompt
from bridge import BridgeOptions
from tests.sdk.harness import Daemon, Recorder, closed_port_url, daemon

pytestmark = pytest.mark.anyio


class Streams:
    def __init__(self) -> None:
        self.out, self.err = io.StringIO(), io.StringIO()


async def run(argv: list[str]) -> tuple[int, str, str]:
    streams = Streams()
    code = await prompt_command(build_parser().parse_args(argv), out=streams.out,
                                err=streams.err)
    return code, streams.out.getvalue(), streams.err.getvalue()


async def test_streams_the_reply(server: Daemon) -> None:
    code, out, err = await run(["/chunks 5 hello world", "--url", server.url])
    assert (code, out, err) == (0, "Echo: hello world\n", "")


async def test_chunks_arrive_as_they_come(tmp_path: object) -> None:
    """Output is written per event: each chunk reaches stdout before the next."""
    writes: list[str] = []

    class Recording(io.StringIO):
        def write(self, text: str) -> int:
            writes.append(text)
            return super().write(text)

    async with daemon(tmp_path) as srv:
        code = await prompt_command(build_parser().parse_args(["/chunks 4 abcdefgh", "--url",
                                                               srv.url]),
                                    out=Recording(), err=io.StringIO())
    assert code == 0 and writes == ["Echo", ": ab", "cde", "fgh", "\n"]


async def test_session_and_stop_reason(server: Daemon) -> None:
    from acp_server.client import DaemonClient

    async with DaemonClient(server.url) as client:
        sid = (await client.create_or_attach_session({"sessionScope": "thread"})).session_id
    code, out, err = await run(["/max_tokens cut", "--url", server.url, "--session", sid])
    assert code == 0 and out == "Echo: cut\n" and "max_tokens" in err


async def test_errors_exit_non_zero(server: Daemon) -> None:
    code, out, err = await run(["/fail", "--url", server.url])
    assert code == 1 and out == "" and "failure" in err
    code, _, err = await run(["hi", "--url", server.url, "--session", "nope"])
    assert code == 1 and "session_not_found" in err
    url = closed_port_url()
    code, _, err = await run(["hi", "--url", url, "--timeout", "2"])
    assert (code, err) == (1, f"acp-server prompt: cannot reach {url}: connection refused\n")


async def test_token(tmp_path: object) -> None:
    recorder = Recorder()
    async with daemon(tmp_path, wrap=recorder.wrap) as srv:
        code, out, _ = await run(["hi", "--url", srv.url, "--token", "s3cret"])
    assert code == 0 and out == "Echo: hi\n"
    assert {r.headers.get("authorization") for r in recorder.requests} == {"Bearer s3cret"}


async def test_run_prompt_function(server: Daemon) -> None:
    streams = Streams()
    code = await anyio.to_thread.run_sync(
        lambda: run_prompt(["hello", "--url", server.url], out=streams.out, err=streams.err))
    assert code == 0 and streams.out.getvalue() == "Echo: hello\n"
    assert run_prompt([]) == 2  # usage


async def test_module_entry_point(server: Daemon) -> None:
    env = {**os.environ, "ACP_SERVER_URL": server.url}
    env.pop("ACP_SERVER_TOKEN", None)
    result = await anyio.run_process([sys.executable, "-m", "acp_server.client.prompt_cli",
                                      "/chunks 3 from a subprocess"], env=env, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"Echo: from a subprocess\n"
    failed = await anyio.run_process([sys.executable, "-m", "acp_server.client.prompt_cli", "/fail"],
                                     env=env, check=False)
    assert failed.returncode == 1 and b"failure" in failed.stderr


def test_chunk_text_ignores_other_events() -> None:
    from acp_server.client import DaemonEvent

    assert chunk_text(DaemonEvent(type="turn_complete", data={})) is None
    user = {"update": {"sessionUpdate": "user_message_chunk",
                       "content": {"type": "text", "text": "x"}}}
    assert chunk_text(DaemonEvent(type="session_update", data=user)) is None


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "abc", ""])
def test_a_timeout_that_is_not_above_zero_is_a_usage_error(
        value: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``--timeout -1`` used to surface later as "cannot reach …: timed out"; both
    clients refuse it at once with argparse's usage error (exit status 2)."""
    from acp_server.client.tasks_cli import build_parser as tasks_parser

    for argv in (["--timeout", value, "hi"], ["list", "--timeout", value]):
        parser = build_parser() if argv[-1] == "hi" else tasks_parser()
        with pytest.raises(SystemExit) as stopped:
            parser.parse_args(argv)
        assert stopped.value.code == 2
        assert "--timeout" in capsys.readouterr().err
    assert build_parser().parse_args(["--timeout", "0.5", "hi"]).timeout == 0.5


@pytest.mark.parametrize("value", ["0", "-1", "101", "abc", ""])
def test_a_tasks_list_limit_out_of_range_is_a_usage_error(
        value: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``tasks list --limit 0`` reached the server and exited 1 on its 400; a page size
    outside 1..100 (what the server takes) is now argparse's usage error, exit 2."""
    from acp_server.client.tasks_cli import build_parser as tasks_parser

    with pytest.raises(SystemExit) as stopped:
        tasks_parser().parse_args(["list", "--limit", value])
    assert stopped.value.code == 2
    assert "--limit" in capsys.readouterr().err
    assert tasks_parser().parse_args(["list", "--limit", "100"]).limit == 100


def test_session_and_thread_together_are_a_usage_error(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``--session x --thread`` was taken and ``--thread`` silently ignored (the docs
    show them as either/or): now argparse's usage error, exit status 2, no request."""
    from acp_server.cli import main

    with pytest.raises(SystemExit) as stopped:
        main(["prompt", "--session", "x", "--thread", "hi", "--url", closed_port_url()])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "acp-server prompt: error: argument --thread: not allowed with argument --session")
    assert run_prompt(["--thread", "--session", "x", "hi"]) == 2
    assert build_parser().parse_args(["--thread", "hi"]).session is None


async def test_a_full_queue_says_whose_how_full_and_when_to_retry(tmp_path: Path) -> None:
    """It said ``Pending prompts full: "6f9d…" (2/2)``: no hint what to do."""
    from acp_server.client import DaemonClient, PromptAccepted

    options = BridgeOptions(max_pending_prompts_per_session=2)
    async with daemon(tmp_path, options=options) as srv, \
            DaemonClient(srv.url, max_pending_prompts_per_session=0) as client:
        sid = (await client.create_or_attach_session({"sessionScope": "thread"})).session_id
        for _ in range(2):
            held = await client.prompt_nonblocking(sid, "/sleep 60s held")   # closed below
            assert isinstance(held, PromptAccepted)
        code, out, err = await run(["more", "--url", srv.url, "--session", sid])
        await client.close_session(sid)
    assert (code, out) == (1, "")
    assert err == (f"acp-server prompt: the prompt queue of session {sid} is full (2/2 "
                   "pending); retry in 5 s\n")   # the server's Retry-After: 5


def test_the_retry_of_a_full_queue_is_the_servers() -> None:
    """``retryAfterMs`` in the body wins over ``Retry-After``; neither: no number made up."""
    from acp_server.client.errors import DaemonPendingPromptLimitError, error_from_answer
    from acp_server.client.prompt_cli import queue_full

    body = b'{"code":"prompt_queue_full","sessionId":"s","limit":2,"pendingCount":2'
    said = {}
    for extra, headers in ((b',"retryAfterMs":2500}', {"retry-after": "5"}),
                           (b'}', {"retry-after": "5"}), (b'}', {}),
                           (b'}', {"retry-after": "Fri, 07 Nov 2025 08:49:37 GMT"})):
        error = error_from_answer(503, body + extra, headers)
        assert isinstance(error, DaemonPendingPromptLimitError)
        said[error.retry_after_s] = queue_full(error)
    assert said == {
        2.5: "the prompt queue of session s is full (2/2 pending); retry in 3 s",
        5.0: "the prompt queue of session s is full (2/2 pending); retry in 5 s",
        None: "the prompt queue of session s is full (2/2 pending); retry once one of its "
              "prompts has ended"}
    local = DaemonPendingPromptLimitError("", 1, 1)   # the SDK's own cap: no server said
    assert queue_full(local) == ("the prompt queue of the session is full (1/1 pending); "
                                 "retry once one of its prompts has ended")
