"""Token administration on a store, shared by ``acp-server token`` (on the store
directly) and the ``/tokens`` routes (``Gate``, which also drops its cache and ends
streams).

    issued = await create_token(store, audit, by="bootstrap", name="ci",
                                scopes=["prompt", "read"], expires="30d")
    print(issued.token)                      # once
    revoked = await revoke_token(store, audit, by="bootstrap", name="ci")
    rows = [token_json(r) for r in await store.list_tokens(include_revoked=True)]

Contracts: validation errors are ``InvalidPrincipalError`` (a message for the user);
a name taken by a live token is ``TokenNameTakenError``; each create and revoke is
one audit record (``token.created`` / ``token.revoked``, target the name, detail the
token id and scopes; never the secret). The store's errors pass through
(``StoreUnavailableError``).
"""

from __future__ import annotations

import datetime
from typing import Any, Protocol

from acp_server.principals.audit import AuditLog
from acp_server.principals.model import DEFAULT_RATE
from acp_server.principals.tokens import Issued, issue, parse_duration
from acp_server.store.tokens import TokenRecord


class AdminStore(Protocol):
    async def create_token(self, record: TokenRecord,
                           expired: list[str] | None = None) -> TokenRecord: ...
    async def revoke_token(self, name: str, *, by: str, at: float) -> list[TokenRecord]: ...
    async def list_tokens(self, *, include_revoked: bool = False,
                          now: float | None = None) -> list[TokenRecord]: ...


async def create_token(store: AdminStore, audit: AuditLog, *, by: str, name: str,
                       scopes: list[str] | tuple[str, ...] = (), expires: str | None = None,
                       rate_class: str = DEFAULT_RATE, client: str | None = None) -> Issued:
    issued = issue(name, scopes=scopes, by=by, now=audit.clock(),
                   expires_in_s=None if expires is None else parse_duration(expires),
                   rate_class=rate_class)
    expired: list[str] = []
    await store.create_token(issued.record, expired)
    record = issued.record
    for token_id in expired:   # the name's expired token, revoked as it gives the name up
        audit.record("expiry", "token.revoked", name, client=client, token_id=token_id)
    audit.record(by, "token.created", name, client=client, token_id=record.id,
                 scopes=list(record.scopes), rate_class=record.rate_class,
                 expires_at=record.expires_at)
    return issued


async def revoke_token(store: AdminStore, audit: AuditLog, *, by: str, name: str,
                       client: str | None = None) -> list[TokenRecord]:
    revoked = await store.revoke_token(name, by=by, at=audit.clock())
    for record in revoked:
        audit.record(by, "token.revoked", name, client=client, token_id=record.id)
    return revoked


def iso(timestamp: float | None) -> str | None:
    """A stored time as ISO 8601 UTC; one out of ``datetime``'s range (a row written
    before durations were capped) is shown as the last or first second it has."""
    if timestamp is None:
        return None
    try:
        moment = datetime.datetime.fromtimestamp(timestamp, datetime.UTC)
    except (OverflowError, OSError, ValueError):
        return "9999-12-31T23:59:59Z" if timestamp > 0 else "0001-01-01T00:00:00Z"
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def token_json(record: TokenRecord) -> dict[str, Any]:
    """A token as ``GET /tokens`` and ``token list --json`` show it (no secret, ever)."""
    return {"name": record.name, "id": record.id, "scopes": list(record.scopes),
            "rateClass": record.rate_class, "createdAt": iso(record.created_at),
            "createdBy": record.created_by, "expiresAt": iso(record.expires_at),
            "lastUsedAt": iso(record.last_used_at), "revokedAt": iso(record.revoked_at),
            "revokedBy": record.revoked_by}


__all__ = ["AdminStore", "create_token", "iso", "revoke_token", "token_json"]
