"""npm packages for the tests, installed on first use into one cache folder.

    entry = installed("@qwen-code/sdk@0.1.14", "@qwen-code/sdk/package.json")

``ACP_SERVER_AGENT_CACHE`` names the folder (default ``~/.cache/acp-server/npm``).
Without npm or node the calling test is skipped, with the reason; a failed install is
a failure, not a skip.

Safe in parallel (pytest-xdist workers, two checkouts on one machine): every install
into the folder runs under an exclusive ``fcntl`` lock on ``<folder>/.install.lock``,
and the entry is looked at again once the lock is held (a look takes it shared), so a package another process
just installed is not installed twice, and two ``npm install`` runs never rewrite
``node_modules`` and ``package-lock.json`` at once. The lock is released when its
holder ends, however it ends.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def cache() -> Path:
    return Path(os.environ.get("ACP_SERVER_AGENT_CACHE",
                               Path.home() / ".cache" / "acp-server" / "npm"))


@contextlib.contextmanager
def install_lock(folder: Path, exclusive: bool = True) -> Iterator[None]:
    """Holds the install lock of the cache ``folder`` (blocking): exclusive to install,
    shared to look (a look waits for an install under way to finish)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".install.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def installed(package: str, entry: str) -> str:
    """The path of ``entry`` inside the npm cache, installing ``package`` on first use."""
    npm, node = shutil.which("npm"), shutil.which("node")
    if npm is None or node is None:
        pytest.skip("npm/node not installed: the real-agent and real-client suites need them")
    folder = cache()
    path = folder / "node_modules" / entry
    with install_lock(folder, exclusive=False):
        present = path.exists()
    if not present:
        with install_lock(folder):
            if not path.exists():   # another process may have installed it meanwhile
                if not (folder / "package.json").exists():
                    (folder / "package.json").write_text(
                        '{"name": "acp-server-agent-cache", "private": true}\n')
                subprocess.run([npm, "install", package, "--no-audit", "--no-fund",
                                "--loglevel=error"], cwd=folder, check=True, timeout=600)
    assert path.exists(), f"{package} installed no {path}"
    return str(path)
