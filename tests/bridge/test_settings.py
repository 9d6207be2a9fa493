"""``bridge.settings``: the settings a session's record keeps, applied to its agent
again at restore (real SQLite journal, the reference agent)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from acp_server.store.sessions import StoreSessionJournal
from acp_server.store.sqlite import SqliteTaskStore
from bridge.journal import SessionOpened
from bridge.settings import MAX_KEPT, MAX_KEPT_BYTES, keep
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


async def test_a_malformed_kept_setting_is_dropped_and_the_rest_applied(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """An entry that is not ``[method, params]`` (a record written otherwise) is dropped
    with a line, the others are applied; it made the whole session not restorable."""
    async with _store(tmp_path) as store, StoreSessionJournal(store) as journal:
        journal.append(SessionOpened(
            session_id="s", agent="reference", cwd=str(tmp_path), created_at=1.0,
            epoch="e-s", settings={
                "config:a": "not a setting",
                "config:b": ["session/delete", {}],   # not a setter: never asked
                "mode": ["session/set_mode", {"modeId": "plan"}]}))
        await journal.wait(journal.appended)
    with caplog.at_level(logging.WARNING, logger="bridge.settings"):
        async with local_server(tmp_path, lmsp_store=_store(tmp_path)) as srv:
            assert srv.bridge.restored == ["s"]
            state = await srv.bridge.agent_state("s")
            assert state["modes"]["currentModeId"] == "plan"
            assert list(srv.bridge.get_session("s").settings) == ["mode"]
    lines = [r.getMessage() for r in caplog.records if r.name == "bridge.settings"]
    assert [("config:a" in line, "config:b" in line) for line in lines] == \
        [(True, False), (False, True)], lines


def test_keep_bounds_what_a_record_keeps(caplog: pytest.LogCaptureFixture) -> None:
    """At most ``MAX_KEPT`` settings and ``MAX_KEPT_BYTES`` of params each: an agent that
    accepts any ``configId`` does not let a client grow the record without end (it is
    rewritten whole at every setter). A key kept already is replaced whatever the count."""
    settings: dict[str, object] = {}
    method = "session/set_config_option"
    for n in range(MAX_KEPT):
        assert keep(settings, f"config:{n}", method, {"configId": str(n), "value": n}, "s")
    assert not keep(settings, "config:one-more", method, {"configId": "one-more"}, "s")
    assert keep(settings, "config:0", method, {"configId": "0", "value": "again"}, "s")
    assert settings["config:0"] == [method, {"configId": "0", "value": "again"}]
    assert len(settings) == MAX_KEPT
    big = {"configId": "1", "value": "x" * MAX_KEPT_BYTES}
    assert not keep(settings, "config:1", method, big, "s")
    assert settings["config:1"] == [method, {"configId": "1", "value": 1}]   # unchanged
    assert len([r for r in caplog.records if r.name == "bridge.settings"]) == 2
