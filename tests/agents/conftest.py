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
CLAUDE_PACKAGE = "@zed-industries/claude-agent-acp@0.23.1"


def _cache() -> Path:
    return Path(os.environ.get("ACP_SERVER_AGENT_CACHE",
                               Path.home() / ".cache" / "acp-server" / "npm"))


def _installed(package: str, entry: str) -> str:
    """The path of ``entry`` inside the npm cache, installing ``package`` on first use."""
    npm, node = shutil.which("npm"), shutil.which("node")
    if npm is None or node is None:
        pytest.skip("npm/node not installed: the real-agent suite needs them")
    cache = _cache()
    path = cache / "node_modules" / entry
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        if not (cache / "package.json").exists():
            (cache / "package.json").write_text('{"name": "acp-server-agent-cache", "private": true}\n')
        subprocess.run([npm, "install", package, "--no-audit", "--no-fund", "--loglevel=error"],
                       cwd=cache, check=True, timeout=600)
    assert path.exists(), f"{package} installed no {path}"
    return str(path)


@pytest.fixture(scope="session")
def qwen_entry() -> str:
    """qwen-code's CLI entry script (``node <it> --acp``)."""
    return _installed(QWEN_PACKAGE, "@qwen-code/qwen-code/cli-entry.js")


@pytest.fixture(scope="session")
def claude_entry() -> str:
    """claude-agent-acp's entry script (``node <it>``, an ACP agent on stdio)."""
    return _installed(CLAUDE_PACKAGE, "@zed-industries/claude-agent-acp/dist/index.js")
