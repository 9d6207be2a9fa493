"""The fixture agent (``tests.agents.fixture_agent``) as a command for a real
``acp-server serve``: its ``gate <file>`` prompts end only once ``<file>`` exists, so a
turn in a child process lasts until the test says (whatever the machine's load).

    gate = tmp_path / "gate-open"
    ServeProcess(tmp_path, "--agent", str(gated_agent(tmp_path)))     # the default agent
    ServeProcess(tmp_path, "--agent", f"gated={gated_agent(tmp_path)}")   # or a named one
    ... prompt f"gate {gate}" ...   # runs until
    gate.touch()                    # then answers one chunk "gated: gate <file>", end_turn

Contracts: the script is written to ``folder/gated-agent`` (executable) and runs this
interpreter; the agent's name is ``gated``; every other prompt is echoed at once as one
``agent_message_chunk`` ``gated: <text>`` (no reference-agent directives). A gate path
should be absolute (a relative one is taken from the agent's working folder).
"""

from __future__ import annotations

import sys
from pathlib import Path


def gated_agent(folder: Path) -> Path:
    script = folder / "gated-agent"
    script.write_text(f"#!/bin/sh\nexec {sys.executable} -m tests.agents.fixture_agent "
                      "--name gated\n")
    script.chmod(0o755)
    return script
