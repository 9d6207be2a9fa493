"""``acp-server serve`` as a child process for the synchronous tests.

    proc, url = start_serve(tmp_path, "--log-format", "json", stderr=subprocess.PIPE)

The child runs this checkout (``PYTHONPATH``) on an ephemeral loopback port, without
the caller's ``ACP_SERVER_TOKEN`` (a blank one is refused), with its state under
``workspace/state``. It answers once the listening line was read; the caller ends the
process. (``tests/hostile/daemon.py`` is the async variant for either backend.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def start_serve(workspace: Path, *flags: str, stderr: Any = subprocess.DEVNULL,
                cwd: Path | None = None) -> tuple[subprocess.Popen[str], str]:
    env = {k: v for k, v in os.environ.items() if k != "ACP_SERVER_TOKEN"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen(
        [sys.executable, "-m", "acp_server", "serve", "--port", "0", "--workspace",
         str(workspace), "--state-dir", str(workspace / "state"), *flags],
        stdout=subprocess.PIPE, stderr=stderr, text=True, env=env, cwd=cwd)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "listening on " in line, line
    return proc, line.split("listening on ", 1)[1].split()[0]
