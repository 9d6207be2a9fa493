"""The stored tokens' format: ``acps_<public id>_<secret>``, and what is kept of one.

    issued = issue("ci", scopes=("prompt", "read"), by="bootstrap", now=time.time(),
                   expires_in_s=parse_duration("30d"))
    issued.token                    # 'acps_9f2c4d1e0b7a6c35_Qm9v…' (shown once, never stored)
    issued.record.secret_sha256     # what the store keeps
    parse("acps_9f2c4d1e0b7a6c35_Qm9v…")   # ('9f2c4d1e0b7a6c35', 'Qm9v…'), None if malformed
    matches(issued.record, secret)  # constant-time comparison of the digests

Contracts:

* The public id is 16 hex digits (8 random bytes): the store looks the row up by it,
  and it may appear in logs and the audit log. The secret is 32 random bytes in
  base64url (43 characters, which may contain ``_``: ``parse`` splits at the first
  ``_`` after the id). The token is never stored, logged or passed on; only the
  SHA-256 of the secret is kept, compared with ``hmac.compare_digest``.
* Why SHA-256 and no slow KDF (bcrypt, scrypt, argon2): a slow hash protects
  low-entropy secrets (passwords) against guessing once the hashes leak. These secrets
  are 256 random bits: no guess list exists, and a leaked digest gives nothing to
  guess against. A slow KDF would only cost every request (milliseconds on the hot
  path, where a SHA-256 of 43 bytes is a microsecond).
* ``parse_duration``: ``30d``, ``12h``, ``90m``, ``45s`` or plain seconds; positive,
  ``MAX_DURATION_S`` (100 years) at most.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import re
import secrets

from acp_server.principals.model import DEFAULT_RATE, RATE_CLASSES, InvalidPrincipalError, \
    check_name, check_scopes
from acp_server.store.tokens import TokenRecord

PREFIX = "acps_"
_ID = re.compile(r"[0-9a-f]{16}")   # fullmatch
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
MAX_DURATION_S = 100 * 365 * 86400   # a date any clock and ISO 8601 writer can still show


@dataclasses.dataclass(frozen=True, slots=True)
class Issued:
    token: str            # shown once
    record: TokenRecord   # stored


def digest(secret: str | bytes) -> str:
    data = secret.encode("latin-1") if isinstance(secret, str) else secret
    return hashlib.sha256(data).hexdigest()


def issue(name: str, *, scopes: tuple[str, ...] | list[str] = (), by: str, now: float,
          expires_in_s: float | None = None, rate_class: str = DEFAULT_RATE) -> Issued:
    """A new token for ``name`` (validated: ``InvalidPrincipalError``)."""
    check_name(name)
    if rate_class not in RATE_CLASSES:
        raise InvalidPrincipalError(f"Invalid rate class: {rate_class!r}. Must be one of "
                                    f"{', '.join(RATE_CLASSES)}.")
    if expires_in_s is not None and not expires_in_s > 0:
        raise InvalidPrincipalError("Invalid expiry: must be a positive duration.")
    token_id = secrets.token_hex(8)
    secret = base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()
    record = TokenRecord(id=token_id, name=name, secret_sha256=digest(secret),
                         scopes=check_scopes(list(scopes)), rate_class=rate_class,
                         created_at=now, created_by=by,
                         expires_at=None if expires_in_s is None else now + expires_in_s)
    return Issued(f"{PREFIX}{token_id}_{secret}", record)


def parse(token: str | bytes) -> tuple[str, bytes] | None:
    """``(public id, secret)`` of a well-formed stored token, else ``None``."""
    raw = token if isinstance(token, bytes) else token.encode("latin-1", "replace")
    if not raw.startswith(b"acps_") or len(raw) > 200:
        return None
    token_id, sep, secret = raw[5:].partition(b"_")
    if not sep or not secret or len(token_id) != 16:
        return None
    text = token_id.decode("latin-1")
    if not _ID.fullmatch(text):
        return None
    return text, secret


def public_id(token: str | bytes) -> str | None:
    parsed = parse(token)
    return parsed[0] if parsed else None


def matches(record: TokenRecord, secret: bytes) -> bool:
    """The secret's digest equals the stored one (constant time)."""
    return hmac.compare_digest(hashlib.sha256(secret).hexdigest(), record.secret_sha256)


def parse_duration(text: str) -> float:
    """``30d`` → 2592000.0 (see the module docstring); ``InvalidPrincipalError`` else."""
    found = _DURATION.match(text or "") if len(text or "") <= 64 else None
    seconds = float(found.group(1)) * _UNITS[found.group(2)] if found else 0.0
    if not 0 < seconds <= MAX_DURATION_S:
        raise InvalidPrincipalError(f"Invalid duration: {text[:64]!r}. Use e.g. 30d, 12h, "
                                    "90m or seconds, up to 100 years.")
    return seconds


__all__ = ["Issued", "MAX_DURATION_S", "PREFIX", "digest", "issue", "matches", "parse", "parse_duration",
           "public_id"]
