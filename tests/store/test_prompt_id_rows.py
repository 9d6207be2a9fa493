"""A prompt id admitted again (a client's own id, its first admission refused) names a
new prompt: its journal row starts over, unsettled, on a real SQLite or PostgreSQL
store, also when the earlier prompt, its end and the new one ride in one commit (one
statement never touches a row twice: PostgreSQL refuses that)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from acp_server.store.sessions import StoreSessionJournal
from bridge.journal import PromptAccepted, PromptSettled
from tests.acp_http.server import request, running_acp_server, text
from tests.acp_http.test_v1 import RESUMABLE
from tests.acp_http.wsclient import ws_connect
from tests.harness import local_server
from tests.store.faults import faulty
from tests.store.test_journal_isolation import _opened, _store
from tests.store.test_journal_refusals import _run_sql
from tests.store.test_session_journal import _settled as turn_ended

pytestmark = pytest.mark.anyio


def _accepted(n: int) -> PromptAccepted:
    return PromptAccepted(session_id="s", prompt_id="p1", prompt=[{"n": n}], queued_at_ms=n,
                          seq=n, last_event_id=n, epoch="e")


def _settled(terminal: str, code: str | None = None) -> PromptSettled:
    return PromptSettled(session_id="s", prompt_id="p1", terminal=terminal, at=1,
                         error_code=code)


async def test_an_id_admitted_again_starts_its_row_over(tmp_path: Path,
                                                        store_name: str) -> None:
    store, url = _store(tmp_path, store_name)

    def row() -> tuple[object, ...]:
        rows = _run_sql(tmp_path, store_name, url,
                        "SELECT seq, terminal IS NULL, settled_at IS NULL FROM session_prompts "
                        "WHERE session_id = 's' AND prompt_id = 'p1'")
        assert len(rows) == 1
        return tuple(rows[0])

    async with store, StoreSessionJournal(store) as journal:
        journal.append(_opened("s"))
        journal.append(_accepted(1))   # refused and admitted again, in one commit
        journal.append(_settled("failed", "session_not_restorable"))
        await journal.wait(journal.append(_accepted(2)))
        assert row() == (2, True, True)
        await journal.wait(journal.append(_settled("completed")))
        assert row() == (2, False, False)
        await journal.wait(journal.append(_accepted(3)))   # a later commit
        assert row() == (3, True, True)
        state = await journal.read("s")
        assert state is not None
        assert [p.seq for p in state.unsettled] == [3]   # runs after a restart
        assert state.unsettled[0].last_event_id == 3 and state.unsettled[0].epoch == "e"
        assert state.terminals == []


async def test_a_prompt_refused_at_its_commit_runs_when_sent_again(tmp_path: Path,
                                                                    store_name: str) -> None:
    """Its 503 said nothing was acknowledged: sent again under its id once the store is
    back, it is admitted (not answered as the failure it was), runs, and has one
    terminal, also after a restart."""
    named = {"prompt": [{"type": "text", "text": "/chunks 1 kept"}], "promptId": "r-1"}
    store = faulty(tmp_path)
    async with local_server(tmp_path, lmsp_store=store) as srv:
        client = srv.client
        sid = (await client.post("/session", json={"sessionScope": "thread"})).json()["sessionId"]
        store.faults.on()
        refused = await client.post(f"/session/{sid}/prompt", json=named)
        assert refused.status_code == 503 and refused.json()["code"] == "store_unavailable"
        store.faults.off()
        again = await client.post(f"/session/{sid}/prompt", json=named)
        assert again.status_code == 202, again.text
        assert "idempotent-replayed" not in again.headers
        await turn_ended(client, sid, "r-1")
        terminals = (await client.post(f"/session/{sid}/load", json={})).json()[
            "promptTerminals"]
        assert [(t["promptId"], t["terminal"]) for t in terminals] == [("r-1", "completed")]
    async with local_server(tmp_path, lmsp_store=faulty(tmp_path)) as srv:
        terminals = (await srv.client.post(f"/session/{sid}/load", json={})).json()[
            "promptTerminals"]
        assert [(t["promptId"], t["terminal"]) for t in terminals] == [("r-1", "completed")]
        replayed = await srv.client.post(f"/session/{sid}/prompt", json=named)
        assert replayed.status_code == 200 and replayed.json()["terminal"] == "completed"


async def test_the_same_on_acp(tmp_path: Path, store_name: str) -> None:
    """``/acp`` over WebSocket: a ``session/prompt`` refused at its commit, sent again
    under its ``acp-server/promptId``, runs (not answered as the failure it was)."""
    store = faulty(tmp_path)
    async with running_acp_server(tmp_path, lmsp_store=store) as srv, \
            ws_connect(srv.base_url, "/acp") as ws:
        await ws.send_json(request(0, "initialize", RESUMABLE))
        await ws.receive_json()
        await ws.send_json(request(1, "session/new", {"cwd": srv.workspace, "mcpServers": []}))
        sid = (await ws.receive_json())["result"]["sessionId"]
        params = {"sessionId": sid, "prompt": text("/chunks 1 kept"),
                  "_meta": {"acp-server/promptId": "a-1"}}

        async def answer(rpc_id: int) -> dict[str, Any]:
            while True:
                message = await ws.receive_json()
                if message.get("id") == rpc_id:
                    return message   # type: ignore[no-any-return]

        store.faults.on()
        await ws.send_json(request(2, "session/prompt", params))
        refused = await answer(2)
        assert refused["error"]["data"]["errorKind"] == "store_unavailable", refused
        store.faults.off()
        await ws.send_json(request(3, "session/prompt", params))
        assert (await answer(3)) == {"jsonrpc": "2.0", "id": 3,
                                     "result": {"stopReason": "end_turn"}}
        ends = [t.terminal for t in srv.bridge.get_session(sid).prompt_terminals
                if t.prompt_id == "a-1"]
        assert ends == ["completed"]
