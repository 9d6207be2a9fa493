"""The README's quick start, pasted as written, against a served instance.

The first ``sh`` block of "Quick start with curl" starts the server: its flags are read
from the ``make serve ARGS="…"`` line and given to ``acp-server serve`` (on a free port,
in a throwaway workspace and state folder). The other blocks of the section run as they
are in ``bash``, the address replaced by the served one; what they print must be what
the README promises.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import ServeProcess
from tests.harness.process import ROOT

README = ROOT / "README.md"
DOCUMENTED_URL = "http://127.0.0.1:4170"


def quick_start_blocks() -> list[str]:
    text = README.read_text()
    section = text.split("## Quick start with curl", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)```", section, re.S)


def serve_flags(block: str, workspace: Path) -> list[str]:
    [args] = re.findall(r'make serve ARGS="([^"]*)"', block)
    return shlex.split(args.replace("$PWD", str(workspace)))


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """The server as the first block starts it: (its URL, the lines it printed)."""
    workspace = tmp_path / "project"
    workspace.mkdir()
    flags = serve_flags(quick_start_blocks()[0], workspace)
    with ServeProcess(workspace, *flags, "--port", "0", state_dir=tmp_path / "state") as child:
        yield child.base_url, child.state_line


def test_the_quick_start_starts_a_server_on_a_workspace() -> None:
    blocks = quick_start_blocks()
    assert len(blocks) == 3
    assert "--workspace" in blocks[0] and "make serve" in blocks[0]
    assert "Ctrl-C" in blocks[0] and "Ctrl-C" in blocks[1]


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_the_quick_start_blocks_do_what_the_readme_says(served: tuple[str, str]) -> None:
    url, state_line = served
    assert state_line.startswith("state in ")
    client_blocks = "\n".join(quick_start_blocks()[1:]).replace(DOCUMENTED_URL, url)
    done = subprocess.run(["bash", "-c", client_blocks], capture_output=True, text=True,
                          timeout=120)
    out = done.stdout
    assert done.returncode == 0, done.stderr
    assert re.search(r'\{"promptId":"[^"]+","lastEventId":0,"eventEpoch":"[^"]+"\}', out)
    # the stream, replayed from the start, until --max-time ends it
    assert "event: turn_complete" in out and '"sessionUpdate":"agent_message_chunk"' in out
    # the loop: two admitted, the third refused with what the README shows
    assert out.count("HTTP/1.1 202 Accepted") == 2
    assert "HTTP/1.1 503 Service Unavailable" in out
    assert re.search(r"^retry-after: 5\r?$", out, re.M | re.I)
    assert re.search(r'"code":"prompt_queue_full".*"limit":2,"pendingCount":2', out)
    # LMSP
    assert out.rstrip().endswith("completed Echo: hello")
