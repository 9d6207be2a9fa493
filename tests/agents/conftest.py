"""Real third-party ACP agents, installed from the npm registry into a cache folder.

``ACP_SERVER_AGENT_CACHE`` names the folder (default ``~/.cache/acp-server/npm``). The
suite is marked ``agents``; it is skipped, with the reason, only when npm or node is
missing. A failed install is a failure, not a skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

QWEN_PACKAGE = "@qwen-code/qwen-code@0.24.4"


def _cache() -> Path:
    return Path(os.environ.get("ACP_SERVER_AGENT_CACHE",
                               Path.home() / ".cache" / "acp-server" / "npm"))


@pytest.fixture(scope="session")
def qwen_entry() -> str:
    """The path of qwen-code's CLI entry script, installed on first use."""
    npm, node = shutil.which("npm"), shutil.which("node")
    if npm is None or node is None:
        pytest.skip("npm/node not installed: the real-agent suite needs them")
    cache = _cache()
    entry = cache / "node_modules" / "@qwen-code" / "qwen-code" / "cli-entry.js"
    if not entry.exists():
        cache.mkdir(parents=True, exist_ok=True)
        if not (cache / "package.json").exists():
            (cache / "package.json").write_text('{"name": "acp-server-agent-cache", "private": true}\n')
        subprocess.run([npm, "install", QWEN_PACKAGE, "--no-audit", "--no-fund", "--loglevel=error"],
                       cwd=cache, check=True, timeout=600)
    assert entry.exists(), f"{QWEN_PACKAGE} installed no {entry}"
    return str(entry)
