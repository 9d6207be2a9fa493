"""How the command-line clients (``acp-server prompt``, ``acp-server tasks``) run: Ctrl-C,
and every failure as one line on stderr.

    def run_tasks_args(args: argparse.Namespace) -> int:
        return run_command("acp-server tasks", tasks_command, args, out=sys.stdout,
                           err=sys.stderr)

Contracts:

* ``run_command(prog, command, args, out=, err=)`` runs ``await command(args, out=out,
  err=err)`` in its own event loop and returns its exit status.
* The first Ctrl-C (SIGINT) cancels the command (``acp-server prompt`` then cancels its
  prompt on the server, for at most ``daemon.CANCEL_GRACE_S``) and the status is 130
  (``EXIT_INTERRUPTED``); a second Ctrl-C exits 130 at once, its output flushed, without
  waiting for the server. A Ctrl-C before the loop runs is 130 too.
* The reader of stdout going (``acp-server prompt … | head -c 10``) ends the command
  quietly, nothing on stderr, status 141 (``EXIT_PIPE``: 128 + SIGPIPE, what a shell
  shows for ``git log | head``): the command's ``out`` is a ``GuardedOutput``, whose
  write or flush then raises ``OutputClosed`` (``prompt`` catches it to cancel its
  prompt on the server first, as on Ctrl-C). ``out`` is flushed when the command
  returns, so output still buffered meets the closed pipe there, not at exit.
  ``printed(show, out)`` gives a command that prints its answer outside ``run_command``
  (``acp-server token``, ``acp-server audit``) the same ending: ``show`` writes to a
  ``GuardedOutput``, flushed; ``EXIT_OK``, or ``EXIT_PIPE`` when the reader has gone.
  ``reader_gone(exc)`` tells that ending apart in what another command's run raised
  (``acp-server conformance``, whose console writes to a ``GuardedOutput``).
* An exception the command did not turn into its own message (a bug) is one line,
  ``PROG: unexpected error: TYPE: message`` (``errors.one_line``), status 1; with
  ``ACP_SERVER_DEBUG=1`` in the environment its traceback follows (``errors.redact``:
  an address's credentials hidden there too, so it can go into a bug report).
* ``checked_text`` (``prompt_text``: an argument, or stdin for ``-``) refuses a prompt
  that is not text (bytes that are not UTF-8, read
  from stdin or given as an argument): ``UsageError`` (the commands say so in a line,
  status 2). So is an address httpx cannot parse (``--url http://[::1``), and a token
  no header can carry (``check_token``, ``acp_server.bearer``: a control character, CR
  LF, non-ASCII), said without the token.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
import traceback
from collections.abc import Awaitable, Callable
from typing import TextIO, cast

import anyio
import anyio.abc
import httpx

from acp_server.bearer import UnsendableTokenError, bearer_token
from acp_server.client.arguments import URL_ENV
from acp_server.client.daemon import TOKEN_ENV
from acp_server.client.errors import one_line, redact

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
EXIT_PIPE = 141   # 128 + SIGPIPE: what a shell shows for `git log | head` (under pipefail)
DEBUG_ENV = "ACP_SERVER_DEBUG"

Command = Callable[..., Awaitable[int]]


class UsageError(Exception):
    """Bad input found once the command runs (exit status 2)."""


class OutputClosed(Exception):
    """The reader of the command's output has gone (``| head`` had enough)."""


class GuardedOutput:
    """The command's output: a write or flush that finds the reader gone (a broken
    pipe) raises ``OutputClosed``, and so does every write after it; the stream's file
    is pointed at ``/dev/null`` then, so what is still buffered is dropped quietly at
    exit (Python would print "Exception ignored … BrokenPipeError")."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.gone = False

    def write(self, text: str) -> int:
        if self.gone:
            raise OutputClosed
        try:
            return self.stream.write(text)
        except BrokenPipeError:
            self._went()
            raise OutputClosed from None

    def flush(self) -> None:
        if self.gone:
            return
        try:
            self.stream.flush()
        except BrokenPipeError:
            self._went()
            raise OutputClosed from None

    def __getattr__(self, name: str) -> object:   # isatty, encoding, …: the stream's
        return getattr(self.stream, name)

    def _went(self) -> None:
        self.gone = True
        try:
            fd = self.stream.fileno()
        except (OSError, ValueError, AttributeError):
            return   # not a file (a StringIO): nothing buffered for exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, fd)
        finally:
            os.close(devnull)


def printed(show: Callable[[TextIO], object], out: TextIO) -> int:
    """``show(out)`` guarded and flushed: ``EXIT_OK``, or ``EXIT_PIPE`` (nothing said)
    when the reader of ``out`` has gone (module contract)."""
    guarded = GuardedOutput(out)
    try:
        show(cast(TextIO, guarded))
        guarded.flush()
    except OutputClosed:
        return EXIT_PIPE
    return EXIT_OK


def prompt_text(argument: str, stdin: TextIO) -> str:
    """The text a command was given: ``argument``, or all of ``stdin`` when it is
    ``-``; ``checked_text`` either way."""
    if argument == "-":
        return checked_text(stdin.read(), "stdin")
    return checked_text(argument, "argument")


def checked_text(text: str, where: str) -> str:
    """``text`` when it can be sent (UTF-8 text), else ``UsageError`` naming ``where``."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(f"the prompt ({where}) is not UTF-8 text") from None
    return text


def check_token(token: str | None) -> None:
    """A token (``--token``, else ``$ACP_SERVER_TOKEN``) no header can carry:
    ``UnsendableTokenError`` before the command reads or sends anything (exit 2, the
    token not shown; the clients' constructors check it the same way)."""
    bearer_token(token) or bearer_token(os.environ.get(TOKEN_ENV))


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def reader_gone(exc: BaseException) -> bool:
    """``exc`` is (or holds, within exception groups) the reader of the output going:
    ``OutputClosed`` or a ``BrokenPipeError``."""
    return any(isinstance(leaf, (OutputClosed, BrokenPipeError)) for leaf in _leaves(exc))


def _flush(*streams: TextIO) -> None:
    for stream in streams:
        try:
            stream.flush()
        except (OSError, ValueError, OutputClosed):
            pass


async def _main(command: Command, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    interrupted = False
    scope = anyio.CancelScope()

    async def on_sigint(*, task_status: anyio.abc.TaskStatus[None]) -> None:
        nonlocal interrupted
        with anyio.open_signal_receiver(signal.SIGINT) as signals:
            task_status.started()
            async for _ in signals:
                if interrupted:   # the second Ctrl-C: stop waiting for the server
                    _flush(out, err)
                    os._exit(EXIT_INTERRUPTED)
                interrupted = True
                scope.cancel()

    async with anyio.create_task_group() as tg:
        if threading.current_thread() is threading.main_thread():
            await tg.start(on_sigint)
        code = EXIT_INTERRUPTED
        with scope:
            code = await command(args, out=out, err=err)
            out.flush()   # what is still buffered meets a closed pipe here, not at exit
        tg.cancel_scope.cancel()
    return EXIT_INTERRUPTED if interrupted else code


def run_command(prog: str, command: Command, args: argparse.Namespace, *, out: TextIO,
                err: TextIO) -> int:
    """Run ``command`` (module contract); its exit status."""
    guarded = GuardedOutput(out)
    try:
        return anyio.run(_main, command, args, cast(TextIO, guarded), err)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BaseException as exc:   # noqa: BLE001 - the one place a CLI's failure is shown
        leaves = _leaves(exc)
        if any(isinstance(leaf, KeyboardInterrupt) for leaf in leaves):
            return EXIT_INTERRUPTED
        if reader_gone(exc):
            return EXIT_PIPE   # the reader has gone: nothing to say, no one to say it to
        if any(not isinstance(leaf, Exception) for leaf in leaves):
            raise   # SystemExit and the like: not a failure of the command
        return _report(prog, leaves[0], exc if len(leaves) > 1 else leaves[0], err)


def _report(prog: str, leaf: BaseException, whole: BaseException, err: TextIO) -> int:
    if isinstance(leaf, (UsageError, UnsendableTokenError)):   # the latter never shows it
        print(f"{prog}: {one_line(str(leaf))}", file=err)
        return EXIT_USAGE
    if isinstance(leaf, httpx.InvalidURL):
        print(f"{prog}: the daemon's address (--url or ${URL_ENV}) is not a URL: "
              f"{one_line(str(leaf), 200)}", file=err)
        return EXIT_USAGE
    print(f"{prog}: unexpected error: {type(leaf).__name__}: {one_line(str(leaf), 300)}",
          file=err)
    if os.environ.get(DEBUG_ENV, "").strip() not in ("", "0"):
        err.write(redact("".join(traceback.format_exception(whole))))   # no credentials
    _flush(err)
    return EXIT_ERROR


__all__ = ["DEBUG_ENV", "EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_PIPE",
           "EXIT_USAGE", "GuardedOutput", "OutputClosed", "UsageError", "check_token",
           "checked_text", "printed", "prompt_text", "reader_gone", "run_command"]
