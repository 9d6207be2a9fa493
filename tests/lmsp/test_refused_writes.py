"""A task whose writes the store refuses every time (a real trigger on ``task_events``,
SQLite and PostgreSQL): the task cannot even be failed, and the runner, the other
tasks and the process go on (it used to end the process: the error escaped the
runner's task group)."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from tests.bridge.helpers import wait_until
from tests.lmsp.server import LmspServer

pytestmark = pytest.mark.anyio

MARK = "POISON"


def _refuse_its_writes(tmp_path: Path, store_name: str, server: LmspServer) -> None:
    """Every event after the first (the one its creation writes) of a task whose request
    holds ``MARK`` is refused by the database."""
    if store_name == "postgres":
        import psycopg

        with psycopg.connect(server.service.store.url, autocommit=True) as conn:
            conn.execute(f"""
                CREATE FUNCTION refuse_marked() RETURNS trigger AS $$
                BEGIN
                  IF NEW.seq > 0 AND EXISTS (SELECT 1 FROM tasks WHERE id = NEW.task_id
                      AND position('{MARK}'::bytea IN request) > 0) THEN
                    RAISE EXCEPTION 'refused by the test trigger';
                  END IF;
                  RETURN NEW;
                END $$ LANGUAGE plpgsql""")
            conn.execute("CREATE TRIGGER refuse_marked BEFORE INSERT ON task_events "
                         "FOR EACH ROW EXECUTE FUNCTION refuse_marked()")
        return
    with sqlite3.connect(tmp_path / "lmsp.sqlite3") as db:
        db.execute(f"CREATE TRIGGER refuse_marked BEFORE INSERT ON task_events "
                   f"WHEN NEW.seq > 0 AND (SELECT instr(request, CAST('{MARK}' AS BLOB)) "
                   f"FROM tasks WHERE id = NEW.task_id) > 0 "
                   f"BEGIN SELECT RAISE(ABORT, 'refused by the test trigger'); END")


async def test_a_task_whose_writes_are_refused_does_not_end_the_process(
        tmp_path: Path, store_name: str, server: LmspServer,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="acp_server.lmsp")
    _refuse_its_writes(tmp_path, store_name, server)
    poisoned = await server.create(f"{MARK} hi")
    lines = lambda: [r.getMessage() for r in caplog.records  # noqa: E731
                     if "could not be written either" in r.getMessage()]
    fine = await server.create("fine")
    assert (await server.wait(fine["id"]))["status"] == "succeeded"   # the runner goes on
    await wait_until(lambda: bool(lines()))
    assert len(lines()) == 1 and poisoned["id"] in lines()[0]
    assert (await server.get(poisoned["id"]))["status"] not in ("succeeded", "failed")
    again = await server.create("again")   # and the process serves on
    assert (await server.wait(again["id"]))["status"] == "succeeded"
