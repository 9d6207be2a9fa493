from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.sdk.harness import Daemon, daemon


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Daemon]:
    async with daemon(tmp_path) as srv:
        yield srv
