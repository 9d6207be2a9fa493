"""The conformance runner against a live `qwen serve` 0.24.4 (npm), its agent on our fake
model server; ``SLOW`` prompts hold (the fake model streams them for 5 s).

The outcomes are recorded in docs/conformance.md (the qwen serve table); this
test keeps that table true.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from acp_server.conformance import Options, run_conformance
from acp_server.conformance.catalog import checks_of
from tests.bridge.fake_model_server import FakeModelState, build_fake_model_app
from tests.harness import serving

pytestmark = [pytest.mark.anyio, pytest.mark.agents, pytest.mark.slow]
LISTENING = re.compile(rb"listening on (http://127\.0\.0\.1:\d+)")
START_TIMEOUT_S = 60
HOLD = "SLOW story please"
OPTIONS = Options(hold_prompt=HOLD, quick_prompt="say hello", timeout_s=20.0,
                  settle_timeout_s=90.0)

# check id -> outcome against qwen serve 0.24.4 (docs/conformance.md gives the reasons);
# qwen serve has no LMSP, so that suite is not advertised and does not run.
NOT_PASSING = {
    "backpressure.release.dropped": "fail",      # the dropped prompt keeps its slot
    "backpressure.failure.no-poison": "skip",    # no prompt that fails quickly
    "acp-http.status.409": "fail",               # a second reader is accepted (200)
    "acp-http.load.history-first": "fail",       # a live session is attached, no replay
    "acp-http.v1.session-delete": "skip",        # sessionCapabilities.delete not advertised
    "acp-http.v1.session-fork": "skip",          # sessionCapabilities.fork not advertised
    "acp-http.v1.cancel-request": "fail",        # the held turn runs to its end
}
EXPECTED = {check.id: NOT_PASSING.get(check.id, "pass")
            for suite in ("backpressure", "acp-http") for check in checks_of(suite)}


@contextlib.asynccontextmanager
async def qwen_serve(tmp_path: Path, qwen_entry: str, *, max_pending: int = 2
                     ) -> AsyncIterator[str]:
    state = FakeModelState()
    workspace, home = tmp_path / "ws", tmp_path / "home"
    workspace.mkdir()
    home.mkdir()
    async with serving(build_fake_model_app(state)) as model_url:
        env = {**os.environ, "HOME": str(home), "OPENAI_BASE_URL": model_url + "/v1",
               "OPENAI_API_KEY": "x", "OPENAI_MODEL": "fake-small", "NO_COLOR": "1"}
        env.pop("QWEN_SERVER_TOKEN", None)
        command = [shutil.which("node") or "node", qwen_entry, "serve", "--hostname",
                   "127.0.0.1", "--port", "0", "--no-web", "--workspace", str(workspace),
                   "--max-pending-prompts-per-session", str(max_pending)]
        async with await anyio.open_process(command, env=env, cwd=str(workspace),
                                            stderr=None) as process:
            try:
                url = await _listening(process)
                yield url
            finally:
                process.terminate()
                with anyio.move_on_after(10):
                    await process.wait()
                if process.returncode is None:
                    process.kill()
                    await process.wait()


async def _listening(process: anyio.abc.Process) -> str:
    assert process.stdout is not None
    seen = b""
    with anyio.fail_after(START_TIMEOUT_S):
        async for chunk in process.stdout:
            seen += chunk
            match = LISTENING.search(seen)
            if match:
                return match.group(1).decode()
    raise AssertionError(f"qwen serve exited before listening: {seen[-2000:]!r}")


async def test_the_runner_against_qwen_serve(tmp_path, qwen_entry):
    async with qwen_serve(tmp_path, qwen_entry) as url:
        report = await run_conformance(url, options=OPTIONS)
    outcomes = {r.id: r.outcome for r in report.results}
    details = {r.id: r.detail for r in report.results if outcomes[r.id] != EXPECTED.get(r.id)}
    assert outcomes == EXPECTED, details
    dropped = next(r for r in report.results if r.id == "backpressure.release.dropped")
    assert "saw 503" in dropped.detail and '"code":"prompt_queue_full"' in dropped.detail
