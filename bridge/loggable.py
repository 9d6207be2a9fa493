"""Text a client or an agent chose, made safe for one log line.

    log.info("client disconnected: %s %s", loggable(method), loggable(path))
    loggable("a\\nb\\x1b[31m")   # 'a\\\\nb\\\\x1b[31m': one line, no terminal escape

Contracts: printable characters are kept as they are; every other one (CR, LF, NUL,
ESC and the other C0/C1 controls, U+2028, …) becomes its Python escape (``\\n``,
``\\x1b``, ``\\u2028``), so one value can neither forge a second log line nor drive the
reader's terminal; longer than ``limit`` characters, it is cut there and ends with "…".
"""

from __future__ import annotations

MAX_CHARS = 512


def loggable(text: str, limit: int = MAX_CHARS) -> str:
    if len(text) > limit:
        text = text[:limit] + "…"
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)
