"""`qwen --acp` behind our server, reached by an editor through `acp-server connect`:
the adapter on stdio, a turn, and a tool call's permission round trip, qwen's own
fields kept end to end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.connect.harness import spawn_adapter
from tests.npm_agents.test_qwen import qwen_server

pytestmark = [pytest.mark.anyio, pytest.mark.agents]


def allow_once(request: dict[str, Any]) -> dict[str, Any]:
    option = next(o for o in request["params"]["options"] if o["kind"] == "allow_once")
    return {"outcome": {"outcome": "selected", "optionId": option["optionId"]}}


async def test_qwen_through_the_adapter(tmp_path: Path, qwen_entry: str) -> None:
    async with qwen_server(tmp_path, qwen_entry) as (client, state, workspace):
        url = str(client.base_url).rstrip("/") + "/acp"
        async with spawn_adapter(url, answer_permission=allow_once) as adapter:
            init = await adapter.request("initialize", {"protocolVersion": 1,
                                                        "clientCapabilities": {}}, timeout=90)
            assert init["result"]["protocolVersion"] == 1
            created = await adapter.request("session/new", {"cwd": str(workspace),
                                                            "mcpServers": []}, timeout=90)
            sid = created["result"]["sessionId"]
            assert "models" in created["result"] or "modes" in created["result"]
            said = await adapter.request("session/prompt", {
                "sessionId": sid, "prompt": [{"type": "text", "text": "say hello"}]},
                timeout=90)
            assert said["result"]["stopReason"] == "end_turn"
            assert adapter.texts("agent_message_chunk", sid)
            wrote = await adapter.request("session/prompt", {
                "sessionId": sid, "prompt": [{"type": "text", "text": "WRITE the file please"}]},
                timeout=90)
            assert wrote["result"]["stopReason"] == "end_turn"
            assert [m["method"] for m in adapter.asked] == ["session/request_permission"]
            assert (workspace / "hello.txt").read_text() == "written via ACP\n"
            assert state.requests
