"""npm packages for the tests, installed on first use into one cache folder.

    entry = installed("@qwen-code/sdk@0.1.14", "@qwen-code/sdk/package.json")

``ACP_SERVER_AGENT_CACHE`` names the folder (default ``~/.cache/acp-server/npm``).
Without npm or node the calling test is skipped, with the reason; a failed install is
a failure, not a skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest


def cache() -> Path:
    return Path(os.environ.get("ACP_SERVER_AGENT_CACHE",
                               Path.home() / ".cache" / "acp-server" / "npm"))


def installed(package: str, entry: str) -> str:
    """The path of ``entry`` inside the npm cache, installing ``package`` on first use."""
    npm, node = shutil.which("npm"), shutil.which("node")
    if npm is None or node is None:
        pytest.skip("npm/node not installed: the real-agent and real-client suites need them")
    folder = cache()
    path = folder / "node_modules" / entry
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        if not (folder / "package.json").exists():
            (folder / "package.json").write_text('{"name": "acp-server-agent-cache", "private": true}\n')
        subprocess.run([npm, "install", package, "--no-audit", "--no-fund", "--loglevel=error"],
                       cwd=folder, check=True, timeout=600)
    assert path.exists(), f"{package} installed no {path}"
    return str(path)
