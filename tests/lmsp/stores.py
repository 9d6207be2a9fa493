"""The store implementations the LMSP tests run against.

    ACP_SERVER_TEST_POSTGRES=postgresql://postgres@127.0.0.1:54329/acp_test pytest tests/lmsp
    LMSP_TEST_STORES=sqlite pytest tests/lmsp        # only SQLite

Store tests (``store_factory``) and the HTTP tests that use the ``store_name`` fixture
run once per selected store (default ``sqlite,postgres``). ``postgres`` is skipped,
with the reason, unless ``ACP_SERVER_TEST_POSTGRES`` names a reachable server
(``tests/lmsp/pg.sh start`` starts one). Each test gets its own PostgreSQL *schema*
(named after its tmp dir, so a reopened store sees the same data, and after this
process, so a schema left over by a killed run on the same tmp path is never reused),
dropped at the end of the session.

Parallel runs (pytest-xdist): every worker is its own process with its own tmp dirs, so
its schema names are its own; ``CREATED_SCHEMAS`` is per process, and ``drop_schemas()``
at a worker's session end drops only the schemas that worker created.
"""

from __future__ import annotations

import hashlib
import os
import uuid
import urllib.parse
from collections.abc import Callable
from pathlib import Path

import pytest

from acp_server.store.postgres import PostgresTaskStore
from acp_server.store.sqlite import SqliteTaskStore
from acp_server.store.tasks import TaskStore

# (directory, database name, group commit) -> an unopened store
StoreMaker = Callable[[Path, str, bool], TaskStore]
POSTGRES_ENV = "ACP_SERVER_TEST_POSTGRES"
SKIP_POSTGRES = (f"PostgreSQL store tests need {POSTGRES_ENV}=postgresql://… "
                 f"(start a throwaway cluster with tests/lmsp/pg.sh start DIR)")
CREATED_SCHEMAS: set[str] = set()   # by this process: drop_schemas() drops these only
_RUN = uuid.uuid4().hex   # this process's: schema names of two runs never meet
# Shorter than production (30 s / 10 s) so the lease tests stay fast.
TEST_LEASE_S, TEST_RENEW_S, TEST_POLL_S = 3.0, 0.5, 0.5


def lease_flags() -> list[str]:
    """``acp-server serve`` flags for the test lease timings."""
    return ["--store-lease-ms", str(int(TEST_LEASE_S * 1000)),
            "--store-renew-ms", str(int(TEST_RENEW_S * 1000)),
            "--store-poll-ms", str(int(TEST_POLL_S * 1000))]


def postgres_dsn() -> str | None:
    return os.environ.get(POSTGRES_ENV) or None


def schema_url(dsn: str, schema: str) -> str:
    """``dsn`` with ``search_path`` set to ``schema`` (created when missing)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
    CREATED_SCHEMAS.add(schema)
    parts = urllib.parse.urlsplit(dsn)
    query = urllib.parse.parse_qsl(parts.query)
    query.append(("options", f"-csearch_path={schema}"))
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))


def postgres_url_for(tmp: Path, name: str) -> str:
    dsn = postgres_dsn()
    assert dsn, SKIP_POSTGRES
    digest = hashlib.sha1(f"{_RUN}/{tmp}/{name}".encode()).hexdigest()[:16]
    return schema_url(dsn, f"t_{digest}")


def postgres_url_or_skip(tmp: Path, name: str) -> str:
    """``postgres_url_for``, or the test skipped when no PostgreSQL is configured."""
    if not postgres_dsn():
        pytest.skip(SKIP_POSTGRES)
    return postgres_url_for(tmp, name)


def drop_schemas() -> None:
    dsn = postgres_dsn()
    if not dsn or not CREATED_SCHEMAS:
        return
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        for schema in sorted(CREATED_SCHEMAS):
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    CREATED_SCHEMAS.clear()


def _postgres(tmp: Path, name: str, group: bool) -> TaskStore:
    return PostgresTaskStore(postgres_url_for(tmp, name), group_commit=group,
                             lease_s=TEST_LEASE_S, renew_s=TEST_RENEW_S, poll_s=TEST_POLL_S)


STORE_FACTORIES: dict[str, StoreMaker] = {
    "sqlite": lambda tmp, name, group: SqliteTaskStore(f"sqlite:///{tmp}/{name}",
                                                       group_commit=group),
    "postgres": _postgres,
}
# The store ``running_lmsp`` serves; the ``store_name`` fixture sets it per test.
current = {"name": "sqlite"}


def selected_stores() -> list[str]:
    names = [n.strip() for n in os.environ.get("LMSP_TEST_STORES", "sqlite,postgres").split(",")
             if n.strip()]
    unknown = [n for n in names if n not in STORE_FACTORIES]
    if unknown:
        raise RuntimeError(f"unknown LMSP_TEST_STORES {unknown}; known: {list(STORE_FACTORIES)}")
    return names
