"""``acp-server tasks``: create, inspect, cancel and watch LMSP async tasks.

    $ acp-server tasks create "Write a report." --model reference
    {"id": "task_01…", "status": "queued", …}
    $ acp-server tasks watch task_01…
    task_01…  running  2.4s  118 tokens          (one live line, redrawn in place)
    task_01…  succeeded  3.1s  164 tokens

Contracts: ``create``/``get``/``cancel`` print the task object as JSON on stdout.
``watch`` follows the task's event stream (resumed after a drop by ``TaskClient``) and
keeps one status line up to date: redrawn in place on a terminal (at most
``REDRAW_HZ`` times a second), one line per status change otherwise. Tokens so far
are the text deltas seen (one per chunk) until the final ``usage.output_tokens``.
Exit status: 0 on success (``watch``: the task succeeded), 1 on an error or a task
that failed or was cancelled, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

import anyio
import msgspec
from rich.console import Console
from rich.live import Live
from rich.text import Text

from acp_server.client import DaemonError, TaskClient, TaskEvent
from acp_server.client.tasks import Task

URL_ENV = "ACP_SERVER_URL"
DEFAULT_URL = "http://127.0.0.1:4170"
EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
REDRAW_HZ = 10
_EVENT_STATUS = {"response.created": "queued", "response.in_progress": "running",
                 "response.completed": "succeeded", "response.incomplete": "succeeded",
                 "response.failed": "failed", "response.cancelled": "cancelled"}


def add_tasks_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=None,
                        help=f"the daemon's address (default ${URL_ENV} or {DEFAULT_URL})")
    common.add_argument("--token", default=None, help="bearer token (default $ACP_SERVER_TOKEN)")
    common.add_argument("--timeout", type=float, default=30.0,
                        help="per-request timeout in seconds (default %(default)s)")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = actions.add_parser("create", parents=[common], help="create a task")
    create.add_argument("text", help="the user message ('-' reads it from stdin)")
    create.add_argument("--model", default="reference", help="model name (default %(default)s)")
    create.add_argument("--on-restart", default="fail", choices=["fail", "retry", "resume"])
    create.add_argument("--idempotency-key", default=None, help="default: a new UUID")
    create.add_argument("--watch", action="store_true", help="then watch it")
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


class LiveLine:
    """One status line: redrawn in place on a terminal (a rich ``Live``), else printed
    on each change of status."""

    def __init__(self, out: TextIO, task: Task) -> None:
        self.out = out
        self.tty = out.isatty()
        self._live = Live(Text(""), console=Console(file=out), auto_refresh=False,
                          transient=False) if self.tty else None
        self.task_id = task.id
        self.status = task.status
        self.created_at = task.created_at
        self.tokens = 0
        self._last_draw = 0.0
        self._last_printed: str | None = None

    def elapsed(self) -> float:
        return max(time.time() - self.created_at, 0.0) if self.created_at else 0.0

    def render(self, elapsed: float | None = None) -> str:
        seconds = self.elapsed() if elapsed is None else elapsed
        return f"{self.task_id}  {self.status}  {seconds:.1f}s  {self.tokens} tokens"

    def see(self, event: TaskEvent) -> None:
        if event.type == "response.output_text.delta":
            self.tokens += 1
        status = _EVENT_STATUS.get(event.type)
        changed = status is not None and status != self.status
        if status is not None:
            self.status = status
        if event.terminal and event.response:
            usage = event.response.get("usage")
            if isinstance(usage, dict) and isinstance(usage.get("output_tokens"), int):
                self.tokens = usage["output_tokens"]
        self.draw(force=changed)

    def draw(self, *, force: bool = False) -> None:
        if self._live is not None:
            now = time.monotonic()
            if force or now - self._last_draw >= 1 / REDRAW_HZ:
                self._last_draw = now
                if not self._live.is_started:
                    self._live.start()
                self._live.update(Text(self.render()), refresh=True)
        elif force and self.status != self._last_printed:
            self._last_printed = self.status
            self.out.write(self.render() + "\n")
            self.out.flush()

    def finish(self, task: Task) -> None:
        self.status = task.status
        elapsed = float(task.updated_at - task.created_at) if task.created_at else None
        if task.response and isinstance(task.response.get("usage"), dict):
            self.tokens = task.response["usage"].get("output_tokens", self.tokens)
        line = self.render(elapsed)
        if self._live is not None:
            if not self._live.is_started:
                self._live.start()
            self._live.update(Text(line), refresh=True)
            self._live.stop()
        else:
            self.out.write(line + "\n")
            self.out.flush()


async def watch(tasks: TaskClient, task_id: str, out: TextIO) -> Task:
    task = await tasks.get(task_id)
    line = LiveLine(out, task)
    line.draw(force=True)
    if not task.terminal:
        async with anyio.create_task_group() as tg:
            async def tick() -> None:  # keep the elapsed time moving between events
                while True:
                    await anyio.sleep(1 / REDRAW_HZ)
                    line.draw()

            if line.tty:
                tg.start_soon(tick)
            async with contextlib.aclosing(tasks.events(task_id)) as events:
                async for event in events:
                    line.see(event)
                    if event.terminal:
                        break
            tg.cancel_scope.cancel()
    final = await tasks.wait(task_id, poll_interval=0.2)
    line.finish(final)
    return final


async def tasks_command(args: argparse.Namespace, *, out: TextIO, err: TextIO) -> int:
    url = args.url or os.environ.get(URL_ENV) or DEFAULT_URL
    try:
        async with TaskClient(url, token=args.token, timeout=args.timeout) as tasks:
            if args.action == "create":
                text = sys.stdin.read() if args.text == "-" else args.text
                task = await tasks.create({"model": args.model, "input": text},
                                          on_restart=args.on_restart,
                                          idempotency_key=args.idempotency_key)
                if not args.watch:
                    _print_task(task, out)
                    return EXIT_OK
                return EXIT_OK if (await watch(tasks, task.id, out)).status == "succeeded" \
                    else EXIT_ERROR
            if args.action == "watch":
                final = await watch(tasks, args.task_id, out)
                return EXIT_OK if final.status == "succeeded" else EXIT_ERROR
            method = tasks.get if args.action == "get" else tasks.cancel
            _print_task(await method(args.task_id), out)
            return EXIT_OK
    except DaemonError as exc:
        print(f"acp-server tasks: {exc}", file=err)
        return EXIT_ERROR


def run_tasks_args(args: argparse.Namespace, *, out: TextIO | None = None,
                   err: TextIO | None = None) -> int:
    try:
        return anyio.run(_run, args, out or sys.stdout, err or sys.stderr)
    except KeyboardInterrupt:
        return 130


async def _run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    return await tasks_command(args, out=out, err=err)


def run_tasks(argv: Sequence[str] | None = None, **streams: Any) -> int:
    """``acp-server tasks`` as a function: ``run_tasks(["get", task_id, "--url", url])``."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    return run_tasks_args(args, **streams)


if __name__ == "__main__":
    sys.exit(run_tasks())
