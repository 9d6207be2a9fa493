"""Ids a client sends that no store column holds (a NUL) name nothing, on every store:
the door's 404 (REST ``session_not_found``, ``/acp`` -32602), never a 503
``store_unavailable`` nor a 500, and the connection that sent one stays open (real
HTTP and WebSocket on loopback). An agent that would restore any id is never asked for
one (a NUL, or too long for PostgreSQL's index), so nothing the journal cannot hold
reaches it: the other sessions' prompts are acknowledged and journaled as before."""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bridge.agents.stdio import StdioAgentFactory
from tests.acp_http.server import RunningAcpServer, request
from tests.acp_http.wsclient import ws_connect
from tests.agents import ROOT, fixture_command
from tests.harness.local import local_server
from tests.lmsp.server import running_lmsp
from tests.lmsp.stores import STORE_FACTORIES, current
from tests.store.test_session_restart import _is, _prompt, read_events

pytestmark = pytest.mark.anyio
NUL_IDS = ["\u0000", "a\u0000b"]


@pytest.mark.parametrize("raw_id", ["%00", "a%00b"])
async def test_a_session_id_with_a_nul_is_not_found(tmp_path: Path, store_name: str,
                                                    raw_id: str) -> None:
    # On PostgreSQL the session's lease was looked up with the id (psycopg refuses a NUL
    # in TEXT): the REST door answered 503 store_unavailable, and logged a warning; its
    # maker, asked of the journal by /load and /resume, was a 500.
    async with running_lmsp(tmp_path) as srv:
        for method, path, body in [
                ("DELETE", f"/session/{raw_id}", None),
                ("GET", f"/session/{raw_id}/events", None),
                ("POST", f"/session/{raw_id}/prompt",
                 {"prompt": [{"type": "text", "text": "x"}]}),
                ("POST", f"/session/{raw_id}/load", {}),
                ("POST", f"/session/{raw_id}/resume", {})]:
            response = await srv.client.request(method, path, json=body)
            assert response.status_code == 404, (method, path, response.text)
            assert response.json()["code"] == "session_not_found"
        assert (await srv.client.get("/health?deep=1")).json()["status"] == "ok"


@contextlib.asynccontextmanager
async def _acp_server(tmp_path: Path, **kwargs: Any) -> AsyncIterator[RunningAcpServer]:
    """The ``/acp`` helpers on the selected store (``store_name``)."""
    store = STORE_FACTORIES[current["name"]](tmp_path, "lmsp.sqlite3", True)
    async with local_server(tmp_path, kind=RunningAcpServer, lmsp_store=store,
                            **kwargs) as srv:
        yield srv


def _restore(rpc_id: int, method: str, sid: str, cwd: str) -> dict[str, Any]:
    return request(rpc_id, method, {"sessionId": sid, "cwd": cwd, "mcpServers": []})


async def test_acp_restores_of_an_id_with_a_nul_are_not_found(tmp_path: Path,
                                                              store_name: str) -> None:
    # On PostgreSQL the maker asked of the journal raised out of the dispatch: the
    # WebSocket closed (every session on it detached), the HTTP request went unanswered.
    async with _acp_server(tmp_path) as srv:
        async with ws_connect(srv.base_url) as ws:
            await ws.send_json(request(0, "initialize", {"protocolVersion": 1}))
            await ws.wait_for(lambda m: m.get("id") == 0)
            rpc_id = 0
            for sid in NUL_IDS:
                for method in ("session/load", "session/resume"):
                    rpc_id += 1
                    await ws.send_text(json.dumps(_restore(rpc_id, method, sid, srv.workspace)))
                    answer = await ws.wait_for(lambda m: m.get("id") == rpc_id, timeout=10)
                    assert answer["error"]["code"] == -32602, answer
            await ws.send_json(request("probe", "session/list", {}))
            assert "result" in await ws.wait_for(lambda m: m.get("id") == "probe")
        conn_id, _ = await srv.initialize()
        async with srv.stream(conn_id) as stream:
            for rpc_id, method in enumerate(("session/load", "session/resume"), 1):
                sent = await srv.post(conn_id, _restore(rpc_id, method, "a\u0000b",
                                                        srv.workspace))
                assert sent.status_code == 202, sent.text
                answer = await stream.wait_for_id(rpc_id, timeout=10)
                assert answer["error"]["code"] == -32602, answer
        assert (await srv.client.get("/health?deep=1")).json()["status"] == "ok"


# 3,000 characters no compression shortens: past PostgreSQL's index entry (2,704 bytes)
LONG_ID = "".join(hashlib.sha512(bytes([i])).hexdigest() for i in range(24))


@pytest.mark.parametrize("hostile", ["a\u0000b", LONG_ID], ids=["nul", "long"])
async def test_an_agent_that_restores_any_id_is_never_asked_for_one_no_store_holds(
        tmp_path: Path, store_name: str, hostile: str) -> None:
    # The fixture agent answers session/load and session/resume of any id (and, after a
    # "collide <id>" prompt, session/new with that id). On PostgreSQL the journal then
    # took a session "a\0b": its commit failed, and with it every other session's
    # records in that commit and in each retry (an innocent prompt: 503
    # store_unavailable), for as long as the server ran. A 3,000-character id: its
    # lease's index refused it, the load was 503 store_unavailable and the store was
    # reported down (as was any innocent prompt in that commit).
    factory = StdioAgentFactory(fixture_command("any"), cwd=str(ROOT), name="any")
    async with _acp_server(tmp_path, agent_factory=factory) as srv:
        other = (await srv.client.post("/session", json={"sessionScope": "thread"})).json()
        async with ws_connect(srv.base_url) as ws:
            await ws.send_json(request(0, "initialize", {"protocolVersion": 1}))
            await ws.wait_for(lambda m: m.get("id") == 0)
            for rpc_id, method in enumerate(("session/load", "session/resume"), 1):
                await ws.send_text(json.dumps(_restore(rpc_id, method, hostile,
                                                       srv.workspace)))
                answer = await ws.wait_for(lambda m: m.get("id") == rpc_id, timeout=10)
                assert answer["error"]["code"] == -32602, answer
        sid = other["sessionId"]
        # its next session/new answers that id: refused as an agent's protocol error
        collide = await srv.client.post(f"/session/{sid}/prompt",
                                        json=_prompt(f"collide {hostile}"))
        await read_events(srv.client, sid, _is("turn_complete", collide.json()["promptId"]),
                          last_event_id=0)
        made = await srv.client.post("/session", json={"sessionScope": "thread"})
        assert made.status_code == 502, made.text
        assert made.json()["code"] == "agent_protocol_error"
        accepted = await srv.client.post(f"/session/{sid}/prompt", json=_prompt("innocent"))
        assert accepted.status_code == 202, accepted.text
        await read_events(srv.client, sid, _is("turn_complete", accepted.json()["promptId"]),
                          last_event_id=0)
        assert not srv.bridge.has_session(hostile)
        assert (await srv.client.get("/health?deep=1")).json()["status"] == "ok"
        assert srv.bridge.journal.store.health.failures == 0   # never reported down
    async with _acp_server(tmp_path, agent_factory=factory) as srv:   # the journal has it
        loaded = (await srv.client.post(f"/session/{sid}/load", json={})).json()
        assert [t["promptId"] for t in loaded["promptTerminals"]] == \
            [collide.json()["promptId"], accepted.json()["promptId"]]


async def test_a_prompt_holding_a_nul_is_journaled_and_kept(tmp_path: Path,
                                                             store_name: str) -> None:
    """Text and ``_meta`` are journaled as bytes (msgpack), never as TEXT: a prompt with
    a NUL is acknowledged, committed and read back after a restart, on either store."""
    block = {"type": "text", "text": "a\u0000b", "_meta": {"k\u0000": "\u0000"}}
    async with _acp_server(tmp_path) as srv:
        sid = (await srv.client.post("/session", json={"sessionScope": "thread"})
               ).json()["sessionId"]
        accepted = await srv.client.post(f"/session/{sid}/prompt", json={"prompt": [block]})
        assert accepted.status_code == 202, accepted.text
        await read_events(srv.client, sid, _is("turn_complete", accepted.json()["promptId"]),
                          last_event_id=0)
    async with _acp_server(tmp_path) as srv:
        loaded = (await srv.client.post(f"/session/{sid}/load", json={})).json()
        said = [e["data"]["update"]["content"]["text"] for e in loaded["compactedReplay"]
                if e["type"] == "session_update"]
        assert "a\u0000b" in said, said
        assert [t["promptId"] for t in loaded["promptTerminals"]] == \
            [accepted.json()["promptId"]]


@pytest.mark.parametrize("raw", ["%00", "a%00b"])
async def test_admin_names_with_a_nul_name_nothing(tmp_path: Path, store_name: str,
                                                   raw: str) -> None:
    # On PostgreSQL: 500s (the token's name, the audit filters went to a TEXT parameter)
    async with running_lmsp(tmp_path, token="boot-s3cret-hostile") as srv:
        revoked = await srv.client.delete(f"/tokens/{raw}")
        assert revoked.status_code == 404, revoked.text
        assert revoked.json()["code"] == "token_not_found"
        for key in ("principal", "action"):
            page = await srv.client.get(f"/audit?{key}={raw}")
            assert page.status_code == 200, page.text
            assert page.json() == {"records": [], "nextCursor": None}
        assert (await srv.client.get("/health?deep=1")).json()["status"] == "ok"
