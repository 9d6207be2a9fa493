"""The store's schema, one versioned list for both engines.

    version = migrate_sqlite(conn)        # PRAGMA user_version; in one transaction
    version = migrate_postgres(conn)      # schema_version rows; under an advisory lock

Contracts:

* ``MIGRATIONS[n - 1]`` takes the schema from version ``n - 1`` to ``n`` on both engines
  (``Migration.sqlite`` and ``Migration.postgres``), and is never edited once released:
  a new table (the session journal's, say) is a new entry at the end. A state dir or a
  database at an older version is brought up to date at start-up, atomically; one at a
  newer version than this code knows is refused (``SchemaTooNewError``).
* SQLite keeps the version in ``PRAGMA user_version``; files written before the
  versioning (version 0 with the tables present) are adopted as is, since every SQLite
  statement of the first entries is ``IF NOT EXISTS``.
* PostgreSQL keeps every applied version in ``schema_version`` (one row each), inside
  the connection's ``search_path`` schema, under ``pg_advisory_xact_lock`` so several
  instances starting together migrate once.
* A migration may also rewrite rows (``Migration.then``: a function of the connection
  and whether it is PostgreSQL, run after its statements in the same transaction):
  migration 7 moves each branch's seed out of its session record into its own column,
  migration 8 a session's event rows into segment rows (``acp_server.store.segments``).
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Callable
from typing import Any

import msgspec

from acp_server.store.segments import segments_apart


@dataclasses.dataclass(frozen=True, slots=True)
class Migration:
    name: str
    sqlite: str
    postgres: str
    # rows rewritten after the statements, in their transaction: (connection, postgres)
    then: Callable[[Any, bool], None] | None = None


class SchemaTooNewError(RuntimeError):
    """The store was written by a newer acp-server (its version is past ``MIGRATIONS``)."""


_SQLITE_TASKS = """CREATE TABLE IF NOT EXISTS tasks (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,      -- creation order
    id TEXT NOT NULL UNIQUE,
    response_id TEXT NOT NULL,
    status TEXT NOT NULL,
    on_restart TEXT NOT NULL,
    model TEXT NOT NULL,
    principal TEXT NOT NULL,
    request BLOB NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    finished_at REAL,
    next_seq INTEGER NOT NULL DEFAULT 0,
    attempt INTEGER NOT NULL DEFAULT 0,
    response BLOB,
    error BLOB,
    events_purged INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS tasks_status ON tasks(status, seq);
CREATE INDEX IF NOT EXISTS tasks_finished ON tasks(finished_at) WHERE finished_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS task_events (
    task_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    type TEXT NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (task_id, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS idempotency_keys (
    scope TEXT NOT NULL,
    key TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    task_id TEXT NOT NULL,
    expires_at REAL NOT NULL,
    PRIMARY KEY (scope, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS idem_task ON idempotency_keys(task_id);
"""

_POSTGRES_TASKS = """    CREATE TABLE tasks (
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
"""

_SQLITE_PRINCIPALS = """CREATE TABLE IF NOT EXISTS tokens (
    id TEXT PRIMARY KEY,                        -- the public id, in the token itself
    name TEXT NOT NULL,                         -- the principal
    secret_sha256 TEXT NOT NULL,                -- hex SHA-256 of the secret part
    scopes TEXT NOT NULL,                       -- comma-separated: read, prompt, admin
    rate_class TEXT NOT NULL,
    created_at REAL NOT NULL,
    created_by TEXT NOT NULL,
    expires_at REAL,
    last_used_at REAL,
    revoked_at REAL,
    revoked_by TEXT
);
CREATE UNIQUE INDEX IF NOT EXISTS tokens_live_name ON tokens(name) WHERE revoked_at IS NULL;
CREATE TABLE IF NOT EXISTS audit (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    principal TEXT NOT NULL,
    action TEXT NOT NULL,
    target TEXT,
    client TEXT,
    detail TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_principal ON audit(principal, seq);
CREATE INDEX IF NOT EXISTS audit_at ON audit(at);
"""

_POSTGRES_PRINCIPALS = """    CREATE TABLE tokens (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        secret_sha256 TEXT NOT NULL,
        scopes TEXT NOT NULL,
        rate_class TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        created_by TEXT NOT NULL,
        expires_at DOUBLE PRECISION,
        last_used_at DOUBLE PRECISION,
        revoked_at DOUBLE PRECISION,
        revoked_by TEXT
    );
    CREATE UNIQUE INDEX tokens_live_name ON tokens(name) WHERE revoked_at IS NULL;
    CREATE TABLE audit (
        seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        at DOUBLE PRECISION NOT NULL,
        principal TEXT NOT NULL,
        action TEXT NOT NULL,
        target TEXT,
        client TEXT,
        detail TEXT NOT NULL
    );
    CREATE INDEX audit_principal ON audit(principal, seq);
    CREATE INDEX audit_at ON audit(at);
"""

def _seeds_apart(conn: Any, postgres: bool) -> None:
    """Migration 7: a branch's seed (``SessionOpened.seed``, its parent's transcript, up
    to 1 MiB) moves out of its session record into ``sessions.seed`` (UTF-8), which
    only the restore reads: every other reader of the record (the fleet's listing of
    open sessions above all) reads a few hundred bytes a session again. SQLite adds the
    column here, when it is missing (a file of version 0 runs every migration again).
    Records without a seed are left as they are, and so is one that cannot be decoded
    (its session is skipped at restore, logged, as before)."""
    mark = "%s" if postgres else "?"
    if not postgres and "seed" not in [row[1] for row in conn.execute(
            "PRAGMA table_info(sessions)").fetchall()]:
        conn.execute("ALTER TABLE sessions ADD COLUMN seed BLOB")
    # as bytes: SQLite hands a TEXT value (a record overwritten by hand) to Python as
    # UTF-8 and raises on one that is not, which would fail the start
    record = "record" if postgres else "CAST(record AS BLOB)"
    after, batch = "", 64   # at most 64 MiB of seeds read at a time
    while True:
        rows = conn.execute(f"SELECT id, {record} FROM sessions WHERE id > {mark} "
                            f"ORDER BY id LIMIT {batch}", (after,)).fetchall()
        for sid, blob in rows:
            moved = _without_seed(blob)
            if moved is not None:
                conn.execute(f"UPDATE sessions SET record = {mark}, seed = {mark} "
                             f"WHERE id = {mark}", (*moved, sid))
        if len(rows) < batch:
            return
        after = rows[-1][0]


def _without_seed(blob: Any) -> tuple[bytes, bytes] | None:
    """(the record without its seed, the seed's UTF-8) of a stored session record that
    has one; ``None`` for any other (no seed, not a record, not decodable)."""
    if isinstance(blob, (bytearray, memoryview)):
        blob = bytes(blob)
    if not isinstance(blob, bytes):
        return None
    json = blob[:1] == b"{"   # a record msgpack could not hold (``session_writes``)
    try:
        record = msgspec.json.decode(blob) if json else msgspec.msgpack.decode(blob)
    except msgspec.MsgspecError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("seed"), str):
        return None
    seed = record.pop("seed")
    encoded = msgspec.json.encode(record) if json else msgspec.msgpack.encode(record)
    return encoded, seed.encode("utf-8", "surrogatepass")


MIGRATIONS: list[Migration] = [
    # 1: LMSP tasks, their events and idempotency keys (PostgreSQL: plus ownership)
    Migration("lmsp tasks", _SQLITE_TASKS, _POSTGRES_TASKS),
    # 2: responses are looked up by id (GET/DELETE /responses/{id}, previous_response_id)
    Migration("lmsp responses by id",
              "CREATE INDEX IF NOT EXISTS tasks_response ON tasks(response_id);",
              "CREATE INDEX tasks_response ON tasks(response_id);"),
    # 3: the session journal (acp_server.store.sessions, issue #23)
    Migration("session journal", """CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    record BLOB NOT NULL,
    closed_at REAL,
    owner TEXT
);
CREATE INDEX IF NOT EXISTS sessions_closed ON sessions(closed_at) WHERE closed_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS session_prompts (
    session_id TEXT NOT NULL,
    prompt_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    record BLOB NOT NULL,
    terminal BLOB,
    settled_at INTEGER,
    PRIMARY KEY (session_id, prompt_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS session_events (
    session_id TEXT NOT NULL,
    id INTEGER NOT NULL,
    type TEXT NOT NULL,
    prompt_id TEXT,
    envelope BLOB NOT NULL,
    PRIMARY KEY (session_id, id)
) WITHOUT ROWID;
""", """    CREATE TABLE sessions (
        id TEXT PRIMARY KEY,
        created_at DOUBLE PRECISION NOT NULL,
        record BYTEA NOT NULL,
        closed_at DOUBLE PRECISION,
        owner TEXT
    );
    CREATE INDEX sessions_closed ON sessions(closed_at) WHERE closed_at IS NOT NULL;
    CREATE TABLE session_prompts (
        session_id TEXT NOT NULL,
        prompt_id TEXT NOT NULL,
        seq BIGINT NOT NULL,
        record BYTEA NOT NULL,
        terminal BYTEA,
        settled_at BIGINT,
        PRIMARY KEY (session_id, prompt_id)
    );
    CREATE TABLE session_events (
        session_id TEXT NOT NULL,
        id BIGINT NOT NULL,
        type TEXT NOT NULL,
        prompt_id TEXT,
        envelope BYTEA NOT NULL,
        PRIMARY KEY (session_id, id)
    );
"""),
    # 4: principals: stored bearer tokens (hashed) and the audit log (acp_server/store/
    #    tokens.py, audit.py)
    Migration("tokens and audit", _SQLITE_PRINCIPALS, _POSTGRES_PRINCIPALS),
    # 5: sessions across instances (issue #24, acp_server/store/leases.py): who runs each
    #    session (a lease with a fencing token) and where each instance is reached. On
    #    SQLite (one instance) the tables exist and stay empty.
    Migration("session leases and instances", """CREATE TABLE IF NOT EXISTS session_leases (
    session_id TEXT PRIMARY KEY,
    instance TEXT NOT NULL,
    token INTEGER NOT NULL,
    expires_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS instances (
    id TEXT PRIMARY KEY,
    url TEXT,
    heartbeat_at REAL NOT NULL,
    started_at REAL NOT NULL
);
""", """    CREATE TABLE session_leases (
        session_id TEXT PRIMARY KEY,
        instance TEXT NOT NULL,
        token BIGINT NOT NULL,              -- fencing: +1 at every take-over
        expires_at DOUBLE PRECISION NOT NULL
    );
    CREATE INDEX session_leases_instance ON session_leases(instance);
    CREATE INDEX session_leases_expiry ON session_leases(expires_at);
    CREATE TABLE instances (
        id TEXT PRIMARY KEY,
        url TEXT,                           -- advertised base URL (forwards)
        heartbeat_at DOUBLE PRECISION NOT NULL,
        started_at DOUBLE PRECISION NOT NULL
    );
"""),
    # 6: the fleet's shared secret (acp_server/store/leases.py): a request one instance
    #    forwards to another carries the caller's address, proved with it
    Migration("fleet secret", """CREATE TABLE IF NOT EXISTS fleet_secret (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    secret BLOB NOT NULL
);
""", """    CREATE TABLE fleet_secret (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        secret BYTEA NOT NULL
    );
"""),
    # 7: a branch's seed (its parent's transcript at the branch, up to 1 MiB) in a
    #    column of its own, read by the restore alone (``_seeds_apart``)
    Migration("session seeds apart", "",
              "ALTER TABLE sessions ADD COLUMN seed BYTEA;", then=_seeds_apart),
    # 8: a session's events of one commit in one row (``acp_server.store.segments``):
    #    ``session_events`` (one row an event) converted, then dropped
    Migration("session event segments", """CREATE TABLE IF NOT EXISTS session_segments (
    session_id TEXT NOT NULL,
    last_id INTEGER NOT NULL,
    first_id INTEGER NOT NULL,
    size INTEGER NOT NULL,
    types TEXT NOT NULL,
    prompts TEXT NOT NULL,
    events BLOB NOT NULL,
    PRIMARY KEY (session_id, last_id)
) WITHOUT ROWID;
""", """    CREATE TABLE session_segments (
        session_id TEXT NOT NULL,
        last_id BIGINT NOT NULL,
        first_id BIGINT NOT NULL,
        size BIGINT NOT NULL,
        types TEXT NOT NULL,
        prompts TEXT NOT NULL,
        events BYTEA NOT NULL,
        PRIMARY KEY (session_id, last_id)
    );
""", then=segments_apart),
]


def _too_new(current: int) -> SchemaTooNewError:
    return SchemaTooNewError(f"the store is at schema version {current}; this acp-server "
                             f"knows versions up to {len(MIGRATIONS)}")


def migrate_sqlite(conn: sqlite3.Connection) -> int:
    """Bring a SQLite file (autocommit connection) up to date; returns the version."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        current = conn.execute("PRAGMA user_version").fetchone()[0]
        if current > len(MIGRATIONS):
            raise _too_new(current)
        for version in range(current + 1, len(MIGRATIONS) + 1):
            migration = MIGRATIONS[version - 1]
            for statement in _statements(migration.sqlite):
                conn.execute(statement)
            if migration.then is not None:
                migration.then(conn, False)
        conn.execute(f"PRAGMA user_version = {len(MIGRATIONS)}")
        conn.execute("COMMIT")
    except BaseException:
        # SQLite rolls a transaction back by itself on some errors (a full disk): a
        # ROLLBACK then fails, and its error would hide the cause
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return len(MIGRATIONS)


def _statements(script: str) -> list[str]:
    """A script's statements (``executescript`` would COMMIT the open transaction)."""
    return [s.strip() for s in script.split(";") if s.strip()]


def migrate_postgres(conn: Any) -> int:
    """Create/upgrade the schema in the connection's ``search_path``; returns the version."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(current_schema() || '.lmsp'))")
        conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        row = conn.execute("SELECT max(version) FROM schema_version").fetchone()
        current = row[0] if row and row[0] is not None else 0
        if current > len(MIGRATIONS):
            raise _too_new(current)
        for version in range(current + 1, len(MIGRATIONS) + 1):
            migration = MIGRATIONS[version - 1]
            conn.execute(migration.postgres)
            if migration.then is not None:
                migration.then(conn, True)
            conn.execute("INSERT INTO schema_version(version) VALUES (%s)", (version,))
    return len(MIGRATIONS)
