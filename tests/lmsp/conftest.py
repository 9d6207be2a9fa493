from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.lmsp import stores
from tests.lmsp.server import LmspServer, running_lmsp


@pytest.fixture(params=stores.selected_stores())
def store_name(request: pytest.FixtureRequest) -> Iterator[str]:
    """Runs the test once per selected store (``running_lmsp`` serves it); the
    ``postgres`` run is skipped when ``ACP_SERVER_TEST_POSTGRES`` is unset."""
    if request.param == "postgres" and not stores.postgres_dsn():
        pytest.skip(stores.SKIP_POSTGRES)
    stores.current["name"] = request.param
    try:
        yield request.param
    finally:
        stores.current["name"] = "sqlite"


@pytest.fixture
async def server(tmp_path: Path, store_name: str) -> AsyncIterator[LmspServer]:
    async with running_lmsp(tmp_path) as srv:
        yield srv
