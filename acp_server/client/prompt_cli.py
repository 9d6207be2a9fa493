"""``acp-server prompt``: send one prompt to a running daemon, stream the reply.

    $ acp-server prompt "hello" --url http://127.0.0.1:4170
    Echo: hello
    $ acp-server prompt "/fail boom" ; echo $?
    acp-server prompt: Reference agent failure (/fail) (-32603)
    1

Contracts: the agent's ``agent_message_chunk`` text is written to stdout as each event
arrives (flushed); diagnostics go to stderr. A permission the agent asks is put to the
person when stdin and stderr are a terminal; otherwise ``--permissions`` answers it
(``reject`` by default), saying so on stderr (``permissions_cli``). A server that
cannot be reached is one line, ``cannot reach URL: connection refused``. Without ``--session`` the workspace's
default session is attached (``--thread``: a fresh one; with ``--session`` a usage
error). Exit status: 0 when the turn
completed (a stop reason other than ``end_turn`` is noted on stderr), 1 on any error
(turn_error, HTTP error, connection failure, full queue, a server that broke the
protocol or did not answer within ``--timeout``), 2 on bad usage (a prompt that is not
UTF-8 text included), 130 on Ctrl-C (``cli_run``: the prompt is cancelled on the
server; a second Ctrl-C does not wait for that), 141 when the reader of stdout goes
(``| head -c 10``: the prompt is cancelled on the server as on Ctrl-C, nothing said).
Every error is one line on stderr (``errors.one_line``: a server's text cannot drive
the terminal, an address's credentials are not shown), never a traceback; a full queue
says whose, how full and when to retry (``queue_full``: the prompt queue of session S is
full (2/2 pending); retry in 5 s).
``--token`` defaults to ``$ACP_SERVER_TOKEN``; ``--url`` to ``$ACP_SERVER_URL`` or
``http://127.0.0.1:4170``.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import anyio
import httpx

from acp_server.client import (CreateSessionRequest, DaemonClient, DaemonError, DaemonEvent,
                               DaemonHttpError, DaemonPendingPromptLimitError)
from acp_server.client.arguments import DEFAULT_URL, URL_ENV, daemon_url, positive_seconds
from acp_server.client.cli_run import (EXIT_ERROR, EXIT_OK, EXIT_PIPE, EXIT_USAGE,
                                       OutputClosed, check_token, prompt_text, run_command)
from acp_server.client.errors import DaemonForbiddenError, hint, one_line
from acp_server.client.permissions_cli import POLICIES, PermissionAnswerer, TerminalAsker


def add_prompt_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("text", help="the prompt text ('-' reads it from stdin)")
    parser.add_argument("--url", default=None,
                        help=f"the daemon's address (default ${URL_ENV} or {DEFAULT_URL})")
    which = parser.add_mutually_exclusive_group()   # both: --thread was silently ignored
    which.add_argument("--session", default=None, metavar="ID",
                       help="prompt this session (default: attach the workspace's session)")
    which.add_argument("--thread", action="store_true",
                       help="create a fresh session instead of attaching the default one")
    parser.add_argument("--agent", default=None, metavar="NAME",
                        help="the agent profile for a new or attached session")
    parser.add_argument("--token", default=None, help="bearer token (default $ACP_SERVER_TOKEN)")
    parser.add_argument("--timeout", type=positive_seconds, default=30.0,
                        help="per-request timeout in seconds (default %(default)s)")
    parser.add_argument("--permissions", choices=POLICIES, default="reject",
                        help="how to answer the agent's permission requests when not in a "
                             "terminal (in one, you are asked) (default %(default)s)")
    return parser


def build_parser() -> argparse.ArgumentParser:
    return add_prompt_arguments(argparse.ArgumentParser(
        prog="acp-server prompt", description="Send a prompt and stream the agent's reply."))


def chunk_text(event: DaemonEvent) -> str | None:
    """The text of an ``agent_message_chunk`` event, else ``None``."""
    if event.type != "session_update" or not isinstance(event.data, dict):
        return None
    update = event.data.get("update")
    if not isinstance(update, dict) or update.get("sessionUpdate") != "agent_message_chunk":
        return None
    content = update.get("content")
    if isinstance(content, dict) and content.get("type") == "text":
        text = content.get("text")
        return text if isinstance(text, str) else None
    return None


class _Printer:
    """Writes reply chunks as they come; remembers whether a newline is owed, and
    whether the reader has gone (``closed``: nothing is written after that)."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.open_line = False
        self.closed = False

    def __call__(self, event: DaemonEvent) -> None:
        """Write the event's text; ``OutputClosed`` when the reader has gone."""
        text = chunk_text(event)
        if text and not self.closed:
            self._write(text)
            self.open_line = not text.endswith("\n")

    def finish(self) -> None:
        if self.open_line and not self.closed:
            self.open_line = False
            with contextlib.suppress(OutputClosed):
                self._write("\n")

    def _write(self, text: str) -> None:
        try:
            self.out.write(text)
            self.out.flush()
        except OutputClosed:
            self.closed = True
            raise


def queue_full(exc: DaemonPendingPromptLimitError) -> str:
    """What a full prompt queue is said to be: whose, how full, and when to try again
    (the server's ``retryAfterMs`` or ``Retry-After`` when it gave one)."""
    whose = f"session {one_line(exc.session_id, 80)}" if exc.session_id else "the session"
    wait = exc.retry_after_s
    when = (f"retry in {math.ceil(wait)} s" if wait is not None and math.isfinite(wait)
            else "retry once one of its prompts has ended")
    return f"the prompt queue of {whose} is full ({exc.pending_count}/{exc.limit} " \
           f"pending); {when}"


def _terminal(args: argparse.Namespace, source: TextIO, err: TextIO) -> bool:
    """Whether a person can be asked: stdin (not the prompt's text) and stderr are ttys."""
    return args.text != "-" and source.isatty() and err.isatty()


async def prompt_command(args: argparse.Namespace, *, out: TextIO, err: TextIO,
                         transport: httpx.AsyncBaseTransport | None = None,
                         source: TextIO | None = None) -> int:
    """The command's body (async: usable from a running event loop). ``source`` is
    where a person's answers are read (default stdin)."""
    source = source or sys.stdin
    check_token(args.token)   # before the prompt is read
    text = prompt_text(args.text, source)
    url = daemon_url(args.url)
    printer = _Printer(out)
    ask = TerminalAsker(source, err) if _terminal(args, source, err) else None
    try:
        async with DaemonClient(url, token=args.token, timeout=args.timeout,
                                transport=transport) as client:
            session_id = args.session
            if session_id is None:
                req = CreateSessionRequest(session_scope="thread" if args.thread else None,
                                           agent=args.agent)
                session_id = (await client.create_or_attach_session(req)).session_id
            answerer = PermissionAnswerer(client, session_id, err=err,
                                          policy=getattr(args, "permissions", "reject"), ask=ask)
            async with anyio.create_task_group() as tg:
                def on_event(event: DaemonEvent) -> None:
                    try:
                        printer(event)
                    except OutputClosed:   # the reader has gone: stop, as on Ctrl-C (the
                        tg.cancel_scope.cancel()   # prompt is cancelled on the server)
                        return
                    if event.type in ("permission_request", "permission_resolved"):
                        if event.type == "permission_request":
                            printer.finish()
                        answerer.see(event, tg)

                failure: DaemonError | None = None
                try:
                    result = await client.prompt(session_id, text, on_event=on_event)
                except DaemonError as exc:   # raised below, outside the task group
                    failure = exc
                tg.cancel_scope.cancel()   # a question still open is moot now
            if failure is not None:
                raise failure
    except DaemonHttpError as exc:
        printer.finish()
        detail = f" ({exc.code})" if exc.code else ""
        scope = exc.required_scope if isinstance(exc, DaemonForbiddenError) else None
        print(f"acp-server prompt: {one_line(exc.message + detail)}{hint(exc.status, scope)}",
              file=err)
        return EXIT_ERROR
    except DaemonPendingPromptLimitError as exc:
        printer.finish()
        print(f"acp-server prompt: {queue_full(exc)}", file=err)
        return EXIT_ERROR
    except DaemonError as exc:
        printer.finish()
        print(f"acp-server prompt: {one_line(str(exc))}", file=err)
        return EXIT_ERROR
    printer.finish()
    if printer.closed:
        return EXIT_PIPE   # quietly: the reader had enough
    if result.stop_reason != "end_turn":
        print(f"acp-server prompt: stop reason {result.stop_reason}", file=err)
    return EXIT_OK


def run_prompt_args(args: argparse.Namespace, *, out: TextIO | None = None,
                    err: TextIO | None = None) -> int:
    """Run the command for parsed arguments (starts its own event loop; Ctrl-C and
    unexpected failures as ``cli_run`` says)."""
    return run_command("acp-server prompt", prompt_command, args, out=out or sys.stdout,
                       err=err or sys.stderr)


def run_prompt(argv: Sequence[str] | None = None, **streams: Any) -> int:
    """``acp-server prompt`` as a function: ``run_prompt(["hello", "--url", url])``."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:   # argparse: --help (0) or bad usage (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    return run_prompt_args(args, **streams)


if __name__ == "__main__":
    sys.exit(run_prompt())
