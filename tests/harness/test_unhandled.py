"""The harness's guard: an exception out of an in-process app fails the ``serving``
block; a cancellation does not; a child's log is read for the servers' own lines."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.harness import serving
from tests.harness.unhandled import unhandled_lines

pytestmark = pytest.mark.anyio


async def broken(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":   # hypercorn: "continuing without Lifespan support"
        raise RuntimeError("no lifespan here")
    if scope["type"] == "http" and scope["path"] == "/boom":
        raise RuntimeError("a bug in the app")
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})


async def test_an_exception_out_of_the_app_fails_the_block() -> None:
    with pytest.raises(AssertionError, match="escaped the app") as failed:
        async with serving(broken) as url, httpx.AsyncClient(base_url=url) as client:
            assert (await client.get("/fine")).status_code == 204
            assert (await client.get("/boom")).status_code == 500
    assert "GET /boom" in str(failed.value) and "a bug in the app" in str(failed.value)


async def test_a_test_that_provokes_it_says_so() -> None:
    async with serving(broken, app_errors_expected=True) as url, \
            httpx.AsyncClient(base_url=url) as client:
        assert (await client.get("/boom")).status_code == 500


async def test_an_app_that_raises_nothing_passes() -> None:
    async with serving(broken) as url, httpx.AsyncClient(base_url=url) as client:
        assert (await client.get("/fine")).status_code == 204


def test_the_servers_lines_are_found_in_a_log() -> None:
    log = ("INFO: started\nERROR:    Exception in ASGI application\nTraceback ...\n"
           "[ERROR] Application callable raised an exception\n"
           "ERROR Error in ASGI Framework\nWARNING: a client's fault\n")
    assert len(unhandled_lines(log)) == 3
    assert unhandled_lines("ERROR rest: POST /session failed\n") == []
    loop = ("ERROR asyncio: Task exception was never retrieved\n"
            "ERROR asyncio: Exception in callback Handle._run()\n")
    assert len(unhandled_lines(loop)) == 2
