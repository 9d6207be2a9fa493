"""Who is calling: a ``Principal`` (a name, its scopes, its rate-limit class) and what a
request needs of one (``Access``).

    caller = Principal("ci", frozenset({"read", "prompt"}), kind="token", token_id="9f2c…")
    caller.has(PROMPT)              # True; ADMIN is False
    caller.sees(owner="ci")         # its own session; another's only as an admin
    access = Access(PROMPT, "prompt")   # POST /session/{id}/prompt

Contracts:

* Scopes: ``read`` (lists, status, history, event streams), ``prompt`` (creating
  sessions and tasks, prompting, cancelling, answering permissions) and ``admin``
  (tokens, the audit log, other principals' sessions and tasks, ``/metrics`` when
  auth is required). ``admin`` includes the other two; ``prompt`` does not include
  ``read``.
* Kinds: ``bootstrap`` (``--token`` / ``ACP_SERVER_TOKEN``: admin, unlimited),
  ``local`` (no credential configured at all, a loopback client: admin, unlimited,
  as the server always was), ``token`` (a stored token: its scopes, its rate class).
* Rate classes of a principal: ``default`` (the server's ``--rate-limit-*`` tiers) or
  ``unlimited``; request classes (what a request is counted as): ``prompt``,
  ``mutation``, ``read``, or ``None`` (not counted).
* A name is 1–64 characters of letters, digits and ``._@-``, starting with a letter or
  a digit; ``bootstrap``, ``local`` and ``anonymous`` are reserved.
"""

from __future__ import annotations

import dataclasses
import re

READ, PROMPT, ADMIN = "read", "prompt", "admin"
SCOPES = (READ, PROMPT, ADMIN)
DEFAULT_SCOPES = (PROMPT, READ)
# Request classes (the rate limiter's tiers).
PROMPT_CLASS, MUTATION_CLASS, READ_CLASS = "prompt", "mutation", "read"
CLASSES = (PROMPT_CLASS, MUTATION_CLASS, READ_CLASS)
DEFAULT_RATE, UNLIMITED = "default", "unlimited"
RATE_CLASSES = (DEFAULT_RATE, UNLIMITED)
BOOTSTRAP_NAME, LOCAL_NAME = "bootstrap", "local"
RESERVED_NAMES = frozenset({BOOTSTRAP_NAME, LOCAL_NAME, "anonymous"})
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")   # fullmatch: no "\n" after


class InvalidPrincipalError(ValueError):
    """A token name, scope or rate class that is not allowed (the message says why)."""


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise InvalidPrincipalError(
            f"Invalid token name: {name[:80]!r}. Use 1-64 letters, digits, '.', '_', '@' "
            "or '-', starting with a letter or a digit.")
    if name.lower() in RESERVED_NAMES:
        raise InvalidPrincipalError(f"Invalid token name: {name!r} is reserved.")
    return name


def check_scopes(scopes: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The scopes, sorted and without repeats (``DEFAULT_SCOPES`` when empty)."""
    unknown = [s for s in scopes if s not in SCOPES]
    if unknown:
        raise InvalidPrincipalError(f"Invalid scope: {unknown[0][:40]!r}. Must be one of "
                                    f"{', '.join(SCOPES)}.")
    return tuple(sorted(set(scopes))) if scopes else DEFAULT_SCOPES


@dataclasses.dataclass(frozen=True, slots=True)
class Principal:
    name: str
    scopes: frozenset[str]
    kind: str = "token"            # bootstrap | local | token
    rate_class: str = DEFAULT_RATE
    token_id: str | None = None    # a stored token's public id

    @property
    def is_admin(self) -> bool:
        return ADMIN in self.scopes

    @property
    def is_bootstrap(self) -> bool:
        return self.kind == "bootstrap"

    @property
    def limited(self) -> bool:
        return self.rate_class != UNLIMITED

    def same(self, other: Principal) -> bool:
        """Whether ``other`` is this principal: the same name, kind and stored token (a
        token re-created under a revoked one's name is another principal)."""
        return self.name == other.name and self.kind == other.kind \
            and self.token_id == other.token_id

    def has(self, scope: str | None) -> bool:
        """Whether it may do what needs ``scope`` (``None``: any authenticated caller)."""
        return scope is None or scope in self.scopes or ADMIN in self.scopes

    def sees(self, owner: str | None, *, shared: bool = False) -> bool:
        """Whether something owned by ``owner`` exists for it: its own, anything for an
        admin, anything when sessions are shared (``--share-sessions``); something
        without an owner (made before ownership existed) for admins only."""
        return shared or ADMIN in self.scopes or (owner is not None and owner == self.name)


ALL = frozenset(SCOPES)
BOOTSTRAP = Principal(BOOTSTRAP_NAME, ALL, kind="bootstrap", rate_class=UNLIMITED)
LOCAL = Principal(LOCAL_NAME, ALL, kind="local", rate_class=UNLIMITED)


@dataclasses.dataclass(frozen=True, slots=True)
class Access:
    """What a request needs: a scope (``None``: any authenticated caller) and the class
    it is counted in by the rate limiter (``None``: not counted)."""

    scope: str | None
    klass: str | None
    per_message: bool = False


OPEN = Access(None, None)                    # /health, heartbeats, closing a connection
INFO = Access(None, READ_CLASS)              # /capabilities, /daemon/status, initialize
READING = Access(READ, READ_CLASS)
PROMPTING = Access(PROMPT, PROMPT_CLASS)
MUTATING = Access(PROMPT, MUTATION_CLASS)
ADMIN_READ = Access(ADMIN, READ_CLASS)
ADMIN_WRITE = Access(ADMIN, MUTATION_CLASS)
# A door that decides per message (``/acp``'s JSON-RPC methods), not per request.
PER_MESSAGE = Access(None, None, per_message=True)


__all__ = ["ADMIN", "ADMIN_READ", "ADMIN_WRITE", "ALL", "Access", "BOOTSTRAP", "CLASSES",
           "DEFAULT_RATE", "DEFAULT_SCOPES", "INFO", "InvalidPrincipalError", "LOCAL",
           "MUTATING", "MUTATION_CLASS", "OPEN", "PER_MESSAGE", "PROMPT", "PROMPTING",
           "PROMPT_CLASS", "Principal", "RATE_CLASSES", "READ", "READING", "READ_CLASS",
           "SCOPES", "UNLIMITED", "check_name", "check_scopes"]
