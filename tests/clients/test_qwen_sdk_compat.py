"""``@qwen-code/sdk`` 0.1.14 on the answers where this server once differed from
``qwen serve`` 0.24.4 (``qwen_sdk_compat.mjs`` reports what the SDK returned or
raised; the assertions are on that)."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from bridge import wire
from bridge.bus import EventBus
from tests.bridge.helpers import drain

from tests.acp_http.server import running_acp_server
from tests.clients.node import run_script

pytestmark = [pytest.mark.anyio, pytest.mark.clients]


async def test_remove_pending_prompt(qwen_sdk: str, tmp_path: Path) -> None:
    """``removePendingPrompt`` reads a 200 ``{removed}`` (a 204 made it throw on the
    empty body); an id no longer pending is ``{removed: false}``, not an error."""
    async with running_acp_server(tmp_path) as srv:
        r = await run_script("qwen_sdk_compat.mjs", qwen_sdk, srv.base_url, "pending")
    assert r["first"] == {"value": {"removed": True}}
    assert r["left"] == [r["running"], r["last"]]
    assert r["again"] == {"value": {"removed": False}}
    assert r["running2"] == {"value": {"removed": True}}   # the running one: cancelled
    assert r["unknownSession"]["error"]["status"] == 404
    assert r["unknownSession"]["error"]["code"] == "session_not_found"


async def test_pending_prompt_completed_states(qwen_sdk: str, tmp_path: Path) -> None:
    """``pending_prompt_completed`` says ``removed`` for a queued prompt dropped by its
    removal and ``completed`` for any other end, as the peer does: the SDK's typed
    reader (``isKnownDaemonEvent``, its session reducer) took the ``cancelled`` /
    ``failed`` this server sent for malformed payloads and left them out."""
    async with running_acp_server(tmp_path) as srv:
        r = await run_script("qwen_sdk_compat.mjs", qwen_sdk, srv.base_url, "pending")
    assert r["completed"] == [
        {"promptId": r["queued"], "state": "removed", "known": True},
        {"promptId": r["last"], "state": "completed", "known": True}]


async def test_branch_at_a_point(qwen_sdk: str, tmp_path: Path) -> None:
    """A branch at a transcript record (``atRecordId``) is refused as the peer refuses
    one it cannot branch at (409 ``branch_point_invalid``: the SDK's
    ``isStaleBranchPointError``; 400 when the id is not a string), never made silently
    of the whole session; without one the branch is made."""
    async with running_acp_server(tmp_path) as srv:
        r = await run_script("qwen_sdk_compat.mjs", qwen_sdk, srv.base_url, "branch")
    at_point = r["atPoint"]["error"]
    assert (at_point["status"], at_point["code"], at_point["stale"]) == \
        (409, "branch_point_invalid", True)
    not_string = r["notString"]["error"]
    assert (not_string["status"], not_string["code"], not_string["stale"]) == \
        (400, "branch_point_invalid", False)
    assert r["whole"]["forkedFrom"] == r["whole"]["source"]


async def test_heartbeat_last_seen_is_epoch_ms(qwen_sdk: str, tmp_path: Path) -> None:
    """``heartbeat()``'s ``lastSeenAt`` is a number of epoch milliseconds (the SDK's
    ``HeartbeatResult``), not an ISO string."""
    async with running_acp_server(tmp_path) as srv:
        r = await run_script("qwen_sdk_compat.mjs", qwen_sdk, srv.base_url, "heartbeat")
    assert r == {"type": "number", "withinCall": True, "clientId": True}


async def test_own_echo_carries_the_originator(qwen_sdk: str, tmp_path: Path) -> None:
    """A prompt sent under a client id: its echo (and its turn's end) carry
    ``originatorClientId``, as qwen's, so ``normalizeDaemonEvent``'s
    ``suppressOwnUserEcho`` hides the echo from that client (it showed its own input
    twice) and not from another; the agent's own updates carry none. A close under a
    client id: ``session_closed`` carries it too."""
    async with running_acp_server(tmp_path) as srv:
        r = await run_script("qwen_sdk_compat.mjs", qwen_sdk, srv.base_url, "echo")
    cid = r["clientId"]
    assert r["originators"][0] == ["session_update", cid]        # the echo
    assert r["originators"][-1] == ["turn_complete", cid]
    assert {o for _t, o in r["originators"][1:-1]} == {None}      # the agent's chunks
    assert (r["ownView"], r["otherView"]) == (0, 1)
    assert r["closedBy"] == cid   # session_closed, of a DELETE under that client id


async def test_stream_under_an_unknown_client_id(qwen_sdk: str, tmp_path: Path) -> None:
    """``DaemonSessionClient.events()`` sends its client id; one the server does not
    know (forgotten) no longer refuses the stream (400 ``invalid_client_id``, on which
    the SDK does not attach again): as qwen, the header is a hint on a stream."""
    async with running_acp_server(tmp_path) as srv:
        r = await run_script("qwen_sdk_compat.mjs", qwen_sdk, srv.base_url, "stream")
    assert r["seen"][0] == "session_update" and r["seen"][-1] == "turn_complete"


async def test_daemon_status_detail_full(qwen_sdk: str, tmp_path: Path) -> None:
    """``daemonStatus("full")`` gets ``detail: "full"`` and ``full.sessions`` (the
    SDK's ``DaemonStatusReportSession``); the summary has no ``full``; another detail
    is 400 ``invalid_detail``, as the peer answers (it was the summary, silently)."""
    async with running_acp_server(tmp_path) as srv:
        r = await run_script("qwen_sdk_compat.mjs", qwen_sdk, srv.base_url, "status")
    assert r["summary"] == {"detail": "summary"}
    assert r["detail"] == "full"
    [session] = [s for s in r["sessions"] if s["sessionId"] == r["sessionId"]]
    assert session | {"createdAt": "", "workspaceCwd": ""} == {
        "sessionId": r["sessionId"], "workspaceCwd": "", "createdAt": "", "clientCount": 1,
        "subscriberCount": 0, "attachCount": 1, "pendingPromptCount": 0,
        "pendingPermissionCount": 0, "hasActivePrompt": False, "lastEventId": 0,
        "agent": "reference"}
    bogus = r["bogus"]["error"]
    assert (bogus["status"], bogus["code"]) == (400, "invalid_detail")


async def test_session_status_turn_fields(qwen_sdk: str, tmp_path: Path) -> None:
    """``sessionStatus()`` has qwen's ``activeWorkState`` (``active`` while a prompt is
    queued or running, else ``unsupported``), ``hasTurnError`` and ``turnError`` (set by
    a turn that failed, cleared once the next starts running) and ``updatedAt`` (the end
    of the last turn that ran; absent before the first); ``createOrAttachSession``
    under an unknown ``approvalMode`` is qwen's 400 ``invalid_approval_mode``, a known
    one is taken."""
    async with running_acp_server(tmp_path) as srv:
        r = await run_script("qwen_sdk_compat.mjs", qwen_sdk, srv.base_url, "session-status")
    fresh, after, running = r["fresh"], r["afterError"], r["whileRunning"]
    assert (fresh["activeWorkState"], fresh["hasTurnError"],
            fresh["hasRunningBackgroundTasks"]) == ("unsupported", False, False)
    assert "updatedAt" not in fresh and "turnError" not in fresh
    assert r["failed"] == "threw"   # the SDK's prompt() raises on the turn_error
    assert (after["activeWorkState"], after["hasTurnError"]) == ("unsupported", True)
    assert after["turnError"] == {"message": "Reference agent failure (/fail)",
                                  "code": "-32603"}
    assert after["updatedAt"] > r["createdAt"]
    assert (running["activeWorkState"], running["hasTurnError"]) == ("active", False)
    assert "turnError" not in running and running["updatedAt"] == after["updatedAt"]
    bad = r["badMode"]
    assert (bad["status"], bad["code"]) == (400, "invalid_approval_mode")


async def test_attach_says_a_prompt_is_active(qwen_sdk: str, tmp_path: Path) -> None:
    """An attach (``createOrAttach``, single scope) answers the peer's
    ``hasActivePrompt`` and ``hasRunningBackgroundTasks``, which the SDK's session
    client keeps: it said no prompt was active while one ran."""
    async with running_acp_server(tmp_path) as srv:
        r = await run_script("qwen_sdk_compat.mjs", qwen_sdk, srv.base_url, "attach")
    assert r == {"fresh": False, "same": True, "busy": True, "idle": False,
                 "background": [False, False]}


async def test_slow_client_warning_is_typed(qwen_sdk: str) -> None:
    """``slow_client_warning``'s ``threshold`` names the bound (``frames``, ``bytes``,
    ``frames_and_bytes``), as the peer's: the SDK's typed reader took the ``0.75``
    this server sent for a malformed payload."""
    warnings = []
    for max_queued, max_bytes, blob in ((16, 2 << 20, 10), (256, 4096, 1000)):
        bus = EventBus(max_queued=max_queued, max_queued_bytes=max_bytes)
        sub = bus.subscribe()
        for _ in range(16):
            bus.publish("session_update", {"blob": "x" * blob})
        warnings += [msgspec.json.decode(wire.envelope(f)) for f in drain(sub)
                     if f.type == "slow_client_warning"]
    assert [w["data"]["threshold"] for w in warnings] == ["frames", "bytes"]
    known = await run_script("qwen_sdk_compat.mjs", qwen_sdk, "-", "known",
                             json.dumps(warnings))
    assert known == [True, True]


async def test_session_setters(qwen_sdk: str, tmp_path: Path) -> None:
    """qwen's setters as its SDK calls them (they were 404): ``setSessionApprovalMode``
    gets ``{sessionId, mode, previous, persisted}``, a qwen mode the agent does not
    offer is qwen's 400 ``invalid_approval_mode``; ``setModel`` the agent's answer, a
    model it refuses 400 ``agent_refused``; ``setConfigOption`` ``{configOptions,
    persisted}``; the agent's mode and option updates reach the stream."""
    async with running_acp_server(tmp_path) as srv:
        r = await run_script("qwen_sdk_compat.mjs", qwen_sdk, srv.base_url, "setters")
    sid = r["sessionId"]
    assert r["mode"] == {"value": {"sessionId": sid, "mode": "plan", "previous": "default",
                                   "persisted": False}}
    assert r["again"]["value"]["previous"] == "plan"
    assert (r["lacking"]["error"]["status"], r["lacking"]["error"]["code"]) == \
        (400, "invalid_approval_mode")
    assert r["model"] == {"value": {}}
    assert (r["refused"]["error"]["status"], r["refused"]["error"]["code"]) == \
        (400, "agent_refused")
    option = r["option"]["value"]
    assert option["persisted"] is False
    assert [o["currentValue"] for o in option["configOptions"]] == ["high"]
    assert r["updates"] == ["current_mode_update", "current_mode_update",
                            "config_option_update"]
    # qwen's own events of the setters, with its field names: the SDK's typed reader
    # knows each, its session reducer follows them (they were never sent)
    client = r["clientId"]
    assert r["announced"] == [
        {"type": "approval_mode_changed", "known": True, "originatorClientId": client,
         "data": {"sessionId": sid, "previous": "default", "next": "plan",
                  "persisted": False}},
        {"type": "approval_mode_changed", "known": True, "originatorClientId": None,
         "data": {"sessionId": sid, "previous": "plan", "next": "yolo", "persisted": False}},
        {"type": "model_switched", "known": True, "originatorClientId": client,
         "data": {"sessionId": sid, "modelId": "reference-large"}},
        {"type": "model_switch_failed", "known": True, "originatorClientId": client,
         "data": {"sessionId": sid, "requestedModelId": "gpt-9",
                  "error": 'Unknown model "gpt-9"'}}]
    assert r["view"] == {"approvalMode": "yolo", "currentModelId": "reference-large",
                         "approvalModeChangedCount": 2,
                         "lastModelSwitchFailure": {"sessionId": sid,
                                                    "requestedModelId": "gpt-9",
                                                    "error": 'Unknown model "gpt-9"'}}


async def test_the_listing_names_a_session_by_its_first_prompt(qwen_sdk: str,
                                                               tmp_path: Path) -> None:
    """``listWorkspaceSessions`` (a session picker's source) gets qwen's
    ``displayName``, the first prompt, and ``isArchived: false``: both were absent."""
    async with running_acp_server(tmp_path) as srv:
        r = await run_script("qwen_sdk_compat.mjs", qwen_sdk, srv.base_url, "named")
    assert r == {"named": {"displayName": "hello listing", "isArchived": False},
                 "quiet": {"displayName": None, "isArchived": False}}
