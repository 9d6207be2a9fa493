"""``bridge.settings``: the settings a session's record keeps, applied to its agent
again at restore (real SQLite journal, the reference agent)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from acp_server.store.sessions import StoreSessionJournal
from acp_server.store.sqlite import SqliteTaskStore
from bridge.journal import SessionOpened
from tests.harness import local_server

pytestmark = pytest.mark.anyio

FORGED = "plan\n2026-12-06 00:00:00,000 ERROR acp_server: forged\x1b[31m"


def _store(tmp_path: Path) -> SqliteTaskStore:
    (tmp_path / "state").mkdir(exist_ok=True)
    return SqliteTaskStore(str(tmp_path / "state" / "lmsp.sqlite3"))


async def test_a_setting_refused_at_restore_is_one_log_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A kept setting the agent refuses when applied again is logged and left as the
    agent has it; the line is one line whatever the setting's id and the agent's message
    say (``bridge.loggable``: both quote what a client chose)."""
    async with _store(tmp_path) as store, StoreSessionJournal(store) as journal:
        journal.append(SessionOpened(
            session_id="s", agent="reference", cwd=str(tmp_path), created_at=1.0,
            epoch="e-s", settings={
                "mode": ["session/set_mode", {"modeId": FORGED}],
                "config:x\ny": ["session/set_config_option",
                                {"configId": "x\ny", "value": "high"}]}))
        await journal.wait(journal.appended)
    with caplog.at_level(logging.WARNING, logger="bridge.settings"):
        async with local_server(tmp_path, lmsp_store=_store(tmp_path)) as srv:
            assert srv.bridge.restored == ["s"]
            state = await srv.bridge.agent_state("s")   # its agent side restored
            assert state["modes"]["currentModeId"] == "default"   # left as the agent has it
    lines = [r.getMessage() for r in caplog.records if r.name == "bridge.settings"]
    assert len(lines) == 2, lines
    for line in lines:
        assert line.isprintable(), line
    assert "plan\\n2026" in lines[0] and "\\x1b[31m" in lines[0]
    assert "config:x\\ny" in lines[1]
