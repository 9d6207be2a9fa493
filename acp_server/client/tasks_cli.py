"""``acp-server tasks``: create, list, inspect, cancel and watch LMSP async tasks.

    $ acp-server tasks create "Write a report." --model reference
    {"id": "task_01…", "status": "queued", …}
    $ acp-server tasks create "/chunks 4 Write a report." --watch
    task_01…  queued                                   (stderr)
    task_01…  running                                  (stderr)
    Echo: Write a report.                              (stdout, as it streams)
    task_01…  succeeded  3.1s  4 tokens                (stderr, once)
    $ acp-server tasks list --status running
    task_01…  running  reference  12:03:51  —  Write a report.

Contracts: ``create``/``get``/``cancel`` print the task object as JSON on stdout.
``watch`` (and ``create --watch``) follows the task's event stream (resumed after a
drop by ``TaskClient``): the output text goes to stdout as it streams; the status goes
to stderr, one line per change, never backwards (queued, loading, running,
cancelling, then the end), and the final line (status, elapsed time from the server's
clock, output tokens) is printed once. A task still ``queued`` after ``QUEUED_HINT_S``
(5 s) gets one more status line: the server may be at its limit of running tasks or of
sessions (LMSP's ``/capabilities`` does not give their values, so the line names the
flags). ``list`` prints one line per task, newest
first (``--json`` prints the page as JSON). A server that cannot be reached is one
line, ``cannot reach URL: connection refused``; so is every error (``errors.one_line``),
never a traceback. A status or time this CLI cannot read is shown as it came (a status)
or as ``?`` (a time). Exit status: 0 on success (``watch``: the task succeeded), 1 on
an error or a task that failed or was cancelled, 2 on bad usage (a text that is not
UTF-8 included), 130 on Ctrl-C (``cli_run``), 141 when the reader of stdout goes
(``| head -1``: nothing said; a watched task runs on, as on Ctrl-C).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

import anyio
import msgspec

from acp_server.client import DaemonError, TaskClient, TaskEvent
from acp_server.client.arguments import (DEFAULT_URL, URL_ENV, daemon_url, page_size,
                                        positive_seconds)
from acp_server.client.cli_run import (EXIT_ERROR, EXIT_OK, EXIT_USAGE, check_token, prompt_text,
                                       run_command)
from acp_server.client.errors import hint, one_line
from acp_server.client.tasks import ForbiddenError, LmspProblem, Task, TaskSummary

STATUSES = ("queued", "loading", "running", "cancelling", "succeeded", "failed", "cancelled")
# How far along a status is: a watch never shows one lower than what it has shown.
_RANK = {"queued": 0, "loading": 1, "running": 2, "cancelling": 3, "succeeded": 4,
         "failed": 4, "cancelled": 4}
_EVENT_STATUS = {"response.created": "queued", "response.in_progress": "running",
                 "response.completed": "succeeded", "response.incomplete": "succeeded",
                 "response.failed": "failed", "response.cancelled": "cancelled"}


def add_tasks_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=None,
                        help=f"the daemon's address (default ${URL_ENV} or {DEFAULT_URL})")
    common.add_argument("--token", default=None, help="bearer token (default $ACP_SERVER_TOKEN)")
    common.add_argument("--timeout", type=positive_seconds, default=30.0,
                        help="per-request timeout in seconds (default %(default)s)")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = actions.add_parser("create", parents=[common], help="create a task")
    create.add_argument("text", help="the user message ('-' reads it from stdin)")
    create.add_argument("--model", default="reference", help="model name (default %(default)s)")
    create.add_argument("--on-restart", default="fail", choices=["fail", "retry", "resume"],
                        help="if the server restarts while the task runs: fail it "
                             "(server_restarted), retry it (up to 3 attempts), or resume "
                             "(refused: no agent offers it) (default %(default)s)")
    create.add_argument("--idempotency-key", default=None,
                        help="the same key sent again answers the same task instead of a "
                             "second one (default: a new UUID)")
    create.add_argument("--watch", action="store_true",
                        help="then stream its output (stdout) and status (stderr)")
    listing = actions.add_parser("list", parents=[common], help="list your tasks, newest first")
    listing.add_argument("--status", choices=STATUSES, default=None, help="only this status")
    listing.add_argument("--limit", type=page_size, default=20,
                         help="at most this many (1-100, default %(default)s)")
    listing.add_argument("--json", action="store_true", help="print the page as JSON")
    for name, text in (("get", "print a task"), ("cancel", "cancel a task"),
                       ("watch", "follow a task live until it ends")):
        actions.add_parser(name, parents=[common], help=text).add_argument("task_id")
    return parser


def build_parser() -> argparse.ArgumentParser:
    return add_tasks_arguments(argparse.ArgumentParser(
        prog="acp-server tasks", description="LMSP async tasks."))


def _print_task(task: Task, out: TextIO) -> None:
    out.write(json.dumps(msgspec.to_builtins(task), indent=2) + "\n")
    out.flush()


class Watch:
    """What ``watch`` shows: the text on ``out`` as it comes, the status on ``err``."""

    def __init__(self, out: TextIO, err: TextIO, task: Task) -> None:
        self.out, self.err = out, err
        self.task_id = one_line(task.id, 200)
        self.status: str | None = None
        self.rank = -1
        self.tokens = 0
        self.open_line = False
        self.advance(task.status)

    def advance(self, status: str) -> None:
        """Show ``status`` when it is further along than the one shown; the end is
        left to ``finish``. A status this CLI does not know is shown when it differs
        from the one shown, without a rank."""
        rank = _RANK.get(status)
        if rank is None:
            if status != self.status:
                self.status = status
                self._status_line(f"{self.task_id}  {one_line(status, 60)}")
            return
        if rank >= _RANK["succeeded"]:
            return
        if rank > self.rank:
            self.status, self.rank = status, rank
            self._status_line(f"{self.task_id}  {status}")

    def see(self, event: TaskEvent) -> None:
        if event.type == "response.output_text.delta" and event.delta:
            self.tokens += 1
            self.out.write(event.delta)
            self.out.flush()
            self.open_line = not event.delta.endswith("\n")
        status = _EVENT_STATUS.get(event.type)
        if status is not None:
            self.advance(status)

    def finish(self, task: Task) -> None:
        if self.open_line:
            self.out.write("\n")
            self.out.flush()
            self.open_line = False
        usage = (task.response or {}).get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("output_tokens"), int):
            self.tokens = usage["output_tokens"]
        elapsed = max(task.updated_at - task.created_at, 0) if task.created_at else 0
        line = f"{self.task_id}  {one_line(task.status, 60)}  {elapsed:.1f}s  {self.tokens} tokens"
        if task.error:
            line += "  " + one_line(f"{task.error.get('code', '')}: "
                                    f"{task.error.get('detail', '')}", 500)
        self._status_line(line)

    def note(self, text: str) -> None:
        """A line on ``err`` that is no status (a hint)."""
        self._status_line(text)

    def _status_line(self, text: str) -> None:
        if self.open_line:      # the text so far keeps its own line
            self.out.write("\n")
            self.out.flush()
            self.open_line = False
        self.err.write(text + "\n")
        self.err.flush()


# A task still queued this long gets one line saying why it may be (the server's limits
# are not in LMSP's /capabilities, so the line names the flags, not their values).
QUEUED_HINT_S = 5.0


async def _hint_while_queued(shown: Watch) -> None:
    await anyio.sleep(QUEUED_HINT_S)
    if shown.status == "queued":
        shown.note(
            f"{shown.task_id}  still queued after {QUEUED_HINT_S:g} s: the server may be "
            "running as many tasks as it runs at once (--max-running-tasks) or be at its "
            "session limit (--max-sessions); it starts once one of those ends")


async def watch(tasks: TaskClient, task_id: str, out: TextIO, err: TextIO) -> Task:
    task = await tasks.get(task_id)
    shown = Watch(out, err, task)
    failure: Exception | None = None
    final: Task | None = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(_hint_while_queued, shown)
        try:
            final = await _follow(tasks, task_id, shown)
        except Exception as exc:   # raised below, outside the task group (not grouped)
            failure = exc
        tg.cancel_scope.cancel()
    if failure is not None:
        raise failure
    assert final is not None
    shown.finish(final)
    return final


async def _follow(tasks: TaskClient, task_id: str, shown: Watch) -> Task:
    try:   # a task that has already ended replays its events (its text included)
        async with contextlib.aclosing(tasks.events(task_id)) as events:
            async for event in events:
                shown.see(event)
                if event.terminal:
                    break
    except LmspProblem as exc:
        if exc.code != "event_history_expired":
            raise   # past the event retention: the final line still says how it ended
    return await tasks.wait(task_id, poll_interval=0.2)


def _when(seconds: int) -> str:
    """A time the server gave, local; ``?`` for one no calendar has."""
    if not seconds:
        return "—"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))
    except (OverflowError, OSError, ValueError):
        return "?"


def task_line(task: TaskSummary) -> str:
    tokens = str(task.usage.get("total_tokens", "—")) if task.usage else "—"
    text = one_line(task.input_text, 60)
    return f"{one_line(task.id, 200)}  {one_line(task.status, 60):<10}  " \
           f"{one_line(task.model, 100)}  {_when(task.created_at)}  " \
           f"{one_line(tokens, 20):>5}  {text}"


async def tasks_command(args: argparse.Namespace, *, out: TextIO, err: TextIO) -> int:
    url = daemon_url(args.url)
    check_token(args.token)
    try:
        async with TaskClient(url, token=args.token, timeout=args.timeout) as tasks:
            if args.action == "create":
                text = prompt_text(args.text, sys.stdin)
                task = await tasks.create({"model": args.model, "input": text},
                                          on_restart=args.on_restart,
                                          idempotency_key=args.idempotency_key)
                if not args.watch:
                    _print_task(task, out)
                    return EXIT_OK
                final = await watch(tasks, task.id, out, err)
                return EXIT_OK if final.status == "succeeded" else EXIT_ERROR
            if args.action == "watch":
                final = await watch(tasks, args.task_id, out, err)
                return EXIT_OK if final.status == "succeeded" else EXIT_ERROR
            if args.action == "list":
                page = await tasks.list(limit=args.limit, status=args.status)
                if args.json:
                    out.write(json.dumps(msgspec.to_builtins(page), indent=2) + "\n")
                else:
                    for item in page.data:
                        out.write(task_line(item) + "\n")
                    if not page.data:
                        err.write("no tasks\n")
                out.flush()
                return EXIT_OK
            method = tasks.get if args.action == "get" else tasks.cancel
            _print_task(await method(args.task_id), out)
            return EXIT_OK
    except DaemonError as exc:
        status = getattr(exc, "status", 0)
        scope = exc.required_scope if isinstance(exc, ForbiddenError) else None
        print(f"acp-server tasks: {one_line(str(exc))}{hint(status, scope)}", file=err)
        return EXIT_ERROR


def run_tasks_args(args: argparse.Namespace, *, out: TextIO | None = None,
                   err: TextIO | None = None) -> int:
    """Run the command for parsed arguments (its own event loop; Ctrl-C and unexpected
    failures as ``cli_run`` says)."""
    return run_command("acp-server tasks", tasks_command, args, out=out or sys.stdout,
                       err=err or sys.stderr)


def run_tasks(argv: Sequence[str] | None = None, **streams: Any) -> int:
    """``acp-server tasks`` as a function: ``run_tasks(["get", task_id, "--url", url])``."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    return run_tasks_args(args, **streams)


if __name__ == "__main__":
    sys.exit(run_tasks())
