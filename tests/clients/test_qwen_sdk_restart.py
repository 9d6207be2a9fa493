"""``@qwen-code/sdk``'s ``DaemonSessionClient`` across a ``kill -9`` (issue #23): the
session it made is loaded on the restarted server with its history, the prompt that was
running shows ``server_restarted``, the queued one ran, and a new turn works."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.clients.node import run_script
from tests.harness import ServeProcess, free_port

pytestmark = [pytest.mark.anyio, pytest.mark.clients]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"   # the client side only


async def test_qwen_sdk_session_client_across_kill_9(qwen_sdk: str, tmp_path: Path) -> None:
    child = ServeProcess(tmp_path, "--port", str(free_port())).start()
    try:
        first = await run_script("qwen_sdk.mjs", qwen_sdk, child.base_url, "before")
        assert first["turn"]["stopReason"] == "end_turn"
        child.kill()
        child.start()
        then = await run_script("qwen_sdk.mjs", qwen_sdk, child.base_url, "after",
                                first["sessionId"])
    finally:
        child.stop()
    assert then["eventEpoch"] == first["eventEpoch"]
    said = [e["text"] for e in then["compactedReplay"] if e["type"] == "session_update"]
    assert said[:2] == ["before the restart", "Echo: before the restart"]
    kinds = {(e["type"], e.get("promptId")) for e in then["compactedReplay"]}
    assert ("turn_error", first["long"]) in kinds        # server_restarted, at the restore
    assert then["turn"]["stopReason"] == "end_turn"
    later = [(e["type"], e.get("promptId")) for e in then["history"]
             if e["type"] in ("turn_error", "turn_complete")]
    # the queued one ran after the restart, before the new turn (which queued behind it)
    assert later[-3:-1] == [("turn_error", first["long"]), ("turn_complete", first["queued"])]
