"""``acp_server.client.cli_run``: what a command-line client does with a failure it did
not turn into its own message (one line, status 1; the traceback only when asked), a
usage error found late (status 2), and a Ctrl-C that surfaces inside a task group."""

from __future__ import annotations

import argparse
import io

import anyio
import httpx
import pytest

from acp_server.client.cli_run import (DEBUG_ENV, EXIT_PIPE, UsageError, checked_text,
                                       run_command)

ARGS = argparse.Namespace()


def _failing(exc: BaseException):
    async def command(args: argparse.Namespace, *, out: io.StringIO, err: io.StringIO) -> int:
        raise exc
    return command


def test_an_unexpected_error_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    err = io.StringIO()
    code = run_command("acp-server x", _failing(RuntimeError("boom\n\x1b[31mred")), ARGS,
                       out=io.StringIO(), err=err)
    assert code == 1
    assert err.getvalue() == "acp-server x: unexpected error: RuntimeError: boom [31mred\n"


def test_the_debug_variable_adds_the_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DEBUG_ENV, "1")
    err = io.StringIO()
    assert run_command("acp-server x", _failing(ValueError("why")), ARGS, out=io.StringIO(),
                       err=err) == 1
    first, *rest = err.getvalue().splitlines()
    assert first == "acp-server x: unexpected error: ValueError: why"
    assert rest[0].startswith("Traceback") and rest[-1] == "ValueError: why"


def test_the_debug_traceback_hides_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """The traceback is for a bug report: an address's userinfo and token are hidden in
    it as in the one line (they were printed whole)."""
    monkeypatch.setenv(DEBUG_ENV, "1")
    err = io.StringIO()
    failure = httpx.ConnectError("cannot reach http://me:hunter2@host:1/?token=s3cret")
    assert run_command("acp-server x", _failing(failure), ARGS, out=io.StringIO(),
                       err=err) == 1
    shown = err.getvalue()
    assert "Traceback" in shown and "http://***@host:1/?token=***" in shown
    assert "hunter2" not in shown and "s3cret" not in shown


def test_a_failure_inside_a_task_group_is_one_line_too() -> None:
    async def command(args: argparse.Namespace, *, out: io.StringIO, err: io.StringIO) -> int:
        async with anyio.create_task_group() as tg:
            async def fail() -> None:
                raise KeyError("k")
            tg.start_soon(fail)
        return 0

    err = io.StringIO()
    assert run_command("acp-server x", command, ARGS, out=io.StringIO(), err=err) == 1
    assert err.getvalue() == "acp-server x: unexpected error: KeyError: 'k'\n"


def test_a_keyboard_interrupt_in_a_group_is_130() -> None:
    group = BaseExceptionGroup("g", [KeyboardInterrupt()])
    assert run_command("acp-server x", _failing(group), ARGS, out=io.StringIO(),
                       err=io.StringIO()) == 130


def test_a_usage_error_is_status_2() -> None:
    err = io.StringIO()
    bad = "\udcff"   # what a byte that is not UTF-8 reads as (surrogateescape)
    with pytest.raises(UsageError) as caught:
        checked_text(bad, "stdin")
    assert run_command("acp-server x", _failing(caught.value), ARGS, out=io.StringIO(),
                       err=err) == 2
    assert err.getvalue() == "acp-server x: the prompt (stdin) is not UTF-8 text\n"
    assert checked_text("ünïcode", "argument") == "ünïcode"


class _ClosedPipe(io.StringIO):
    """An output whose reader has gone: each flush is a broken pipe."""

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_closed_output_ends_quietly_with_141() -> None:
    async def command(args: argparse.Namespace, *, out: io.StringIO, err: io.StringIO) -> int:
        out.write("more than the reader wanted\n")
        return 0   # the flush after the command meets the closed pipe

    err = io.StringIO()
    assert run_command("acp-server x", command, ARGS, out=_ClosedPipe(), err=err) == EXIT_PIPE
    assert err.getvalue() == ""


def test_a_closed_output_met_inside_a_task_group_is_141_too() -> None:
    async def command(args: argparse.Namespace, *, out: io.StringIO, err: io.StringIO) -> int:
        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.sleep_forever)
            out.write("x")
            out.flush()
        return 0

    err = io.StringIO()
    assert run_command("acp-server x", command, ARGS, out=_ClosedPipe(), err=err) == EXIT_PIPE
    assert err.getvalue() == ""
