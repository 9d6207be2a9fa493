"""A bearer token as our clients send it: checked once, before any request.

    token = bearer_token(args.token or os.environ.get(TOKEN_ENV))   # UnsendableTokenError
    headers = {"Authorization": f"Bearer {token}"} if token else {}

Contracts:

* ``bearer_token`` strips the token's surrounding ASCII blanks (space, tab, CR, LF,
  VT, FF: what the server strips of a bearer, a pasted token's newline) and answers
  ``None`` for an empty one (no header at all).
* A token that is still not printable ASCII (a control character, a CR LF inside it,
  a non-ASCII letter) can go in no HTTP header: ``UnsendableTokenError`` (a
  ``ValueError``), whose message says what is wrong and where, never the token
  itself. Sent, httpx refused it with a message that quoted the header, token and
  all ("Illegal header value b'Bearer …'"), or failed with a ``UnicodeEncodeError``.
* Shared by the SDK (``DaemonClient``, ``TaskClient``), the CLIs built on it
  (``acp-server prompt``, ``tasks``, ``token`` over HTTP) and ``acp-server connect``:
  a module of its own, so that none imports another's package for it.
"""

from __future__ import annotations

BLANKS = " \t\r\n\x0b\x0c"


class UnsendableTokenError(ValueError):
    """A token no ``Authorization`` header can carry (the token is not in the message)."""


def unsendable(token: str) -> str | None:
    """Why ``token`` cannot be an HTTP header's value, else ``None``."""
    for at, char in enumerate(token):
        if not " " <= char <= "~":
            kind = "a control character" if char < " " or char == "\x7f" else "non-ASCII"
            return f"holds {kind} at position {at + 1}"
    return None


def bearer_token(token: str | None) -> str | None:
    """``token`` without its surrounding blanks, ``None`` when nothing is left;
    ``UnsendableTokenError`` when no header can carry it (see the contracts)."""
    token = (token or "").strip(BLANKS)
    if not token:
        return None
    why = unsendable(token)
    if why is not None:
        raise UnsendableTokenError(f"The token {why}: no Authorization header can carry it "
                                   "(the token itself is not shown).")
    return token


__all__ = ["BLANKS", "UnsendableTokenError", "bearer_token", "unsendable"]
