from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fuzz.live import Live, live_server


@pytest.fixture(params=["asyncio", "trio"])
def live(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Live]:
    """The server under each anyio backend (uvicorn / hypercorn), driven synchronously."""
    with live_server(tmp_path, request.param) as server:
        yield server
