"""What the command-line clients (``acp-server prompt``, ``acp-server tasks``) share in
their arguments.

    parser.add_argument("--url", default=None, help=f"default ${URL_ENV} or {DEFAULT_URL}")
    parser.add_argument("--timeout", type=positive_seconds, default=30.0)

Contract: ``positive_seconds`` refuses a number that is not above 0 (a negative or zero
timeout would only surface later as "cannot reach … timed out"), ``nan`` and ``inf``
included, with argparse's usage error (exit status 2).
"""

from __future__ import annotations

import argparse
import math

URL_ENV = "ACP_SERVER_URL"
DEFAULT_URL = "http://127.0.0.1:4170"


def positive_seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {value!r}") from None
    if not (seconds > 0 and math.isfinite(seconds)):
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0: {value!r}")
    return seconds


__all__ = ["DEFAULT_URL", "URL_ENV", "positive_seconds"]
