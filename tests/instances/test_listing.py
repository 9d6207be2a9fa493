"""The session listings with several instances on one PostgreSQL store: each instance
lists the sessions the others run too (``Bridge.list_all_sessions``,
``JournalReplicas.statuses_elsewhere``), with their queue as the journal has it, under
the same visibility, through REST and ``/acp``; a session closed elsewhere leaves the
list. Before, an instance listed only its own: behind a balancer the console showed
one instance's sessions, or flipped between instances' lists."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from acp_server.rest.workspace import workspace_id
from tests.acp_http.wsclient import ws_connect
from tests.instances.test_forward_adopt import _pair
from tests.principals.helpers import bearer, mint
from tests.store.test_session_restart import _prompt

pytestmark = pytest.mark.anyio


async def _listed(server: Any, headers: dict[str, str] | None = None) -> dict[str, Any]:
    wid = workspace_id(server.bridge.workspace_cwd)
    answer = await server.client.get(f"/workspace/{wid}/sessions", headers=headers)
    assert answer.status_code == 200, answer.text
    return {s["sessionId"]: s for s in answer.json()["sessions"]}


async def _until_listed(server: Any, expected: set[str],
                        headers: dict[str, str] | None = None) -> dict[str, Any]:
    """The listing once it is ``expected`` (the others' are read at most once a
    ``poll_s``)."""
    with anyio.fail_after(20):
        while set(listed := await _listed(server, headers)) != expected:
            await anyio.sleep(0.02)
    return listed


async def _made(server: Any, headers: dict[str, str]) -> str:
    made = await server.client.post("/session", json={"sessionScope": "thread"},
                                    headers=headers)
    assert made.status_code == 200, made.text
    return str(made.json()["sessionId"])


async def test_each_instance_lists_the_sessions_the_others_run(tmp_path: Path) -> None:
    now = [0.0]
    async with _pair(tmp_path, now, token="boot") as (a, b):
        boot = bearer("boot")
        on_a, on_b = await _made(a, boot), await _made(b, boot)
        busy = await b.client.post(f"/session/{on_b}/prompt", json=_prompt("/sleep 60s hold"),
                                   headers=boot)
        queued = await b.client.post(f"/session/{on_b}/prompt", json=_prompt("next"),
                                     headers=boot)
        assert (busy.status_code, queued.status_code) == (202, 202)
        listed = await _until_listed(a, {on_a, on_b}, boot)
        with anyio.fail_after(20):   # its queue as the journal has it
            while (listed[on_b]["pendingPrompts"], listed[on_b]["queuedPrompts"]) != (2, 1):
                await anyio.sleep(0.02)
                listed = await _listed(a, boot)
        assert listed[on_b]["activePromptText"] == "/sleep 60s hold"
        assert listed[on_b]["agent"] == "reference" and listed[on_b]["owner"] == "bootstrap"
        assert set(await _until_listed(b, {on_a, on_b}, boot)) == {on_a, on_b}
        async with ws_connect(a.base_url, "/acp", headers=boot) as ws:
            await ws.send_json({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                                "params": {"protocolVersion": 1}})
            await ws.receive_json()
            await ws.send_json({"jsonrpc": "2.0", "id": 1, "method": "session/list",
                                "params": {}})
            answer = await ws.wait_for(lambda m: m.get("id") == 1)
        assert {s["sessionId"] for s in answer["result"]["sessions"]} == {on_a, on_b}
        assert (await b.client.delete(f"/session/{on_b}", headers=boot)).status_code == 204
        await _until_listed(a, {on_a}, boot)   # closed there: gone here


async def test_each_principal_lists_its_own_sessions_from_every_instance(
        tmp_path: Path) -> None:
    now = [0.0]
    async with _pair(tmp_path, now, token="boot") as (a, b):
        alice = bearer(await mint(a.server, "alice", unlimited=True))
        bob = bearer(await mint(a.server, "bob", unlimited=True))
        hers = await _made(b, alice)
        his = await _made(a, bob)
        await _until_listed(a, {hers, his}, bearer("boot"))   # the admin: both
        assert set(await _listed(a, alice)) == {hers}   # made on b, listed on a
        assert set(await _listed(b, bob)) == {his}
