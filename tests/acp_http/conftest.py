from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.acp_http.server import RunningAcpServer, running_acp_server


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[RunningAcpServer]:
    async with running_acp_server(tmp_path) as srv:
        yield srv
