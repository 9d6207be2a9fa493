"""Client plumbing without a server: prompt bodies, token fallback, request bodies, and
that the client does not import the server."""

from __future__ import annotations

import subprocess
import sys

import msgspec
import pytest

from acp_server.client import (CreateSessionRequest, DaemonClient, PromptRequest, TaskClient,
                               prompt_body)
from acp_server.client.wire import EVENT, decode


@pytest.mark.parametrize("req", [
    "hi", [{"type": "text", "text": "hi"}], PromptRequest.text("hi"),
    {"prompt": [{"type": "text", "text": "hi"}]}])
def test_prompt_body(req: object) -> None:
    assert msgspec.json.decode(prompt_body(req)) == {"prompt": [{"type": "text", "text": "hi"}]}  # type: ignore[arg-type]


def test_prompt_request_fields() -> None:
    body = msgspec.json.decode(prompt_body(PromptRequest.text("x", deadline_ms=500,
                                                              meta={"k": "v"})))
    assert body == {"prompt": [{"type": "text", "text": "x"}], "deadlineMs": 500,
                    "_meta": {"k": "v"}}
    assert msgspec.json.decode(msgspec.json.encode(CreateSessionRequest(
        workspace_cwd="/w", session_scope="thread"))) == {"cwd": "/w", "sessionScope": "thread"}


def test_token_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACP_SERVER_TOKEN", "  from-env  ")
    assert DaemonClient("http://x/").token == "from-env"
    assert DaemonClient("http://x/", token="given").token == "given"
    assert DaemonClient("http://x///").base_url == "http://x"
    monkeypatch.delenv("ACP_SERVER_TOKEN")
    assert DaemonClient("http://x").token is None
    TaskClient("http://x")


def test_synthetic_event_has_no_id() -> None:
    event = decode(EVENT, b'{"v":1,"type":"replay_complete","data":{"lastReplayedEventId":3}}')
    assert event.id is None and event.type == "replay_complete"


def test_client_does_not_import_the_server() -> None:
    code = ("import sys, acp_server.client, acp_server.client.prompt_cli, acp_server.client.tasks_cli; "
            "bad = [m for m in sys.modules if m == 'bridge' or m.startswith(('bridge.', "
            "'acp_server.rest', 'acp_server.app', 'acp_server.lmsp', 'starlette', 'uvicorn'))]; "
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
