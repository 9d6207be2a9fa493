from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fuzz.live import Live, live_daemon, live_server


@pytest.fixture(params=["asyncio", "trio", "granian-h2", "uvicorn-h2"])
def live(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Live]:
    """The server under each anyio backend (uvicorn / hypercorn, HTTP/1.1), and the
    daemon over HTTP/2 on each server we ship (granian's hyper, uvicorn with
    ``acp_server.http.http2``), driven synchronously."""
    if request.param.endswith("-h2"):
        with live_daemon(tmp_path, request.param.removesuffix("-h2")) as server:
            yield server
        return
    with live_server(tmp_path, request.param) as server:
        yield server
