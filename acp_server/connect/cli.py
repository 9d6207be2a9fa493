"""``acp-server connect``: the command line of the stdio adapter.

    $ acp-server connect http://127.0.0.1:4170/acp --agent claude --give-up-after 10m

Contracts: the URL is the server's ``/acp`` endpoint (a bare ``http://host:port`` gets
``/acp`` appended). ``--token`` defaults to ``$ACP_SERVER_TOKEN``; it is never
printed. Exit status: 0 when the editor closed stdin, 1 after giving up on the
server, 2 on bad usage, 128 + N after signal N (SIGTERM, SIGHUP, SIGINT: handled as
a closed stdin: the editor's turns are cancelled and the connection closed). stdout carries only protocol; diagnostics go to stderr.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import re
import signal
import sys
from collections.abc import Sequence
from urllib.parse import urlsplit

import anyio

from acp_server.bearer import BLANKS, unsendable
from acp_server.connect.link import Target
from acp_server.connect.relay import Relay
from acp_server.connect.stdio import (
    EditorWriter,
    LineReader,
    restore_blocking,
    stdin_reader,
    stdout_writer,
)

TOKEN_ENV = "ACP_SERVER_TOKEN"
SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
DEFAULT_MAX_LINE = 32 << 20
MIN_MAX_LINE = 1024   # below it even a bare ``initialize`` would hardly fit
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def duration(text: str) -> float:
    """``500ms``, ``30s``, ``10m``, ``1h`` or plain seconds."""
    match = _DURATION.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 30s, 10m, 1h)")
    return float(match[1]) * _UNITS[match[2]]


def line_bytes(text: str) -> int:
    """``--max-line-bytes``: an integer of at least ``MIN_MAX_LINE`` (a smaller cap
    would refuse every message, ``initialize`` included)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of bytes: {text!r}") from None
    if value < MIN_MAX_LINE:
        raise argparse.ArgumentTypeError(f"at least {MIN_MAX_LINE} bytes: {text!r}")
    return value


def endpoint(text: str) -> str:
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"not an http(s) URL: {text!r}")
    return text if parts.path not in ("", "/") else text.rstrip("/") + "/acp"


def add_connect_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("url", type=endpoint,
                        help="the server's /acp endpoint, e.g. http://127.0.0.1:4170/acp")
    parser.add_argument("--token", default=None, help=f"bearer token (default ${TOKEN_ENV})")
    parser.add_argument("--agent", default=None, metavar="NAME",
                        help="the server's agent profile for the sessions this creates")
    parser.add_argument("--give-up-after", type=duration, default=600.0, metavar="DURATION",
                        help="fail pending requests and exit 1 when the server stays "
                             "unreachable this long (default 10m)")
    parser.add_argument("--transport", choices=("auto", "websocket", "http", "http1"),
                        default="auto",
                        help="auto: WebSocket, else Streamable HTTP; http: Streamable HTTP "
                             "(HTTP/2 when the server speaks it); http1: HTTP/1.1 only "
                             "(default %(default)s)")
    parser.add_argument("--max-line-bytes", type=line_bytes, default=DEFAULT_MAX_LINE,
                        metavar="BYTES", help="largest message either way (default 32 MiB, "
                        "at least 1 KiB)")
    parser.add_argument("--verbose", action="store_true",
                        help="log every reconnect attempt on stderr")
    return parser


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def run_connect_args(args: argparse.Namespace) -> int:
    logging.basicConfig(stream=sys.stderr, format="acp-server connect: %(message)s",
                        level=logging.INFO if args.verbose else logging.WARNING)
    for noisy in ("httpx", "httpcore", "httpx_ws"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    token = args.token if args.token is not None else os.environ.get(TOKEN_ENV) or None
    if token is not None:   # a pasted token's blanks, which the server strips too
        token = token.strip(BLANKS) or None
    # httpx's own refusal came at each ``initialize``, quoting the header, token and all
    refused = unsendable(token) if token is not None else None
    if refused is not None:
        print(f"acp-server connect: the token {refused}; it cannot go in an Authorization "
              "header (the token itself is not shown)", file=sys.stderr)
        return 2
    parts = urlsplit(args.url)
    if token and parts.scheme == "http" and not _loopback(parts.hostname or ""):
        logging.getLogger("acp_server.connect").warning(
            "the token goes in clear text to %s (http://): use https:// off this machine",
            parts.hostname)
    target = Target(args.url, token, args.transport, args.max_line_bytes)
    try:
        return anyio.run(_main, target, args.agent, args.give_up_after, backend="asyncio")
    finally:
        restore_blocking()


async def _main(target: Target, agent: str | None, give_up_after_s: float) -> int:
    async with EditorWriter(stdout_writer()) as out, anyio.create_task_group() as tg:
        relay = Relay(target, out=out, agent=agent, give_up_after_s=give_up_after_s)
        out.on_gone = relay.stop   # nothing can reach the editor: as if stdin closed
        tg.start_soon(_stop_on_signals, relay)
        code = await relay.run(LineReader(stdin_reader(), max_bytes=target.max_bytes))
        tg.cancel_scope.cancel()
        return code


async def _stop_on_signals(relay: Relay) -> None:
    """SIGTERM, SIGHUP, SIGINT: what closing stdin does (the turns are cancelled, the
    connection closed), then exit 128 + the signal's number."""
    with anyio.open_signal_receiver(*SIGNALS) as received:
        async for signum in received:
            relay.stop(128 + int(signum))
            return


def main(argv: Sequence[str] | None = None) -> int:
    parser = add_connect_arguments(argparse.ArgumentParser(
        prog="acp-server connect",
        description="Run as an ACP agent on stdio and relay to an acp-server's /acp."))
    return run_connect_args(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
