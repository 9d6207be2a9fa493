from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.lmsp.server import LmspServer, running_lmsp


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[LmspServer]:
    """All three doors (REST + SSE, /acp, LMSP) on one loopback server, SQLite store."""
    async with running_lmsp(tmp_path) as srv:
        yield srv
