"""The store implementations the LMSP tests run against.

    LMSP_TEST_STORES=sqlite,postgres pytest tests/lmsp     # store tests: each of them
                                                          # HTTP tests: the first one

A new engine (PostgreSQL next) adds a factory here; ``test_store`` is parametrized over
every selected store, and ``running_lmsp`` serves the first.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from acp_server.lmsp.sqlite import SqliteTaskStore
from acp_server.lmsp.store import TaskStore

# (directory, database name, group commit) -> an unopened store
StoreMaker = Callable[[Path, str, bool], TaskStore]

STORE_FACTORIES: dict[str, StoreMaker] = {
    "sqlite": lambda tmp, name, group: SqliteTaskStore(f"sqlite:///{tmp}/{name}",
                                                       group_commit=group),
}


def selected_stores() -> list[str]:
    names = [n.strip() for n in os.environ.get("LMSP_TEST_STORES", "sqlite").split(",")]
    unknown = [n for n in names if n not in STORE_FACTORIES]
    if unknown:
        raise RuntimeError(f"unknown LMSP_TEST_STORES {unknown}; known: {list(STORE_FACTORIES)}")
    return names
