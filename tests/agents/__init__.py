"""Stdio ACP agent fixtures (``fixture_agent``): honest, hung, flooding, evil."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def fixture_command(name: str, *flags: str) -> list[str]:
    """The command line of ``tests.agents.fixture_agent`` (run from the repository)."""
    return [sys.executable, "-m", "tests.agents.fixture_agent", "--name", name, *flags]
