"""Checks our server is known to fail, with why; the rest of the tests expect a pass."""

from __future__ import annotations

KNOWN_FAILING: dict[str, str] = {}   # check id -> why our server fails it (none today)
