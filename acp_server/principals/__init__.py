"""Principals: who calls the server, what each may do, what each did.

    async with open_principals(store, bootstrap=settings.token, limits=DEFAULT_TIERS) as gate:
        policy = GuardPolicy(gate=gate, ...)      # acp_server.http: authentication
        caller = caller_of(request.scope)         # in a door: the request's Caller
        if not caller.sees(session.owner): raise SessionNotFoundError(sid)   # 404
        caller.record("session.created", session_id)                          # audit

Modules:

* ``model`` — ``Principal`` (a name, scopes ``read`` / ``prompt`` / ``admin``, a kind,
  a rate class) and ``Access`` (what a request needs: a scope, a rate class).
* ``tokens`` — the stored tokens' format ``acps_<id>_<secret>``, issuing, SHA-256
  digests compared in constant time. ``auth`` — ``Authenticator``: the bootstrap token
  and stored tokens, behind a cache of ``TTL_S``.
* ``limits`` — ``RateLimiter``: a token bucket per principal and class, in memory.
* ``audit`` — ``AuditLog``: records batched into the store's audit table.
* ``streams`` — ``StreamRegistry``: open streams per token, ended on revocation.
* ``ownership`` — ``SessionOwners``: which principal made each session (the REST and
  ``/acp`` doors share one per server, ``gate.sessions``; 404 for what a caller does
  not see), and each principal's default session.
* ``gate`` — ``Gate`` (all of the above for one server, ``open_principals``) and
  ``Caller`` (a request's principal with that policy). ``admin`` — token creation and
  revocation on a store (``acp-server token`` and ``/tokens``).

Contracts: this room serves no HTTP and knows no door (the guard in ``acp_server.http``
and the doors use it); it keeps its tables in the store (``store/tokens.py``,
``store/audit.py``). The request's ``Caller`` travels in the ASGI scope under
``CALLER_KEY``, put there by the front layer (or the ``/acp`` WebSocket handshake):
``caller_of(scope)``.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from acp_server.principals.gate import LOCAL_CALLER, Caller, Denial, Gate, open_principals
from acp_server.principals.limits import DEFAULT_TIERS, RateLimiter, Tier
from acp_server.principals.model import (
    ADMIN,
    BOOTSTRAP,
    LOCAL,
    PROMPT,
    READ,
    Access,
    InvalidPrincipalError,
    Principal,
)

CALLER_KEY = "acp_server.caller"


def caller_of(scope: MutableMapping[str, Any]) -> Caller:
    """The request's ``Caller``; ``LOCAL_CALLER`` when no guard saw the request (a door
    composed without the front layer, in tests)."""
    return scope.get(CALLER_KEY) or LOCAL_CALLER  # type: ignore[no-any-return]


__all__ = ["ADMIN", "Access", "BOOTSTRAP", "CALLER_KEY", "Caller", "DEFAULT_TIERS", "Denial",
           "Gate", "InvalidPrincipalError", "LOCAL", "LOCAL_CALLER", "PROMPT", "Principal",
           "READ", "RateLimiter", "Tier", "caller_of", "open_principals"]
