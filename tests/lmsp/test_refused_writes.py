"""A task whose writes the store refuses every time (a real trigger on ``task_events``,
SQLite and PostgreSQL): the task cannot even be failed, and the runner, the other
tasks and the process go on (it used to end the process: the error escaped the
runner's task group). A creation the store refuses (a trigger on ``tasks``, also with
PostgreSQL's class 54, which psycopg files with its outages) is a 503 problem, not a
500, and the store stays up for every other client."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.bridge.helpers import wait_until
from tests.lmsp.server import LmspServer, envelope
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


@pytest.mark.parametrize("errcode", ["P0001", "54000"])
async def test_a_creation_the_store_refuses_is_a_503(
        tmp_path: Path, store_name: str, server: LmspServer, errcode: str,
        caplog: pytest.LogCaptureFixture) -> None:
    postgres = store_name == "postgres"
    if errcode != "P0001" and not postgres:
        pytest.skip("PostgreSQL's SQLSTATE classes")
    caplog.set_level(logging.INFO, logger="acp_server.lmsp")
    refuse_rows(url=server.service.store.url if postgres else None,
                sqlite_path=tmp_path / "lmsp.sqlite3", name="refuse_marked", table="tasks",
                when=(f"position('{MARK}'::bytea IN NEW.request) > 0" if postgres else
                      f"instr(NEW.request, CAST('{MARK}' AS BLOB)) > 0"), errcode=errcode)
    refused = await server.client.post("/lmsp/v1/tasks", json=envelope(f"{MARK} hi"))
    assert refused.status_code == 503, refused.text
    assert refused.headers["content-type"].startswith("application/problem+json")
    assert refused.json()["code"] == "store_unavailable"
    assert refused.headers["retry-after"]
    assert any("the store refused the write" in r.getMessage() for r in caplog.records)
    fine = await server.create("fine")   # the store is up for everything else
    assert (await server.wait(fine["id"]))["status"] == "succeeded"
    assert (await server.client.get("/health", params={"deep": "1"})).status_code == 200
