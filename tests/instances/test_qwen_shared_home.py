"""``qwen --acp`` on two real instances on one PostgreSQL store, sharing one ``HOME``
(qwen's transcripts) and one workspace, as docs/deployment.md asks (issue #24): the
instance that made a session is killed with ``kill -9``; a prompt sent to the other one
is refused (503, retryable) until the lease expires, then the other instance adopts the
session, qwen restores it through its own ``session/load`` from the shared ``HOME``, and
the next turn's request to the model carries the conversation from before the kill."""

from __future__ import annotations

import json
import shlex
import shutil
import time
from pathlib import Path

import anyio
import httpx
import pytest

from tests.bridge.fake_model_server import FakeModelState, build_fake_model_app
from tests.harness import ServeProcess, serving
from tests.lmsp import stores
from tests.npm_agents.conftest import qwen_entry  # noqa: F401 - the fixture
from tests.npm_agents.test_qwen import agent_text, events, new_session, prompt

pytestmark = [pytest.mark.anyio, pytest.mark.agents, pytest.mark.slow]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"   # the client side and the fake model; the servers are processes


async def test_an_adopted_qwen_session_remembers_through_a_shared_home(
        tmp_path: Path, qwen_entry: str) -> None:  # noqa: F811 - the fixture
    if not stores.postgres_dsn():
        pytest.skip(stores.SKIP_POSTGRES)
    url = stores.postgres_url_for(tmp_path, "qwen")
    model = FakeModelState()
    workspace, home = tmp_path / "ws", tmp_path / "home"   # shared by both instances
    workspace.mkdir()
    home.mkdir()
    async with serving(build_fake_model_app(model)) as model_url:
        agent = shlex.join([shutil.which("node") or "node", qwen_entry, "--acp",
                            "--auth-type", "openai", "--approval-mode", "default"])
        env = {"HOME": str(home), "OPENAI_BASE_URL": model_url + "/v1",
               "OPENAI_API_KEY": "x", "OPENAI_MODEL": "fake-small",
               "QWEN_CODE_NO_RELAUNCH": "true", "NO_COLOR": "1"}
        a, b = (ServeProcess(workspace, "--agent", agent, "--store", url,
                             "--session-lease-ttl-ms", "1500", "--session-lease-renew-ms",
                             "300", "--initialize-timeout-ms", "60000",
                             "--agent-request-timeout-ms", "60000",
                             state_dir=tmp_path / f"state-{n}", env=env) for n in "ab")
        try:
            await anyio.to_thread.run_sync(a.start)
            await anyio.to_thread.run_sync(b.start)
            async with httpx.AsyncClient(base_url=a.base_url, timeout=90) as client:
                sid = await new_session(client)
                first = await prompt(client, sid, "remember the word apricot")
                assert first.status_code == 202, first.text
                frames = await events(client, sid, 0, "turn_complete")
                said = agent_text(frames)
                assert "apricot" in said
            await anyio.to_thread.run_sync(a.kill)   # SIGKILL: the lease is not released
            asked = len(model.requests)
            async with httpx.AsyncClient(base_url=b.base_url, timeout=90) as client:
                deadline = time.monotonic() + 60
                while True:   # a client retrying the 503 (owner unreachable, then moving)
                    again = await prompt(client, sid, "which word was it")
                    if again.status_code != 503:
                        break
                    assert time.monotonic() < deadline, again.text
                    await anyio.sleep(0.1)
                assert again.status_code == 202, again.text
                loaded = (await client.post(f"/session/{sid}/load", json={})).json()
                cursor = max(f[1]["id"] for f in frames if f[1].get("id") is not None)
                frames = await events(client, sid, cursor, "turn_complete")
                assert "which word was it" in agent_text(frames)
                status = (await client.get("/daemon/status")).json()["runtime"]["instances"]
                assert status["leasesTakenOver"] == 1 and status["sessionsOwned"] == 1
                assert first.json()["promptId"] in {t["promptId"]
                                                    for t in loaded["promptTerminals"]}
            # qwen on b restored its own session from the shared HOME: the new turn's
            # request to the model carries the turn from before the kill
            later = json.dumps(model.requests[asked:])
            assert "remember the word apricot" in later and "which word was it" in later
        finally:
            for child in (a, b):
                await anyio.to_thread.run_sync(child.kill)
