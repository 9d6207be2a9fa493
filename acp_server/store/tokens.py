"""The stored bearer tokens: one row per token, its secret kept only as a SHA-256 digest.

    record = TokenRecord.new(id="9f2c4d1e0b7a6c35", name="ci", secret_sha256=digest,
                             scopes=("prompt", "read"), rate_class="default",
                             created_at=now, created_by="bootstrap", expires_at=None)
    await store.create_token(record)              # TokenNameTakenError: a live token has it
    found = await store.get_token("9f2c4d1e0b7a6c35")
    revoked = await store.revoke_token("ci", by="bootstrap", at=now)   # [] when none live
    await store.touch_tokens({"9f2c4d1e0b7a6c35": now})     # last used (batched, lossy)

Contracts:

* The table is ``tokens`` (``schema.MIGRATIONS`` entry 3, both engines). ``id`` is the
  public part of the token (``acps_<id>_<secret>``, ``acp_server.principals.tokens``);
  the secret itself is never stored. A token is *live* until revoked: at most one live
  token per ``name`` (a partial unique index), so a name is a principal and revoking
  it revokes its token; a revoked row stays for the record (``token list --all``).
* Every write goes through the store's one writer (``_write``) and is durable on
  return; on PostgreSQL each write that changes who may call (create, revoke) NOTIFYs
  the other instances with kind ``t`` and the token ids (``TokenOps._token_notice``),
  which ``on_tokens_changed(ids)`` receives on each of them; SQLite has one instance
  per file and no notices (the principals' cache lifetime bounds what another process,
  e.g. ``acp-server token revoke``, takes to be seen).
* A name with a NUL (a client's, ``DELETE /tokens/%00``) names no token: ``revoke_token``
  revokes nothing without a query, on both engines (PostgreSQL's TEXT cannot hold one).
* ``TokenOps`` is mixed into both store classes (``SqliteTaskStore``,
  ``PostgresTaskStore``), so one store object serves the tasks, the tokens and the
  audit log (``store/audit.py``) with one writer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

TOKEN_COLUMNS = ("id, name, secret_sha256, scopes, rate_class, created_at, created_by, "
                 "expires_at, last_used_at, revoked_at, revoked_by")


class TokenNameTakenError(Exception):
    """A live token already has this name (revoke it first)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"A token named {name!r} exists already; revoke it first.")
        self.name = name


@dataclasses.dataclass(frozen=True, slots=True)
class TokenRecord:
    id: str
    name: str
    secret_sha256: str
    scopes: tuple[str, ...]
    rate_class: str
    created_at: float
    created_by: str
    expires_at: float | None = None
    last_used_at: float | None = None
    revoked_at: float | None = None
    revoked_by: str | None = None

    def live(self, now: float) -> bool:
        """Not revoked and not expired at ``now`` (epoch seconds)."""
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)


def token_from_row(row: Sequence[Any]) -> TokenRecord:
    return TokenRecord(row[0], row[1], row[2], tuple(s for s in row[3].split(",") if s),
                       row[4], row[5], row[6], row[7], row[8], row[9], row[10])


class TokenOps:
    """The token operations of a store (``_p`` is the engine's placeholder; the
    store provides ``_write``, ``_read`` and ``_conflict``)."""

    _p = "?"
    # Another instance created or revoked tokens (PostgreSQL notices, kind ``t``);
    # set by the principals (``acp_server.principals``), called on the event loop.
    on_tokens_changed: Callable[[list[str]], None] | None = None

    # -- provided by the store -----------------------------------------------------
    _write: Callable[..., Any]
    _read: Callable[..., Any]

    def _conflict(self, exc: BaseException) -> bool:
        """``exc`` is a unique-index violation (the engine's own class)."""
        raise NotImplementedError

    def _token_notice(self, state: Any, token_ids: Iterable[str]) -> None:
        """Tell the other instances (PostgreSQL: a NOTIFY in the same transaction)."""

    # -- operations ----------------------------------------------------------------
    async def create_token(self, record: TokenRecord,
                           expired: list[str] | None = None) -> TokenRecord:
        """``expired`` (when given) gets the ids of the expired tokens of the name this
        one takes over (marked revoked by ``'expiry'``), for the audit log."""
        p = self._p

        def op(conn: Any, out: list[Any], state: Any = None) -> TokenRecord:
            # an expired token of the name gives the name up: marked revoked by expiry
            gone = f"name = {p} AND revoked_at IS NULL AND expires_at IS NOT NULL " \
                   f"AND expires_at <= {p}"
            ids = [row[0] for row in conn.execute(f"SELECT id FROM tokens WHERE {gone}",
                                                  (record.name, record.created_at))]
            if ids:
                conn.execute(f"UPDATE tokens SET revoked_at = expires_at, "
                             f"revoked_by = 'expiry' WHERE {gone}",
                             (record.name, record.created_at))
            if expired is not None:
                expired[:] = ids   # a batch run again (savepoints) says it once
            taken = conn.execute(f"SELECT 1 FROM tokens WHERE name = {p} AND revoked_at IS NULL",
                                 (record.name,)).fetchone()
            if taken is not None:
                raise TokenNameTakenError(record.name)
            conn.execute(
                f"INSERT INTO tokens({TOKEN_COLUMNS}) VALUES "
                f"({', '.join([p] * 11)})",
                (record.id, record.name, record.secret_sha256, ",".join(record.scopes),
                 record.rate_class, record.created_at, record.created_by, record.expires_at,
                 None, None, None))
            self._token_notice(state, [record.id])
            return record

        try:
            return await self._write(op)  # type: ignore[no-any-return]
        except Exception as exc:
            if self._conflict(exc):   # another instance won the name meanwhile
                raise TokenNameTakenError(record.name) from None
            raise

    async def get_token(self, token_id: str) -> TokenRecord | None:
        p = self._p

        def read(conn: Any) -> TokenRecord | None:
            row = conn.execute(f"SELECT {TOKEN_COLUMNS} FROM tokens WHERE id = {p}",
                               (token_id,)).fetchone()
            return None if row is None else token_from_row(row)

        return await self._read(read)  # type: ignore[no-any-return]

    async def list_tokens(self, *, include_revoked: bool = False,
                          now: float | None = None) -> list[TokenRecord]:
        """The live tokens (not revoked; not expired at ``now`` when given), or every
        token with ``include_revoked``."""
        p = self._p
        where, args = "", ()
        if not include_revoked:
            where = " WHERE revoked_at IS NULL"
            if now is not None:
                where += f" AND (expires_at IS NULL OR expires_at > {p})"
                args = (now,)
        sql = f"SELECT {TOKEN_COLUMNS} FROM tokens{where} ORDER BY created_at, id"
        return await self._read(  # type: ignore[no-any-return]
            lambda conn: [token_from_row(r) for r in conn.execute(sql, args).fetchall()])

    async def token_count(self) -> int:
        """Every token ever stored, revoked and expired ones included (they stay in
        the table): whether this store has ever been given credentials."""
        return await self._read(lambda conn: int(conn.execute(  # type: ignore[no-any-return]
            "SELECT COUNT(*) FROM tokens").fetchone()[0]))

    async def revoke_token(self, name: str, *, by: str, at: float) -> list[TokenRecord]:
        """Revokes the live token of ``name``; the rows revoked (none: no such token)."""
        if "\x00" in name:   # no TEXT holds a NUL (psycopg will not send one): no such token
            return []
        p = self._p

        def op(conn: Any, out: list[Any], state: Any = None) -> list[TokenRecord]:
            rows = conn.execute(
                f"UPDATE tokens SET revoked_at = {p}, revoked_by = {p} WHERE name = {p} "
                f"AND revoked_at IS NULL RETURNING {TOKEN_COLUMNS}", (at, by, name)).fetchall()
            revoked = [token_from_row(r) for r in rows]
            if revoked:
                self._token_notice(state, [r.id for r in revoked])
            return revoked

        return await self._write(op)  # type: ignore[no-any-return]

    async def touch_tokens(self, used: Mapping[str, float]) -> None:
        """``last_used_at`` of each token id (one statement per token, one transaction)."""
        p = self._p
        rows = [(at, token_id, at) for token_id, at in used.items()]

        def op(conn: Any, out: list[Any], state: Any = None) -> None:
            conn.cursor().executemany(f"UPDATE tokens SET last_used_at = {p} WHERE id = {p} AND "
                             f"(last_used_at IS NULL OR last_used_at < {p})", rows)

        if rows:
            await self._write(op)


__all__ = ["TOKEN_COLUMNS", "TokenNameTakenError", "TokenOps", "TokenRecord", "token_from_row"]
