"""The sessions' held notices (``acp_server.store.postgres``, ``HOLD_S``) across a real
PostgreSQL outage: the empty transaction that sends them once the writes stop fails
while the server is down; that must not crash the store or make it spin, and the held
notices must go out with the first commit once PostgreSQL is back (polling covers a
reader meanwhile).

The cluster is this test's own (``own_cluster``), stopped and started with
``pg_ctl``. What the store sent is read at its COMMIT (``_commit``'s notices), not by a
listener, so no listener's reconnection races the assertion.
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.parse
from pathlib import Path
from typing import Any

import anyio
import pytest

from acp_server.store.errors import StoreUnavailableError
from acp_server.store.postgres import PostgresTaskStore
from tests.lmsp.test_store import create
from tests.store.test_outage_processes import PG_SCRIPT, own_cluster  # noqa: F401 - fixture

pytestmark = pytest.mark.anyio
HELD = "held-0b5e2f64-3c1a-4b7e-9a51-6f0d2c8e4a17"


async def test_a_held_notice_survives_an_outage_and_goes_out_with_the_next_commit(
        own_cluster: Path) -> None:  # noqa: F811 - the fixture
    url = os.environ["_ACP_OWN_PG"]
    port = urllib.parse.urlsplit(url).port
    async with PostgresTaskStore(url) as store:
        sent: list[set[tuple[str, str]]] = []
        failed: list[BaseException] = []
        commit, write = store._commit, store._write

        def spy_commit(conn: Any, state: Any) -> None:
            commit(conn, state)
            sent.append(set(state.notices))

        async def spy_write(fn: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return await write(fn, *args, **kwargs)
            except StoreUnavailableError as exc:
                failed.append(exc)
                raise

        store._commit = spy_commit  # type: ignore[method-assign]
        store._write = spy_write  # type: ignore[method-assign]
        await create(store)   # the store works; its writer connections are open
        subprocess.run(["bash", str(PG_SCRIPT), "stop", str(own_cluster)], check=True,
                       capture_output=True)

        # A session's notice held by a commit that landed just before the outage.
        with store._held_lock:
            store._held.add(HELD)
        wake = store._held_wake
        assert wake is not None
        wake.set()
        with anyio.fail_after(30):   # the empty transaction is tried and fails ...
            while not failed:
                await anyio.sleep(0.01)
        with anyio.fail_after(30):   # ... and the sender waits again: no retry loop
            while store._held_wake is wake or store._held_wake.is_set():
                await anyio.sleep(0.01)
        assert len(failed) == 1
        assert HELD in store._held   # kept for the next commit, not dropped
        assert not any(("s", HELD) in notices for notices in sent)

        subprocess.run(["bash", str(PG_SCRIPT), "start", str(own_cluster), str(port)],
                       check=True, capture_output=True)
        deadline = time.monotonic() + 60
        while True:   # the store's backoff gate opens by itself
            try:
                await create(store)
                break
            except StoreUnavailableError:
                assert time.monotonic() < deadline, "the store never came back"
                await anyio.sleep(0.05)
        assert any(("s", HELD) in notices for notices in sent), sent
        assert HELD not in store._held
