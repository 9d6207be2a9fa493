"""``store.errors.first_line``: what a log line or ``/health`` says of a store error."""

from __future__ import annotations

from acp_server.store.errors import first_line


def test_first_line_is_one_escaped_line() -> None:
    """A database's message may quote a value a client chose: its first line only, by the
    log lines' one rule (no terminal escape, no bidi override), readable text kept."""
    error = RuntimeError('duplicate key "café\x1b[31m\u202eevil"\nDETAIL: the payload')
    assert first_line(error) == 'duplicate key "café\\x1b[31m\\u202eevil"'
    assert first_line(error, 9) == "duplicate…"
    assert first_line(RuntimeError("")) == "RuntimeError"
