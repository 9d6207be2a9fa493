"""The audit log's table: an append-only record of who did what, one row per act.

    await store.append_audit([AuditRecord(at=now, principal="ci", action="session.created",
                                          target=session_id, client="10.0.0.7",
                                          detail='{"agent":"reference"}')])
    page = await store.read_audit(AuditQuery(principal="ci", since=t0, limit=100))
    purged = await store.purge_audit(before=now - retention_s)

Contracts:

* The table is ``audit`` (``schema.MIGRATIONS`` entry 3). Rows are only ever inserted,
  and deleted by the retention purge (``purge_audit``, oldest first); never updated.
  ``seq`` orders them (SQLite: the insertion order; PostgreSQL: an identity, so two
  instances' rows interleave in the order their numbers were drawn).
* ``append_audit`` writes a batch in one statement (per ``ROWS_PER_INSERT`` records)
  through the store's one writer (the principals' ``AuditLog`` batches what the doors
  record); ``detail`` is a JSON object as text, written by the caller.
* ``read_audit`` pages by ``seq``: rows after ``after`` (a ``seq``), oldest first,
  filtered by principal, action and time (``since`` inclusive, ``until`` exclusive).
  A principal or action filter with a NUL matches nothing, without a query, on both
  engines (PostgreSQL's TEXT cannot hold one).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

AUDIT_COLUMNS = "seq, at, principal, action, target, client, detail"
ROWS_PER_INSERT = 100   # x 6 parameters: well under SQLite's and PostgreSQL's limits


@dataclasses.dataclass(frozen=True, slots=True)
class AuditRecord:
    at: float
    principal: str
    action: str
    target: str | None = None
    client: str | None = None
    detail: str = "{}"       # a JSON object
    seq: int = 0             # given by the store


@dataclasses.dataclass(frozen=True, slots=True)
class AuditQuery:
    principal: str | None = None
    action: str | None = None
    since: float | None = None
    until: float | None = None
    after: int = 0
    limit: int = 100


class AuditOps:
    """The audit operations of a store (mixed in like ``tokens.TokenOps``)."""

    _p = "?"
    _write: Callable[..., Any]
    _read: Callable[..., Any]

    async def append_audit(self, records: Sequence[AuditRecord]) -> None:
        """One multi-row INSERT per ``ROWS_PER_INSERT`` records. Measured: psycopg's
        ``executemany`` sent one statement per row, each a socket wait that gives up
        the GIL (two polls a row, in pipeline mode), and a prompt writes one record."""
        one = "(" + ", ".join([self._p] * 6) + ")"
        rows = [(r.at, r.principal, r.action, r.target, r.client, r.detail) for r in records]

        def op(conn: Any, out: list[Any], state: Any = None) -> None:
            for start in range(0, len(rows), ROWS_PER_INSERT):
                chunk = rows[start:start + ROWS_PER_INSERT]
                conn.execute("INSERT INTO audit(at, principal, action, target, client, detail) "
                             "VALUES " + ", ".join([one] * len(chunk)),
                             [value for row in chunk for value in row])

        if rows:
            await self._write(op)

    async def read_audit(self, query: AuditQuery) -> list[AuditRecord]:
        if any("\x00" in value for value in (query.principal, query.action) if value):
            return []   # no TEXT holds a NUL (psycopg will not send one): no such record
        p = self._p
        where, params = [f"seq > {p}"], [query.after]
        for column, op, value in (("principal", "=", query.principal),
                                  ("action", "=", query.action),
                                  ("at", ">=", query.since), ("at", "<", query.until)):
            if value is not None:
                where.append(f"{column} {op} {p}")
                params.append(value)
        sql = (f"SELECT {AUDIT_COLUMNS} FROM audit WHERE {' AND '.join(where)} "
               f"ORDER BY seq LIMIT {p}")
        rows_of = lambda conn: conn.execute(sql, (*params, query.limit)).fetchall()  # noqa: E731
        return [AuditRecord(seq=r[0], at=r[1], principal=r[2], action=r[3], target=r[4],
                            client=r[5], detail=r[6]) for r in await self._read(rows_of)]

    async def purge_audit(self, *, before: float) -> int:
        """Deletes the records older than ``before``; how many."""
        p = self._p
        return await self._write(  # type: ignore[no-any-return]
            lambda conn, out, state=None: conn.execute(
                f"DELETE FROM audit WHERE at < {p}", (before,)).rowcount)


__all__ = ["AUDIT_COLUMNS", "AuditOps", "AuditQuery", "AuditRecord"]
