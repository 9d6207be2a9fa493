"""``acp-server conformance URL``: check any server against the three suites.

    $ acp-server conformance http://127.0.0.1:4170 --json report.json --junit report.xml
    $ acp-server conformance http://127.0.0.1:4170 --suite backpressure \\
          --hold-prompt "SLOW story please"

Contracts: exit 0 when checks ran and no MUST check failed, 1 when one failed; 2 when
the run could not check the target: bad usage, a target that answers nothing or
refuses the credentials, advertises no suite (a plain web server, the ``/acp``
endpoint given for the base URL: the line says which URL to try), rate-limits the
runner (a 429 of the rate limit: the run stops, no check is blamed; the line names
``--unlimited``), or a run whose every check was skipped. One line on stderr says why
(``cannot reach URL: connection refused``; the address without its credentials:
``errors.redact``); a run stopped before it began shows no table and writes no
report. Without ``--suite`` every suite the target advertises runs. The results go to
stdout (``display``: a live table in a terminal, one line per check otherwise);
``--json`` / ``--junit`` write the reports. The reader of stdout going (``| head -3``)
stops the run quietly with status 141 (as ``acp-server tasks``: ``cli_run``), no
report written.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO, cast
from urllib.parse import urlsplit

import anyio
from rich.console import Console

from acp_server.client.cli_run import EXIT_PIPE, GuardedOutput, reader_gone
from acp_server.client.errors import one_line, redact, redact_address
from acp_server.conformance.catalog import SUITES
from acp_server.conformance.context import Options, RunStopped
from acp_server.conformance.display import display_for
from acp_server.conformance.report import EXIT_USAGE, Report
from acp_server.conformance.runner import run_conformance

TOKEN_ENV = "ACP_SERVER_TOKEN"


def _positive(value: str) -> float:
    number = float(value)
    if not number > 0:
        raise argparse.ArgumentTypeError(f"must be > 0: {value}")
    return number


def _count(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1: {value}")
    return number


def base_url(text: str) -> str:
    """An http(s) URL with a host, else argparse's usage error (exit 2, before any run)."""
    try:
        parts = urlsplit(text)
        host = parts.hostname
    except ValueError:   # http://[::1
        host = None
    if not host or parts.scheme not in ("http", "https"):
        raise argparse.ArgumentTypeError(f"not an http(s) URL: {redact_address(text)!r} "
                                         "(e.g. http://127.0.0.1:4170)")
    return text


def add_conformance_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("url", type=base_url,
                        help="the server's base URL, e.g. http://127.0.0.1:4170 (not its /acp "
                             "endpoint)")
    parser.add_argument("--suite", action="append", choices=SUITES, default=None,
                        help="run this suite (repeatable; default: what the target advertises)")
    parser.add_argument("--token", default=None, help=f"bearer token (default ${TOKEN_ENV})")
    parser.add_argument("--hold-prompt", default=None, metavar="TEXT",
                        help="a prompt that stays pending >= 5 s on the target's agent "
                             "(default on our reference agent: '/sleep 5s …')")
    parser.add_argument("--fail-prompt", default=None, metavar="TEXT",
                        help="a prompt that ends in turn_error (default on our reference "
                             "agent: '/fail …')")
    parser.add_argument("--quick-prompt", default=Options.quick_prompt, metavar="TEXT",
                        help="a prompt that completes quickly (default %(default)r)")
    parser.add_argument("--model", default=None,
                        help="LMSP model (default: the first in /lmsp/v1/capabilities)")
    parser.add_argument("--timeout", type=_positive, default=Options.timeout_s,
                        help="seconds for one request or one awaited frame (default %(default)s)")
    parser.add_argument("--settle-timeout", type=_positive, default=Options.settle_timeout_s,
                        help="seconds for a prompt or task to end by itself (default %(default)s)")
    parser.add_argument("--max-fill", type=_count, default=Options.max_fill,
                        help="the largest queue limit filled (default %(default)s)")
    parser.add_argument("--saturate-tasks", type=_count, default=Options.saturate_tasks,
                        help="tasks created to observe a queued one (default %(default)s)")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE",
                        help="write the JSON report here")
    parser.add_argument("--junit", type=Path, default=None, metavar="FILE",
                        help="write a JUnit XML report here")
    return parser


def options_from_args(args: argparse.Namespace) -> Options:
    return Options(token=args.token or os.environ.get(TOKEN_ENV) or None,
                   hold_prompt=args.hold_prompt, fail_prompt=args.fail_prompt,
                   quick_prompt=args.quick_prompt, model=args.model, timeout_s=args.timeout,
                   settle_timeout_s=args.settle_timeout, max_fill=args.max_fill,
                   saturate_tasks=args.saturate_tasks)


def run_conformance_args(args: argparse.Namespace, console: Console | None = None) -> int:
    console = console or Console(file=cast(TextIO, GuardedOutput(sys.stdout)))
    display = display_for(console, f"conformance: {redact(args.url)}")

    async def run() -> Report:
        with display:
            return await run_conformance(args.url, options=options_from_args(args),
                                         suites=args.suite, on_result=display.add,
                                         on_plan=display.plan)

    try:
        report = anyio.run(run)
        display.print_summary(report)
    except RunStopped as exc:
        print(f"acp-server conformance: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except BaseException as exc:   # the reader of stdout has gone (`| head`): 141, quietly
        if reader_gone(exc):
            return EXIT_PIPE
        raise
    if args.json is not None:
        args.json.write_bytes(report.json_bytes())
    if args.junit is not None:
        args.junit.write_bytes(report.junit_bytes())
    if not report.checked:
        print(f"acp-server conformance: nothing checked at {redact(args.url)}: every check "
              "was skipped (each says why)", file=sys.stderr)
    return report.exit_status()


def main(argv: Sequence[str] | None = None) -> int:
    parser = add_conformance_arguments(argparse.ArgumentParser(prog="acp-server conformance"))
    return run_conformance_args(parser.parse_args(argv))
