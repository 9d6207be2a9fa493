"""What the command-line clients (``acp-server prompt``, ``acp-server tasks``) share in
their arguments.

    parser.add_argument("--url", default=None, help=f"default ${URL_ENV} or {DEFAULT_URL}")
    parser.add_argument("--timeout", type=positive_seconds, default=30.0)

Contract: ``daemon_url`` is the address the command talks to (``--url``, else
``$ACP_SERVER_URL``, else the default); one without ``http://`` or ``https://``
(``127.0.0.1:4170``) raises ``httpx.InvalidURL``, which the commands report as bad usage
(exit status 2) before any request. ``positive_seconds`` refuses a number that is not above 0 (a negative or zero
timeout would only surface later as "cannot reach … timed out"), ``nan`` and ``inf``
included, with argparse's usage error (exit status 2); ``page_size`` one outside
``1..MAX_PAGE`` (the LMSP listing's range, which would answer it 400), the same way.
"""

from __future__ import annotations

import argparse
import math
import os

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
    return url


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
