"""A real trigger that makes the test's database refuse some writes every time (a record
the store refuses for good), the same on PostgreSQL and SQLite.

    refuse_rows(url=store_url_or_none, sqlite_path=tmp_path / "audit.db",
                name="refuse_marked", table="audit",
                when="instr(NEW.detail, 'POISON') > 0")   # in that database's SQL

``url`` (PostgreSQL): a trigger function ``name`` that raises ``reason`` with the SQLSTATE
``errcode`` (default ``P0001``, plpgsql's ``raise_exception``), and a trigger
``name`` BEFORE ``event`` FOR EACH ROW (``when`` reads ``OLD`` for a ``DELETE``); else (SQLite, the file at ``sqlite_path``) a
trigger ``name`` BEFORE ``event`` WHEN ``when`` that does ``RAISE(ABORT, reason)``.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

REASON = "refused by the test trigger"


def refuse_rows(*, url: str | None, sqlite_path: Path, name: str, table: str, when: str,
                event: str = "INSERT", reason: str = REASON, errcode: str = "P0001") -> None:
    if url is not None:
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"""
                CREATE OR REPLACE FUNCTION {name}() RETURNS trigger AS $$
                BEGIN
                  IF {when} THEN
                    RAISE EXCEPTION '{reason}' USING ERRCODE = '{errcode}';
                  END IF;
                  IF TG_OP = 'DELETE' THEN
                    RETURN OLD;   -- (NEW is NULL: the row would be skipped, not deleted)
                  END IF;
                  RETURN NEW;
                END $$ LANGUAGE plpgsql""")
            conn.execute(f"CREATE TRIGGER {name} BEFORE {event} ON {table} FOR EACH ROW "
                         f"EXECUTE FUNCTION {name}()")
        return
    with sqlite3.connect(sqlite_path) as db:
        db.execute(f"CREATE TRIGGER {name} BEFORE {event} ON {table} WHEN {when} "
                   f"BEGIN SELECT RAISE(ABORT, '{reason}'); END")
