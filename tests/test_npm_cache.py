"""``tests/npm.py`` in parallel: two processes that need the same npm package at once run
``npm install`` once between them, and the second waits for the first's install to
finish instead of reading a half-written ``node_modules`` (pytest-xdist workers)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.harness.process import ROOT

FAKE_NPM = """#!/bin/sh
# counts its runs, then installs only once the test writes a line to the FIFO
echo run >> "$COUNT"
read line < "$RELEASE"
mkdir -p node_modules/pkg && echo '{}' > node_modules/pkg/package.json
"""
NEEDS = "from tests.npm import installed; print(installed('pkg@1.0.0', 'pkg/package.json'))"


def until(condition, what: str, limit: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    """Polls ``condition`` (a state of another process) until it holds."""
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.01)


def blocked_on(lock: Path) -> int:
    """How many lock requests wait on ``lock`` (``/proc/locks`` lines with ``->``)."""
    inode = os.stat(lock).st_ino
    return sum(1 for line in Path("/proc/locks").read_text().splitlines()
               if "->" in line and line.split()[-3].rsplit(":", 1)[-1] == str(inode))


def test_two_processes_install_a_package_once(tmp_path: Path) -> None:
    bin_dir, cache = tmp_path / "bin", tmp_path / "cache"
    bin_dir.mkdir()
    for name, text in (("npm", FAKE_NPM), ("node", "#!/bin/sh\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    count, release = tmp_path / "count", tmp_path / "release"
    os.mkfifo(release)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "ACP_SERVER_AGENT_CACHE": str(cache), "COUNT": str(count), "RELEASE": str(release)}

    def start() -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-c", NEEDS], cwd=ROOT, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    first = start()
    try:
        until(count.exists, "the first npm install to start")
        second = start()
        try:
            until(lambda: blocked_on(cache / ".install.lock") == 1,
                  "the second process to wait on the install lock")
            with open(release, "w") as fifo:   # lets the first install finish
                fifo.write("go\n")
            outputs = [p.communicate(timeout=60) for p in (first, second)]
        finally:
            second.kill()
    finally:
        first.kill()
    expected = f"{cache}/node_modules/pkg/package.json\n"
    assert [out for out, _ in outputs] == [expected, expected], outputs
    assert count.read_text() == "run\n"   # npm ran once
