"""``qwen serve`` 0.24.4 (the Node daemon we are compatible with) on the same 503 load.

    qwen = qwen_503(load)     # {"rps": ...} or None when node or the package is missing

The package comes from the npm cache the test suites fill (``tests/npm.py``:
``ACP_SERVER_AGENT_CACHE``, default ``~/.cache/acp-server/npm``); its agent talks to
the suites' fake OpenAI model (``tests.bridge.fake_model_server``), served here in a
child process. The queue (``--max-pending-prompts-per-session 1``) is held by a
``SLOW`` prompt, which the fake model streams for 5 s, so the load runs at most 3 s.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

QWEN_ENTRY = "@qwen-code/qwen-code/cli-entry.js"
LISTENING = re.compile(r"listening on (http://127\.0\.0\.1:(\d+))")
HOLD = {"prompt": [{"type": "text", "text": "SLOW story please"}]}
PROMPT = '{"prompt":[{"type":"text","text":"/chunks 1 ping"}]}'


def _cache() -> Path:
    return Path(os.environ.get("ACP_SERVER_AGENT_CACHE",
                               Path.home() / ".cache" / "acp-server" / "npm"))


def _listening(proc: subprocess.Popen[str], deadline_s: float = 60) -> int:
    assert proc.stdout is not None
    end = time.monotonic() + deadline_s
    for line in proc.stdout:
        match = LISTENING.search(line)
        if match:
            return int(match.group(2))
        if time.monotonic() > end:
            break
    raise RuntimeError("no listening line")


def qwen_503(load: Callable[..., dict]) -> dict | None:
    node, entry = shutil.which("node"), _cache() / "node_modules" / QWEN_ENTRY
    if node is None or not entry.exists():
        return None
    procs: list[subprocess.Popen[str]] = []
    try:
        with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as folder:
            model = subprocess.Popen([sys.executable, "-m", "bench.peer_bench", "--fake-model"],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True)
            procs.append(model)
            model_port = _listening(model)
            workspace, home = Path(folder, "ws"), Path(folder, "home")
            workspace.mkdir()
            home.mkdir()
            env = {**os.environ, "HOME": str(home), "NO_COLOR": "1", "OPENAI_API_KEY": "x",
                   "OPENAI_BASE_URL": f"http://127.0.0.1:{model_port}/v1",
                   "OPENAI_MODEL": "fake-small"}
            env.pop("QWEN_SERVER_TOKEN", None)
            qwen = subprocess.Popen([node, str(entry), "serve", "--hostname", "127.0.0.1",
                                     "--port", "0", "--no-web", "--workspace", str(workspace),
                                     "--max-pending-prompts-per-session", "1"],
                                    cwd=workspace, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, text=True)
            procs.append(qwen)
            port = _listening(qwen)
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
                sid = client.post("/session", json={"cwd": str(workspace)}).json()["sessionId"]
                held = client.post(f"/session/{sid}/prompt", json=HOLD)
                assert held.status_code == 202, held.text
            result = load(port, f"/session/{sid}/prompt", PROMPT, seconds=3.0)
            _stop(procs)
            return result
    except (RuntimeError, OSError, httpx.HTTPError, KeyError) as exc:
        print(f"qwen serve: not measured ({exc!r})", file=sys.stderr)
        return None
    finally:
        _stop(procs)


def _stop(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def _serve_fake_model() -> None:
    import uvicorn

    from tests.bridge.fake_model_server import FakeModelState, build_fake_model_app

    class Announcing(uvicorn.Server):
        async def startup(self, sockets=None):  # type: ignore[no-untyped-def]
            await super().startup(sockets=sockets)
            port = self.servers[0].sockets[0].getsockname()[1]
            print(f"listening on http://127.0.0.1:{port}", flush=True)

    Announcing(uvicorn.Config(build_fake_model_app(FakeModelState()), host="127.0.0.1",
                              port=0, log_level="warning", lifespan="off")).run()


if __name__ == "__main__":
    if sys.argv[1:] == ["--fake-model"]:
        _serve_fake_model()
