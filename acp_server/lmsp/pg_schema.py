"""PostgreSQL schema (versioned migrations) and the SQL dialect of ``postgres``.

    version = migrate(conn)               # under an advisory lock; idempotent
    record = select_task(PG, conn, task_id, lock=True)    # store.py, in this dialect

Contracts: ``MIGRATIONS[n - 1]`` takes the schema from version ``n - 1`` to ``n`` and is
never edited once released (add a new entry); ``schema_version`` lists every version
applied. Everything lives in the connection's ``search_path`` schema.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from acp_server.lmsp.store import CommittedEvent, Dialect, numbered
from acp_server.lmsp.wire import AnyEvent

Conn = psycopg.Connection[Any]

MIGRATIONS: list[str] = [
    # 1: the SQLite schema, plus ownership (owner, lease_expires_at)
    """
    CREATE TABLE tasks (
        seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,   -- creation order
        id TEXT NOT NULL UNIQUE,
        response_id TEXT NOT NULL,
        status TEXT NOT NULL,
        on_restart TEXT NOT NULL,
        model TEXT NOT NULL,
        principal TEXT NOT NULL,
        request BYTEA NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL,
        finished_at DOUBLE PRECISION,
        next_seq INTEGER NOT NULL DEFAULT 0,
        attempt INTEGER NOT NULL DEFAULT 0,
        response BYTEA,
        error BYTEA,
        events_purged BOOLEAN NOT NULL DEFAULT FALSE,
        owner TEXT,
        lease_expires_at DOUBLE PRECISION
    );
    CREATE INDEX tasks_status ON tasks(status, seq);
    CREATE INDEX tasks_finished ON tasks(finished_at) WHERE finished_at IS NOT NULL;
    CREATE INDEX tasks_leases ON tasks(lease_expires_at)
        WHERE status IN ('loading', 'running', 'cancelling');
    CREATE TABLE task_events (
        task_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        type TEXT NOT NULL,
        data BYTEA NOT NULL,
        PRIMARY KEY (task_id, seq)
    );
    CREATE TABLE idempotency_keys (
        scope TEXT NOT NULL,
        key TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        task_id TEXT NOT NULL,
        expires_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (scope, key)
    );
    CREATE INDEX idem_task ON idempotency_keys(task_id);
    """,
    # 2: responses are looked up by id (GET/DELETE /responses/{id}, previous_response_id)
    """
    CREATE INDEX tasks_response ON tasks(response_id);
    """,
]

def migrate(conn: Conn) -> int:
    """Create/upgrade the schema in the connection's ``search_path``; returns the version."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(current_schema() || '.lmsp'))")
        conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        row = conn.execute("SELECT max(version) FROM schema_version").fetchone()
        current = row[0] if row and row[0] is not None else 0
        for version in range(current + 1, len(MIGRATIONS) + 1):
            conn.execute(MIGRATIONS[version - 1])
            conn.execute("INSERT INTO schema_version(version) VALUES (%s)", (version,))
    return len(MIGRATIONS)


def queued_count(conn: Conn) -> int:
    """Queued tasks, exact until the transaction ends: transactions that check the
    queue limit (any writer, any instance) take this lock, so they count in turn."""
    conn.execute("SELECT pg_advisory_xact_lock(hashtext(current_schema() || '.lmsp.queue'))")
    row = conn.execute("SELECT COUNT(*) FROM tasks WHERE status = 'queued'").fetchone()
    return int(row[0]) if row else 0


class PostgresDialect(Dialect):
    p = "%s"
    lock = " FOR UPDATE"
    skip_locked = " FOR UPDATE SKIP LOCKED"

    def insert_events(self, conn: Any, task_id: str, first_seq: int,
                      events: Sequence[AnyEvent], out: list[CommittedEvent]) -> None:
        rows = numbered(task_id, first_seq, events, out)
        if rows:   # one statement, one round trip, whatever the count
            conn.execute("INSERT INTO task_events(task_id, seq, type, data) SELECT %s, "
                         "unnest(%s::integer[]), unnest(%s::text[]), unnest(%s::bytea[])",
                         (task_id, [r.seq for r in rows], [r.type for r in rows],
                          [r.data for r in rows]))


PG = PostgresDialect()
