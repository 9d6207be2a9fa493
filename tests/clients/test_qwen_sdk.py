"""qwen's SDK (``@qwen-code/sdk`` 0.1.14) against our server, unchanged: the REST
``DaemonClient`` and ``DaemonSessionClient`` (create or attach, load live and cold,
resume, replay after a dropped stream, the local cap) and the ``/acp`` transports
``AcpHttpTransport`` / ``AcpWsTransport`` (create, prompt, permission, cancel).
``qwen_sdk.mjs`` reports what the SDK returned; the assertions are on that."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.acp_http.server import running_acp_server
from tests.clients.node import run_script

pytestmark = [pytest.mark.anyio, pytest.mark.clients]


def _updates(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["kind"], e["text"]) for e in events if e["type"] == "session_update"]


async def test_rest_clients(qwen_sdk: str, tmp_path: Path) -> None:
    async with running_acp_server(tmp_path) as srv:
        r = await run_script("qwen_sdk.mjs", qwen_sdk, srv.base_url, "rest")
    assert r["health"] == {"status": "ok"}
    caps = r["capabilities"]
    assert caps["transports"] == ["rest", "acp-http", "acp-ws"]
    assert {"session_load", "session_resume", "session_events"} <= set(caps["features"])
    assert r["negotiated"] == "acp-ws"
    # DaemonClient
    assert r["attach"] == {"attached": False, "clientId": "string"}
    assert r["prompt"] == {"stopReason": "end_turn"}
    assert r["events"][-1]["type"] == "turn_complete"
    assert "".join(t for k, t in _updates(r["events"]) if k == "agent_message_chunk") == \
        "Echo: hello daemon"
    # DaemonSessionClient.load while live: the history in replaySnapshot, compacted
    assert r["turn"] == {"stopReason": "end_turn"}
    live = r["loadLive"]
    assert live["attached"] is True and live["complete"] is True
    assert live["hasActivePrompt"] is False
    replay = live["compactedReplay"]
    assert [e["type"] for e in replay] == ["session_update", "session_update", "turn_complete"]
    assert _updates(replay) == [("user_message_chunk", "/chunks 3 say pong"),
                                ("agent_message_chunk", "Echo: say pong")]
    assert live["liveJournal"] == [] and live["lastEventId"] == replay[-1]["id"]
    # its first events are the next turn's, from the cursor on (``replay_complete``,
    # which has no id, aside)
    after = [e for e in r["afterLoad"] if e["type"] != "replay_complete"]
    assert after[0]["id"] == live["lastEventId"] + 1 and r["afterLoadAccepted"]
    assert after[0]["text"] == "after load" and after[-1]["type"] == "turn_complete"
    # resume: attached, no history, the cursor at the end
    assert r["resume"] == {"attached": True, "lastEventId": after[-1]["id"],
                           "eventEpoch": live["eventEpoch"], "compactedReplay": 0}
    # load after close: restored through the agent, its replay in the snapshot
    cold = r["loadCold"]
    assert cold["attached"] is False and cold["eventEpoch"] != live["eventEpoch"]
    assert _updates(cold["compactedReplay"]) == [
        ("user_message_chunk", "/chunks 3 say pong"), ("agent_message_chunk", "Echo: say pong"),
        ("user_message_chunk", "after load"), ("agent_message_chunk", "Echo: after load")]
    assert cold["lastEventId"] == cold["compactedReplay"][-1]["id"]
    assert r["coldTurn"] == {"stopReason": "end_turn"}
    # a dropped stream resumes from the SDK's last seen id: nothing lost, nothing skipped
    replay_run = r["replay"]
    replayed = replay_run["replayed"]
    assert replayed[0]["id"] == replay_run["seenUpTo"] + 1
    assert [e["id"] for e in replayed] == list(range(replayed[0]["id"],
                                                     replayed[0]["id"] + len(replayed)))
    assert ("user_message_chunk", "two while away") in _updates(replayed)
    # the local cap refuses before sending; the held prompt still completes
    assert r["capRefused"]["name"] == "DaemonPendingPromptLimitError"
    assert r["capRefused"]["limit"] == 1 and r["capRefused"]["pendingCount"] == 1
    assert r["capVoted"] is True and r["capHeld"] == {"stopReason": "end_turn"}
    assert r["capSecond"] is True


@pytest.mark.parametrize("kind", ["acp-http", "acp-ws"])
async def test_acp_transports(qwen_sdk: str, tmp_path: Path, kind: str) -> None:
    async with running_acp_server(tmp_path) as srv:
        r = await run_script("qwen_sdk.mjs", qwen_sdk, srv.base_url, kind)
    assert r["transportType"] == kind and r["created"] is True
    assert r["prompt"] == {"stopReason": "end_turn"}
    assert r["permissionOptions"] == ["allow_once", "allow_always", "reject_once"]
    assert r["voted"] is True and r["permissionPrompt"] == {"stopReason": "end_turn"}
    assert r["cancelled"] == {"stopReason": "cancelled"}
    chunks = [e["text"] for e in r["seen"] if e["type"] == "agent_message_chunk"]
    assert "".join(chunks).startswith("Echo: hello over acp")
    assert "Permission allowed (allow_once)" in "".join(chunks)


async def test_the_per_workspace_paths(qwen_sdk: str, tmp_path: Path) -> None:
    """``workspaceById(id).listWorkspaceSessionsPage`` (``/workspaces/:workspace/sessions``;
    a page of 1000 asked gets every one, as the peer clamps) and ``workspaceByCwd(cwd)``
    (the path URL-encoded; another folder's is ``workspace_mismatch``); an
    ``AcpWsTransport`` on ``/workspaces/:workspace/acp`` and an ``AcpHttpTransport`` on
    the mount of the workspace's path."""
    async with running_acp_server(tmp_path) as srv:
        r = await run_script("qwen_sdk.mjs", qwen_sdk, srv.base_url, "workspace")
    newest_first = r["made"][::-1]
    assert r["big"] == newest_first
    assert r["pages"] == [newest_first[:2], newest_first[2:]] and r["nextCursor"] is None
    assert r["turn"] == {"stopReason": "end_turn"}
    assert r["byCwd"] == newest_first
    assert r["elsewhere"] == {"name": "DaemonHttpError", "status": 400,
                              "code": "workspace_mismatch"}
    assert r["httpTurn"] == {"stopReason": "end_turn"}
    assert "".join(r["httpChunks"]).startswith("Echo: hello mount")
