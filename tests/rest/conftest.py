from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.rest.server import RunningServer, running_server


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[RunningServer]:
    async with running_server(tmp_path) as srv:
        yield srv
