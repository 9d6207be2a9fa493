"""Text a client, an agent or an operator chose, made safe for one log line: the one
rule of every log writer (the request log, agents' stderr, the refusals and start-up
lines that echo a flag or a path).

    log.info("client disconnected: %s %s", loggable(method), loggable(path))
    loggable("a\\nb\\x1b[31m")   # 'a\\\\nb\\\\x1b[31m': one line, no terminal escape
    loggable("café\\u202e")      # 'café\\\\u202e': readable text stays, a bidi override not

Contracts: printable characters are kept as they are, non-ASCII text included (``é``,
``漢字``); every other one becomes its Python escape (``\\n``, ``\\x1b``, ``\\u202e``):
CR, LF, NUL, ESC and the other C0/C1 controls, U+2028/U+2029, the bidi embeddings,
overrides and isolates (U+202A–U+202E, U+2066–U+2069) and the other format characters,
lone surrogates. So one value can neither forge a second log line, drive the reader's
terminal, nor reorder what the line shows; and every line can be encoded (a JSON line
too). Longer than ``limit`` characters, a value is cut there and ends with "…".
"""

from __future__ import annotations

MAX_CHARS = 512


def loggable(text: str, limit: int = MAX_CHARS) -> str:
    if len(text) > limit:
        text = text[:limit] + "…"
    if text.isprintable():   # no Cc, Cf, Cs, Co, Cn, Zl, Zp, nor a space but " "
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)
