"""The operator's checks answer while PostgreSQL hangs (a real ``acp-server serve`` on a
cluster of the test's own, paused with SIGSTOP: its connections stay open and a
statement on them never returns, as behind a network gone silent). ``/health?deep=1``
(whose probe had a 2 s timeout that waited for the worker thread anyway) and
``/metrics`` (the task gauge's query) hung with the store, as long as it did."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest

from tests.harness import ServeProcess
from tests.store.test_outage_processes import own_cluster  # noqa: F401 (a fixture)

pytestmark = pytest.mark.anyio


def _cluster_pids(directory: Path) -> list[int]:
    """The cluster's postmaster and its children (every backend)."""
    postmaster = int((directory / "data" / "postmaster.pid").read_text().split()[0])
    pids = [postmaster]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == postmaster:
                    pids.append(int(entry.name))
    return pids


@contextlib.contextmanager
def paused(directory: Path) -> Iterator[None]:
    pids = _cluster_pids(directory)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


async def test_health_and_metrics_answer_while_postgresql_hangs(
        tmp_path: Path, own_cluster: Path) -> None:  # noqa: F811
    url = os.environ["_ACP_OWN_PG"]
    async with ServeProcess(tmp_path, "--store", url) as daemon:
        base = daemon.base_url
        async with httpx.AsyncClient(base_url=base, timeout=60) as client:
            assert (await client.get("/health", params={"deep": "1"})).status_code == 200
            assert "acp_server_lmsp_tasks" in (await client.get("/metrics")).text
            with paused(own_cluster):
                # three rounds: the task gauge's 5 s cache is over by the third, whose
                # scrape asks the store (each deep probe gives up after 2 s)
                for _ in range(3):   # later rounds find the first's calls still hung
                    deep = await client.get("/health", params={"deep": "1"})
                    assert deep.status_code == 503, deep.text
                    assert deep.json()["store"]["reason"] == "no answer within 2 s"
                    scraped = await client.get("/metrics")
                    assert scraped.status_code == 200
                    assert "acp_server_sessions 0.0" in scraped.text
            with anyio.fail_after(30):   # resumed: the store answers again
                while (await client.get("/health", params={"deep": "1"})).status_code != 200:
                    await anyio.sleep(0.05)
