from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.lmsp.server import LmspServer, running_lmsp


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[LmspServer]:
    async with running_lmsp(tmp_path) as srv:
        yield srv
