"""Request headers every door reads the same way.

    last_event_id(request)   # Last-Event-ID as a safe decimal integer, else None
    event_epoch(request)     # X-Qwen-Event-Epoch when it is a short token, else None
    accepts(request, "text/event-stream")   # Accept names it, with a weight above 0

Contracts: a malformed value is ignored (``None``), never an error, as ``qwen serve``
0.24.4 does for both headers; only ASCII digits count as digits. ``accepts`` reads
every ``Accept`` header (RFC 9110 §12.5.1): the media type itself must be named
(``*/*`` or ``text/*`` is not enough, as the ACP transport says: "MUST include"), and
``q=0`` means "not acceptable"; a weight that is not a number counts as 1.
"""

from __future__ import annotations

import re

from starlette.requests import HTTPConnection

DECIMAL = re.compile(r"[0-9]{1,16}")
_EPOCH = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_SAFE_INTEGER = 2**53 - 1


def last_event_id(request: HTTPConnection) -> int | None:
    """``Last-Event-ID`` when it is a safe decimal integer; anything else is ignored."""
    value = request.headers.get("last-event-id")
    if value is None or not DECIMAL.fullmatch(value.strip()):
        return None
    number = int(value)
    return number if number <= MAX_SAFE_INTEGER else None


def event_epoch(request: HTTPConnection) -> str | None:
    value = request.headers.get("x-qwen-event-epoch")
    return value if value is not None and _EPOCH.fullmatch(value) else None


def accepts(request: HTTPConnection, media_type: str) -> bool:
    """Does the request's ``Accept`` name ``media_type`` with a weight above 0?"""
    for value in request.headers.getlist("accept"):
        for entry in value.split(","):
            name, *parameters = entry.split(";")
            if name.strip().lower() != media_type:
                continue
            weight = 1.0
            for parameter in parameters:
                key, _, raw = parameter.partition("=")
                if key.strip().lower() == "q":
                    try:
                        weight = float(raw.strip())
                    except ValueError:
                        pass
            if weight > 0:
                return True
    return False


__all__ = ["DECIMAL", "MAX_SAFE_INTEGER", "accepts", "event_epoch", "last_event_id"]
