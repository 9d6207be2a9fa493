"""Run a Node script of this folder and read the one JSON object it prints.

    report = await run_script("acp_sdk.mjs", sdk_folder, base_url, "ws", workspace)

Node 20 has ``WebSocket`` behind ``--experimental-websocket``; the flag is added only
when the plain ``node`` lacks it. A failing script fails the test with its stderr.
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import anyio

HERE = Path(__file__).parent


@functools.cache
def node_command() -> tuple[str, ...]:
    node = shutil.which("node")
    assert node is not None
    probe = subprocess.run([node, "-e", "process.exit(typeof WebSocket === 'function' ? 0 : 1)"],
                           check=False, timeout=30)
    return (node,) if probe.returncode == 0 else (node, "--experimental-websocket")


async def run_script(script: str, *args: str, timeout: float = 120) -> Any:
    with anyio.fail_after(timeout):
        result = await anyio.run_process([*node_command(), str(HERE / script), *args],
                                         check=False)
    stderr = result.stderr.decode(errors="replace")
    # node prints the offending source line first: a bundle's is one huge line
    told = "\n".join(line if len(line) < 2000 else line[:200] + " …"
                     for line in stderr.splitlines())
    assert result.returncode == 0, f"{script} exited {result.returncode}:\n{told}"
    lines = result.stdout.decode().strip().splitlines()
    assert lines, f"{script} printed nothing:\n{stderr}"
    return json.loads(lines[-1])
