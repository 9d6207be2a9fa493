"""An editor on ``acp-server connect`` (stdio) behind a real HAProxy in front of two
instances on one PostgreSQL store: the instance that runs its session is killed with
SIGKILL mid-turn and never comes back (issue #24 with the stdio adapter of #25):

* the adapter's link drops; it reconnects through the balancer, which now reaches the
  other instance only, and re-attaches the session there with ``session/load``: refused
  as busy elsewhere (retryable: the link is made again) while the dead owner's lease is
  still live, adopted once it expired;
* the turn that was running gets its ``server_restarted`` terminal
  (``--session-on-restart fail``), the next prompt runs on the survivor, and the
  editor saw every update of the conversation once, in order (the earlier turn's not
  again, the interrupted one's echo once);
* over the WebSocket (round robin: the socket pins one instance for its life) and over
  Streamable HTTP (cookie affinity: the adapter keeps the balancer's cookie).

The test only drives child processes (the instances, HAProxy, the adapter) from the
client side, so it runs under one anyio backend.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.connect.harness import spawn_adapter
from tests.harness import ServeProcess
from tests.harness.haproxy import SKIP, HAProxy, haproxy_binary
from tests.instances.test_three_instances import _instance_of, _owner
from tests.lmsp import stores

pytestmark = [pytest.mark.anyio, pytest.mark.slow,
              pytest.mark.skipif(haproxy_binary() is None, reason=SKIP),
              pytest.mark.skipif(not stores.postgres_dsn(), reason=stores.SKIP_POSTGRES),
              pytest.mark.parametrize("anyio_backend", ["asyncio"])]   # see the docstring

TTL_MS, RENEW_MS = 1500, 300
INIT = {"protocolVersion": 1, "clientCapabilities": {}}


def _text(value: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": value}]


def _echo_of(value: str) -> Any:
    return lambda m: m.get("method") == "session/update" \
        and m["params"]["update"]["sessionUpdate"] == "user_message_chunk" \
        and m["params"]["update"].get("content", {}).get("text") == value


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Path, str, list[ServeProcess]]]:
    url = stores.postgres_url_for(tmp_path, "connect")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    children: list[ServeProcess] = []
    try:
        for name in ("a", "b"):
            children.append(ServeProcess(
                workspace, "--store", url, *stores.lease_flags(),
                "--session-lease-ttl-ms", str(TTL_MS),
                "--session-lease-renew-ms", str(RENEW_MS),
                "--session-on-restart", "fail", state_dir=f"state-{name}").start())
        yield workspace, url, children
    finally:
        for child in children:
            child.kill()


def _owner_of(url: str, sid: str) -> str:
    with psycopg.connect(url, autocommit=True) as db:
        return _owner(db, sid)


@pytest.mark.parametrize(("transport", "affinity"), [("websocket", "none"),
                                                     ("http", "cookie")])
async def test_the_owner_killed_mid_turn_the_editor_goes_on_elsewhere(
        pair: tuple[Path, str, list[ServeProcess]], transport: str, affinity: str) -> None:
    workspace, url, children = pair
    names = {_instance_of(child): child for child in children}
    with HAProxy(workspace.parent, [c.base_url for c in children], affinity=affinity) as lb:
        lb.wait_up(2)
        async with spawn_adapter(f"{lb.base_url}/acp", "--transport", transport,
                                 "--verbose") as adapter:
            await adapter.request("initialize", INIT)
            created = await adapter.request("session/new", {"cwd": str(workspace),
                                                            "mcpServers": []})
            sid = created["result"]["sessionId"]
            first = await adapter.request("session/prompt", {"sessionId": sid,
                                                             "prompt": _text("before")})
            assert first["result"]["stopReason"] == "end_turn", first
            victim = names[_owner_of(url, sid)]
            survivor = next(c for c in children if c is not victim)
            await adapter.send({"jsonrpc": "2.0", "id": "turn", "method": "session/prompt",
                                "params": {"sessionId": sid,
                                           "prompt": _text("/sleep 60s slow")}})
            await adapter.until(_echo_of("/sleep 60s slow"))
            victim.kill()   # SIGKILL: no drain, its lease left to expire

            ended = await adapter.response("turn", timeout=90)
            assert ended["error"]["data"]["errorCode"] == "server_restarted", ended
            later = await adapter.request("session/prompt", {"sessionId": sid,
                                                             "prompt": _text("after")},
                                          timeout=60)
            assert later["result"]["stopReason"] == "end_turn", later

            assert names[_owner_of(url, sid)] is survivor   # adopted by the other instance
            said = "".join(adapter.texts("agent_message_chunk", sid))
            assert said.count("Echo: before") == 1 and said.endswith("Echo: after"), said
            echoes = [u["content"]["text"] for u in adapter.updates(sid)
                      if u["sessionUpdate"] == "user_message_chunk"]
            assert echoes == ["before", "/sleep 60s slow", "after"], echoes
            status = survivor.http.get(f"/session/{sid}/status").json()
            assert status["pendingPrompts"] == 0 and status["activePromptId"] is None
        assert any("reconnect" in line for line in adapter.stderr), adapter.stderr[-20:]
