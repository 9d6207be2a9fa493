"""``bridge.settings``: the settings a session's record keeps, applied to its agent
again at restore (real SQLite journal, the reference agent; a real stdio child,
``tests.agents.fixture_agent``, for an agent that hangs on them)."""

from __future__ import annotations

import logging
import shlex
from pathlib import Path

import anyio
import pytest

from acp_server.store.sessions import StoreSessionJournal
from acp_server.store.sqlite import SqliteTaskStore
from bridge.journal import SessionOpened
from bridge.options import BridgeOptions
from bridge.settings import MAX_KEPT, MAX_KEPT_BYTES, keep
from tests.agents import fixture_command
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


async def test_settings_that_hang_at_restore_stay_within_its_bound(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A restored session's kept settings are applied again within what is left of
    ``restore_timeout_ms`` (``sessionRestoreTimeoutMs``): an agent that never answers
    them after its ``session/load`` (``--hang-setters-after-load``) holds the load no
    longer than that (it took one ``agent_request_timeout_ms`` per setting: 20 x 0.5 s
    here, past the 3 s bound); the settings not answered are left as the agent has
    them, one line, and the session runs its prompts."""
    options = BridgeOptions(initialize_timeout_ms=2000, agent_request_timeout_ms=500)
    bound_s = options.restore_timeout_ms / 1000
    assert bound_s == 3.0
    agent = shlex.join(fixture_command("hanging", "--modes", "--hang-setters-after-load"))
    async with local_server(tmp_path, agent=agent, options=options) as srv:
        sid = (await srv.client.post("/session", json={"sessionScope": "thread"})
               ).json()["sessionId"]
        mode = await srv.client.post(f"/session/{sid}/approval-mode", json={"mode": "code"})
        assert mode.status_code == 200, mode.text
        for n in range(19):
            option = await srv.client.post(f"/session/{sid}/config-option",
                                           json={"configId": f"c{n}", "value": "v"})
            assert option.status_code == 200, option.text
        assert len(srv.bridge.get_session(sid).settings) == 20
    with caplog.at_level(logging.WARNING, logger="bridge.settings"):
        async with local_server(tmp_path, agent=agent, options=options, timeout=30) as srv:
            assert srv.bridge.restored == [sid]
            with anyio.fail_after(30):
                loaded = await srv.client.post(f"/session/{sid}/load", json={})
            assert loaded.status_code == 200, loaded.text
            assert loaded.json()["state"]["modes"]["currentModeId"] == "ask"   # the agent's
            with anyio.fail_after(30):
                result = await srv.bridge.send_prompt(sid, [{"type": "text", "text": "mode"}])
            assert result.stop_reason == "end_turn"
            assert list(srv.bridge.get_session(sid).settings) == \
                ["mode", *(f"config:c{n}" for n in range(19))]   # still kept
    lines = [r.getMessage() for r in caplog.records if r.name == "bridge.settings"
             and "ran out" in r.getMessage()]
    # the restore's bound, not each setting's own timeout (20 x 0.5 s, past the 3 s),
    # ended the asking: it says so once, naming the settings it left (the last among
    # them); before, each timed out alone and no such line was written
    assert len(lines) == 1, lines
    assert "config:c18" in lines[0]
