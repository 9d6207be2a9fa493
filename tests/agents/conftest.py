"""Real third-party ACP agents, installed from the npm registry into a cache folder.

``ACP_SERVER_AGENT_CACHE`` names the folder (default ``~/.cache/acp-server/npm``). The
suite is marked ``agents``; it is skipped, with the reason, only when npm or node is
missing. A failed install is a failure, not a skip.
"""

from __future__ import annotations

import pytest

from tests.npm import installed

QWEN_PACKAGE = "@qwen-code/qwen-code@0.24.4"
CLAUDE_PACKAGE = "@zed-industries/claude-agent-acp@0.23.1"


_installed = installed   # the shared helper (tests/npm.py)


@pytest.fixture(scope="session")
def qwen_entry() -> str:
    """qwen-code's CLI entry script (``node <it> --acp``)."""
    return _installed(QWEN_PACKAGE, "@qwen-code/qwen-code/cli-entry.js")


@pytest.fixture(scope="session")
def claude_entry() -> str:
    """claude-agent-acp's entry script (``node <it>``, an ACP agent on stdio)."""
    return _installed(CLAUDE_PACKAGE, "@zed-industries/claude-agent-acp/dist/index.js")
