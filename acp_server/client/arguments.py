"""What the command-line clients (``acp-server prompt``, ``acp-server tasks``) share in
their arguments.

    parser.add_argument("--url", default=None, help=f"default ${URL_ENV} or {DEFAULT_URL}")
    parser.add_argument("--timeout", type=positive_seconds, default=30.0)

Contract: ``daemon_url`` is the address the command talks to (``--url``, else
``$ACP_SERVER_URL``, else the default); one without ``http://`` or ``https://``
(``127.0.0.1:4170``), or whose host or port is malformed (``http://[::1``, a port that is no
number from 1 to 65535), raises ``httpx.InvalidURL`` saying which part is wrong, which the
commands report as bad usage (exit status 2) before any request. ``positive_seconds`` refuses a number that is not above 0 (a negative or zero
timeout would only surface later as "cannot reach … timed out"), ``nan`` and ``inf``
included, with argparse's usage error (exit status 2); ``page_size`` one outside
``1..MAX_PAGE`` (the LMSP listing's range, which would answer it 400), the same way.
"""

from __future__ import annotations

import argparse
import math
import os
import re

import httpx

from acp_server.client.errors import redact_address

URL_ENV = "ACP_SERVER_URL"
DEFAULT_URL = "http://127.0.0.1:4170"
MAX_PAGE = 100


def daemon_url(flag: str | None) -> str:
    url = flag or os.environ.get(URL_ENV) or DEFAULT_URL
    if not url.lower().startswith(("http://", "https://")):
        raise httpx.InvalidURL(f"{redact_address(url)!r} is not http:// or https:// "
                               f"(e.g. {DEFAULT_URL})")
    wrong = _authority_problem(url.partition("://")[2])
    if wrong is not None:
        shown = redact_address(url)
        shown = shown if len(shown) <= 100 else shown[:100] + "…"
        raise httpx.InvalidURL(f"{shown!r} is malformed: {wrong} "
                               f"(e.g. {DEFAULT_URL}, or http://[::1]:4170)")
    return url


def _authority_problem(rest: str) -> str | None:
    """What is wrong with the host and port of an address (the part after ``://``),
    in words, else ``None``. (httpx's own words mislead: ``http://[::1`` was "Invalid
    port: ':1'".)"""
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0].rpartition("@")[2]
    if authority.startswith("["):
        host, closed, port = authority[1:].partition("]")
        if not closed:
            return "its IPv6 host has no closing ']'"
        if not host:
            return "its host is empty"
        if port and not port.startswith(":"):
            return f"after the IPv6 host ']' comes {port[:20]!r}, not ':PORT'"
        port = port[1:]
    else:
        host, _, port = authority.partition(":")
        if ":" in port:
            return "its host has several ':' (an IPv6 address goes in brackets)"
        if not host:
            return "it has no host"
    if port and not (port.isascii() and port.isdigit() and len(port) <= 5
                     and 0 < int(port) < 65536):
        return f"its port {port[:20]!r} is not a number from 1 to 65535"
    return None


def positive_seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {value!r}") from None
    if not (seconds > 0 and math.isfinite(seconds)):
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0: {value!r}")
    return seconds


def page_size(value: str) -> int:
    try:
        size = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {value!r}") from None
    if not 1 <= size <= MAX_PAGE:
        raise argparse.ArgumentTypeError(f"must be from 1 to {MAX_PAGE}: {value!r}")
    return size


__all__ = ["DEFAULT_URL", "MAX_PAGE", "URL_ENV", "daemon_url", "page_size", "positive_seconds"]
