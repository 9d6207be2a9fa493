"""A journal row that cannot be decoded is logged and skipped, never a crash of the
start-up, on SQLite and PostgreSQL: a session's record, a prompt's record, a prompt's
terminal, an event's envelope; binary garbage, values SQLite keeps as TEXT, and
well-formed JSON whose payload has the wrong shape (a ``permission_request`` whose
``data`` is a string, ``null``, or has a list for its ``requestId``). A real
``acp-server serve`` killed with SIGKILL mid-turn starts again with its rows corrupted;
in process, closed sessions and the ended-sessions listing too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from acp_server.rest.workspace import workspace_id
from tests.harness import ServeProcess, local_server
from tests.lmsp import stores
from tests.store.segment_rows import rewrite_event
from tests.store.test_journal_refusals import _run_sql
from tests.store.test_session_journal import _settled
from tests.store.test_session_restart import _flags, _is, _prompt, read_events

pytestmark = pytest.mark.anyio


def _text(store_name: str) -> str:
    """A statement's placeholder for a str parameter stored as it is: SQLite keeps it as
    TEXT in the BLOB column; PostgreSQL's ``bytea`` takes its UTF-8 bytes."""
    return "convert_to(?, 'UTF8')" if store_name == "postgres" else "?"


def _request(event_id: int, data: Any, prompt_id: str | None = None) -> str:
    """A ``permission_request`` envelope, well-formed JSON, with ``data`` as given."""
    return json.dumps({"id": event_id, "v": 1, "type": "permission_request",
                       "promptId": prompt_id, "data": data,
                       "_meta": {"serverTimestamp": 1_700_000_000_000}})


def _url(flags: list[str]) -> str | None:
    return flags[flags.index("--store") + 1] if "--store" in flags else None


@pytest.mark.parametrize("anyio_backend", ["asyncio"])   # the client side only
async def test_unreadable_rows_after_kill_9_are_skipped_and_the_server_starts(
        tmp_path: Path, store_name: str) -> None:
    flags = _flags(tmp_path, store_name)
    url = _url(flags)
    child = ServeProcess(tmp_path, *flags).start()
    try:
        async with httpx.AsyncClient(base_url=child.base_url, timeout=10) as client:
            sid = (await client.post("/session", json={"sessionScope": "thread"})
                   ).json()["sessionId"]
            first = (await client.post(f"/session/{sid}/prompt", json=_prompt("hello"))
                     ).json()["promptId"]
            await read_events(client, sid, _is("turn_complete", first), last_event_id=0)
            for pid, text in (("run1", "/sleep 30s long"), ("q1", "queued one")):
                answer = await client.post(f"/session/{sid}/prompt",
                                           json={**_prompt(text), "promptId": pid})
                assert answer.status_code == 202
            await read_events(client, sid, _is("session_update", "run1"), last_event_id=0)
            asks = (await client.post("/session", json={"sessionScope": "thread"})).json()
            ask = asks["sessionId"]
            answer = await client.post(f"/session/{ask}/prompt", json={
                **_prompt("/permission hi"), "promptId": "perm1"})
            assert answer.status_code == 202
            await read_events(client, ask, lambda e: e["type"] == "permission_request",
                              last_event_id=0)   # committed: the stream shows it
        child.kill()
        value = _text(store_name)
        _run_sql(tmp_path, store_name, url, f"UPDATE session_prompts SET record = {value} "
                 "WHERE prompt_id = 'q1'", ("garbage",))
        _run_sql(tmp_path, store_name, url, f"UPDATE session_prompts SET terminal = {value} "
                 "WHERE prompt_id = ?", ("garbage", first))
        rewrite_event(lambda s, p=(): _run_sql(tmp_path, store_name, url, s, p), ask,
                      lambda e: e[1] == "permission_request",
                      _request(2, {"sessionId": 5, "requestId": [1]}, "perm1"))
        child.start()   # it starts: no crash
        async with httpx.AsyncClient(base_url=child.base_url, timeout=10) as client:
            listed = (await client.get(f"/workspace/{workspace_id(str(tmp_path))}/sessions")
                      ).json()["sessions"]
            assert {s["sessionId"] for s in listed} == {sid, ask}
            loaded = (await client.post(f"/session/{sid}/load", json={})).json()
            terminals = {t["promptId"]: t for t in loaded["promptTerminals"]}
            # the running prompt failed as interrupted; the unreadable terminal and
            # the unreadable queued prompt are skipped (never run)
            assert list(terminals) == ["run1"]
            assert terminals["run1"]["errorCode"] == "server_restarted"
            status = (await client.get(f"/session/{sid}/status")).json()
            assert status["pendingPrompts"] == 0
            # the request's event is skipped: the session is whole, its prompt
            # (acknowledged, running) failed as interrupted, and a new epoch says the
            # loss; no half-restored session
            status = (await client.get(f"/session/{ask}/status")).json()
            assert status["eventEpoch"] != asks["eventEpoch"]
            assert not status["isWaitingForPermission"] and status["pendingPrompts"] == 0
            loaded = (await client.post(f"/session/{ask}/load", json={})).json()
            assert [(t["promptId"], t["errorCode"]) for t in loaded["promptTerminals"]] == [
                ("perm1", "server_restarted")]
            after = await client.post(f"/session/{ask}/prompt", json=_prompt("again"))
            assert after.status_code == 202   # and it works on
            await read_events(client, ask, _is("turn_complete", after.json()["promptId"]),
                              last_event_id=0)
        log = child.stderr_text()
        assert "prompt q1 of session" in log and "could not be restored" not in log
        assert f"event 2 of session {ask} is unreadable" in log
        assert "Traceback" not in log
    finally:
        child.stop()


async def test_unreadable_rows_of_every_kind_are_skipped(tmp_path: Path,
                                                         store_name: str) -> None:
    settings: dict[str, Any] = {}
    url = None
    if store_name == "postgres":
        url = stores.postgres_url_for(tmp_path, "journal")
        settings["store"] = url
    names = ("no_data", "null_data", "text_record", "bad_terminal", "closed", "closed_kept")
    ids: dict[str, str] = {}
    epochs: dict[str, str] = {}
    async with local_server(tmp_path, **settings) as srv:
        for name in names:
            made = (await srv.client.post("/session", json={"sessionScope": "thread"})).json()
            ids[name], epochs[name] = made["sessionId"], made["eventEpoch"]
            accepted = await srv.client.post(f"/session/{ids[name]}/prompt",
                                             json=_prompt("/chunks 3 x"))
            await _settled(srv.client, ids[name], accepted.json()["promptId"])
        for name in ("closed", "closed_kept"):
            await srv.bridge.close_session(ids[name], reason="idle_timeout")
    value = _text(store_name)

    def run(statement: str, *params: Any) -> None:
        _run_sql(tmp_path, store_name, url, statement, params)

    def sql(statement: str, params: tuple[Any, ...] = ()) -> list[Any]:
        return _run_sql(tmp_path, store_name, url, statement, params)

    rewrite_event(sql, ids["no_data"], lambda e: e[0] == 2, _request(2, "x"))
    rewrite_event(sql, ids["null_data"], lambda e: e[0] == 3, _request(3, None))
    for name in ("text_record", "closed"):
        run(f"UPDATE sessions SET record = {value} WHERE id = ?", "garbage", ids[name])
    run(f"UPDATE session_prompts SET terminal = {value} WHERE session_id = ?", "garbage",
        ids["bad_terminal"])
    async with local_server(tmp_path, **settings) as srv:
        live = [s.session_id for s in srv.bridge.list_sessions()]
        assert live == [ids["no_data"], ids["null_data"], ids["bad_terminal"]]
        for name in ("no_data", "null_data"):   # an event lost: a new epoch, no silent gap
            assert srv.bridge.session_status(ids[name]).event_epoch != epochs[name]
        assert srv.bridge.session_status(ids["bad_terminal"]).event_epoch == \
            epochs["bad_terminal"]
        loaded = (await srv.client.post(f"/session/{ids['bad_terminal']}/load", json={})
                  ).json()
        assert loaded["promptTerminals"] == []
        wid = workspace_id(str(tmp_path))
        ended = (await srv.client.get(f"/workspace/{wid}/ended-sessions")).json()
        assert [s["sessionId"] for s in ended["sessions"]] == [ids["closed_kept"]]
        gone = await srv.client.post(f"/session/{ids['text_record']}/load", json={})
        if store_name == "postgres":   # its lease stays: never a fresh session over it
            assert gone.json()["code"] == "session_busy_elsewhere", gone.text
        else:
            assert gone.status_code == 404, gone.text
        for name in ("no_data", "bad_terminal"):   # they work on
            accepted = await srv.client.post(f"/session/{ids[name]}/prompt",
                                             json=_prompt("on"))
            with anyio.fail_after(20):
                await _settled(srv.client, ids[name], accepted.json()["promptId"])


async def test_text_that_is_not_utf8_is_skipped_not_the_start(tmp_path: Path) -> None:
    """SQLite only (PostgreSQL's columns are bytea): a record overwritten with TEXT that
    is not UTF-8 failed the whole start-up read as Python's sqlite3 fetched the row."""
    ids: list[str] = []
    async with local_server(tmp_path) as srv:
        for _ in range(2):
            made = (await srv.client.post("/session", json={"sessionScope": "thread"})).json()
            ids.append(made["sessionId"])
            accepted = await srv.client.post(f"/session/{ids[-1]}/prompt",
                                             json=_prompt("/chunks 2 x"))
            await _settled(srv.client, ids[-1], accepted.json()["promptId"])
    _run_sql(tmp_path, "sqlite", None,
             "UPDATE sessions SET record = CAST(x'c1ff' AS TEXT) WHERE id = ?", (ids[0],))
    _run_sql(tmp_path, "sqlite", None, "UPDATE session_segments SET events = "   # event 2's
             "CAST(x'7bc1ff' AS TEXT) WHERE session_id = ? AND first_id <= 2 "
             "AND last_id >= 2", (ids[1],))
    async with local_server(tmp_path) as srv:
        assert [s.session_id for s in srv.bridge.list_sessions()] == [ids[1]]
        accepted = await srv.client.post(f"/session/{ids[1]}/prompt", json=_prompt("on"))
        with anyio.fail_after(20):
            await _settled(srv.client, ids[1], accepted.json()["promptId"])
