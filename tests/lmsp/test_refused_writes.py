"""A task whose writes the store refuses every time (a real trigger on ``task_events``,
SQLite and PostgreSQL): the task cannot even be failed, and the runner, the other
tasks and the process go on (it used to end the process: the error escaped the
runner's task group)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.bridge.helpers import wait_until
from tests.lmsp.server import LmspServer
from tests.store.triggers import refuse_rows

pytestmark = pytest.mark.anyio

MARK = "POISON"


def _refuse_its_writes(tmp_path: Path, store_name: str, server: LmspServer) -> None:
    """Every event after the first (the one its creation writes) of a task whose request
    holds ``MARK`` is refused by the database."""
    postgres = store_name == "postgres"
    refuse_rows(url=server.service.store.url if postgres else None,
                sqlite_path=tmp_path / "lmsp.sqlite3", name="refuse_marked",
                table="task_events",
                when=(f"NEW.seq > 0 AND EXISTS (SELECT 1 FROM tasks WHERE id = NEW.task_id "
                      f"AND position('{MARK}'::bytea IN request) > 0)") if postgres else
                (f"NEW.seq > 0 AND (SELECT instr(request, CAST('{MARK}' AS BLOB)) "
                 f"FROM tasks WHERE id = NEW.task_id) > 0"))


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
