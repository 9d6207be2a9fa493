"""A strict WebSocket client (Node's, which fails a handshake as a browser does when
the answer chooses none of its subprotocols) with its token as the bearer
subprotocol, against the shipped daemon on both servers: the answer never carries
the token; a marker offered beside it (``qwen-ws``, as ``qwen serve``'s web shell
offers) is chosen and the socket works; the bearer entry alone is refused by such a
client, as against ``qwen serve`` 0.24.4 (``ws_bearer.mjs``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.clients.node import run_script
from tests.harness import ServeProcess

pytestmark = [pytest.mark.anyio, pytest.mark.clients,
              pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")]


@pytest.mark.parametrize("server", ["granian", "uvicorn"])
async def test_a_strict_client_with_the_bearer_subprotocol(tmp_path: Path, server: str) -> None:
    async with ServeProcess(tmp_path, "--http-server", server, "--token", "s3cret") as daemon:
        report = await run_script("ws_bearer.mjs", daemon.base_url, "s3cret")
    marker_first, marker_second, alone = report["cases"]
    for case in (marker_first, marker_second):
        assert (case["opened"], case["protocol"], case["reply"]) == (True, "qwen-ws", 1), case
    assert not alone["opened"] and alone["error"], alone
