"""``session/load`` writes a session's history to a reader that may take its time: the
history the bridge built for the load (its chunks compacted into new events, up to the
ring's size) is not held while the load waits for that reader. Before, 24 connections
that loaded a 64 MiB session and never read took ``acp-server serve`` from 313 MB to
1.07 GB of RSS, kept until the connections were reaped."""

from __future__ import annotations

import dataclasses
import gc
import weakref
from pathlib import Path
from typing import Any

import pytest

import bridge.bridge as bridge_module
from acp_server.acp_http import connection
from bridge.status import SessionHistory
from tests.acp_http.server import request, running_acp_server
from tests.bridge.helpers import wait_until

pytestmark = pytest.mark.anyio


class _Tracked(list):  # type: ignore[type-arg]
    """A list a weak reference can follow."""


@pytest.mark.parametrize("stream", ["session", "connection"])
async def test_a_load_waiting_for_its_reader_holds_no_history(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stream: str) -> None:
    """Whichever way the history goes (the session stream: ``flush_through``; the
    connection stream when no session stream is open: ``push_paced``), the history
    built for the load is gone when the load starts waiting for the reader."""
    built: list[weakref.ref[Any]] = []
    alive_when_waiting: list[bool] = []
    history_of = bridge_module.session_history

    def tracked(session: Any) -> SessionHistory:
        history = history_of(session)
        replay = _Tracked(history.compacted_replay)
        built.append(weakref.ref(replay))
        return dataclasses.replace(history, compacted_replay=replay)

    def watched(wait: Any) -> Any:
        async def waiting(self: Any, *args: Any, **kwargs: Any) -> Any:
            # once per load: its first wait (a full collection per frame of a paced
            # history took a CI worker's heap past the client's read timeout)
            if len(alive_when_waiting) < len(built):
                gc.collect()
                alive_when_waiting.append(built[-1]() is not None)
            return await wait(self, *args, **kwargs)
        return waiting

    monkeypatch.setattr(bridge_module, "session_history", tracked)
    monkeypatch.setattr(connection.SessionChannel, "flush_through",
                        watched(connection.SessionChannel.flush_through))
    monkeypatch.setattr(connection.AcpConnection, "push_paced",
                        watched(connection.AcpConnection.push_paced))
    async with running_acp_server(tmp_path) as srv:
        sid = (await srv.client.post("/session", json={"sessionScope": "thread"})
               ).json()["sessionId"]
        accepted = await srv.client.post(f"/session/{sid}/prompt", json={"prompt": [
            {"type": "text", "text": "/chunks 8 hello"}]})
        assert accepted.status_code == 202, accepted.text
        await wait_until(lambda: srv.bridge.session_status(sid).pending_prompts == 0)
        conn_id, _ = await srv.initialize()
        load = request(1, "session/load", {"sessionId": sid, "cwd": srv.workspace,
                                           "mcpServers": []})
        async with srv.stream(conn_id) as replies:
            if stream == "session":
                async with srv.stream(conn_id, session_id=sid):
                    assert (await srv.post(conn_id, load)).status_code == 202
                    await replies.wait_for_id(1)
            else:
                assert (await srv.post(conn_id, load)).status_code == 202
                await replies.wait_for_id(1)
    assert built and alive_when_waiting and not any(alive_when_waiting)
