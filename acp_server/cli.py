"""The ``acp-server`` command: its subcommands, each imported only when it runs.

    $ acp-server serve --port 0            # acp_server.serve_cli
    $ acp-server connect http://host:4170  # acp_server.connect.cli (an editor's agent)
    $ acp-server --help                    # imports no subcommand at all

Contracts:

* ``main(argv)`` imports the module of the one subcommand named on the command line
  and no other: ``acp-server connect``, which an editor starts for each agent it
  runs, and ``acp-server token`` do not pay for the server's imports (the app, the
  stores, granian), nor ``--help`` for any. The first argument that is not an option
  names the subcommand (the top level has no option that takes a value).
* ``build_parser()`` builds every subcommand's flags (importing every module), for the
  docs and the tests that read them; ``main`` parses with a parser built for the one
  subcommand, so each subcommand's usage, help and errors are the same either way.
* A subcommand's module gives an ``add_*`` function (its flags, on its sub-parser)
  and a ``run_*`` function (its parsed flags to the exit status).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import NamedTuple

from acp_server import __version__


class Command(NamedTuple):
    """A subcommand: its help line and where its flags and its run are."""

    help: str
    module: str
    add: str
    run: str


COMMANDS: dict[str, Command] = {
    "serve": Command("serve the HTTP API (REST + SSE, /acp)",
                     "acp_server.serve_cli", "add_serve_arguments", "run_serve_args"),
    "prompt": Command("send a prompt to a running daemon and stream the reply",
                      "acp_server.client.prompt_cli", "add_prompt_arguments", "run_prompt_args"),
    "tasks": Command("create, get, cancel or watch LMSP async tasks",
                     "acp_server.client.tasks_cli", "add_tasks_arguments", "run_tasks_args"),
    "connect": Command("be an editor's ACP agent on stdio, relayed to a server's /acp",
                       "acp_server.connect.cli", "add_connect_arguments", "run_connect_args"),
    "token": Command("create, list or revoke stored bearer tokens (principals)",
                     "acp_server.ops.principals_cli", "add_token_arguments",
                     "run_principals_args"),
    "audit": Command("read the audit log (who did what)",
                     "acp_server.ops.principals_cli", "add_audit_arguments",
                     "run_principals_args"),
    "conformance": Command("check a server (ours or another) against the backpressure, "
                           "ACP-over-HTTP and LMSP suites",
                           "acp_server.conformance.cli", "add_conformance_arguments",
                           "run_conformance_args"),
}


def _function(command: Command, name: str) -> Callable[..., object]:
    function: Callable[..., object] = getattr(importlib.import_module(command.module), name)
    return function


def build_parser(only: str | None = None,
                 ) -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The top-level parser and its ``serve`` sub-parser; every subcommand's flags, or
    ``only``'s (the others then have their help line and no flags: nothing imported)."""
    parser = argparse.ArgumentParser(
        prog="acp-server", description="An HTTP daemon serving ACP coding agents "
        "(compatible with `qwen serve`).")
    parser.add_argument("--version", action="version", version=f"acp-server {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    subs = {name: commands.add_parser(name, help=command.help)
            for name, command in COMMANDS.items()}
    for name, command in COMMANDS.items():
        if only is None or name == only:
            _function(command, command.add)(subs[name])
    return parser, subs["serve"]


def named_command(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` names: its first argument that is not an option, when
    that is one (else argparse says what is wrong, with nothing imported)."""
    for arg in argv:
        if not arg.startswith("-"):
            return arg if arg in COMMANDS else None
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # No known command named: "" builds no subcommand's flags, and argparse says the
    # command is missing or unknown.
    parser, _ = build_parser(only=named_command(argv) or "")
    args = parser.parse_args(argv)
    command = COMMANDS[args.command]
    status = _function(command, command.run)(args)
    assert isinstance(status, int)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
