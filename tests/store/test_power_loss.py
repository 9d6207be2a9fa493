"""A power loss never makes a silent gap (``acp_server.store.sqlite``, ``unsynced_runs``):
the session journal's own SQLite commits are not fsynced (``synchronous=NORMAL``), so a
power loss or a kernel crash may take the last of them back, ids readers saw included.
A run that did not stop cleanly, on another boot (or an unknown one), makes the next
start restore every session under a new epoch (readers get ``state_resync_required``);
a ``kill -9`` on the same boot loses nothing and keeps the epoch (the same-boot half
end to end: ``test_session_restart.test_kill_9_keeps_sessions_prompts_and_cursors``).
The boot id is injected (``boot_id=``, ``BOOT_ID_PATH``)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest

from acp_server.store import sqlite as sqlite_store
from acp_server.store.sessions import StoreSessionJournal
from acp_server.store.sqlite import SqliteTaskStore, read_boot_id
from bridge.journal import EventRecord, SessionOpened
from tests.harness import local_server
from tests.store.test_session_restart import read_events

pytestmark = pytest.mark.anyio


def _runs(conn: Any) -> list[tuple[str, str]]:
    return conn.execute("SELECT run, boot_id FROM unsynced_runs").fetchall()


async def _journal_a_session(store: SqliteTaskStore, *, fsync: bool) -> None:
    """A session and one event, committed by a journal that is then closed (the store
    stays open: as at a crash, nothing of the store's own close has run)."""
    async with StoreSessionJournal(store, fsync=fsync) as journal:
        journal.append(SessionOpened(session_id="s1", agent="reference", cwd="/ws",
                                     created_at=1.0, epoch="e1"))
        await journal.wait(journal.append(EventRecord(
            session_id="s1", event_id=1, type="x", prompt_id=None,
            envelope=b'{"id":1,"v":1,"type":"x","data":{}}')))


async def _gaps_seen_by(path: str, boot: str | None) -> tuple[bool, list[bool]]:
    """A second store on the same file (what the next start finds) with boot id
    ``boot``: (``unsynced_loss``, each restored session's ``gap``)."""
    async with SqliteTaskStore(path, boot_id=lambda: boot) as store, \
            StoreSessionJournal(store) as journal:
        return store.unsynced_loss, [found.gap for found in await journal.restore()]


@pytest.mark.parametrize(("boot", "lost"), [("boot-a", False),   # a kill -9
                                          ("boot-b", True),    # a power loss
                                          (None, True)])       # an unknown boot
async def test_an_unclean_stop_on_another_boot_gives_every_session_a_new_epoch(
        tmp_path: Path, boot: str | None, lost: bool) -> None:
    path = str(tmp_path / "store.db")
    async with SqliteTaskStore(path, boot_id=lambda: "boot-a") as crashed:
        assert await crashed._read(_runs) == []   # nothing written without fsync yet
        await _journal_a_session(crashed, fsync=False)
        # written (flushed) before the first commit without fsync, until a clean close
        assert await crashed._read(_runs) == [(crashed.run, "boot-a")]
        assert await _gaps_seen_by(path, boot) == (lost, [lost])
        # that start restored the journal: its clean close deleted the crashed run's row
        assert await crashed._read(_runs) == []
        assert await _gaps_seen_by(path, "boot-c") == (False, [False])


async def test_a_clean_stop_or_fsync_leaves_nothing_to_resync(tmp_path: Path) -> None:
    path = str(tmp_path / "clean.db")
    async with SqliteTaskStore(path, boot_id=lambda: "boot-a") as store:
        await _journal_a_session(store, fsync=False)
    assert await _gaps_seen_by(path, "boot-b") == (False, [False])
    path = str(tmp_path / "fsync.db")
    async with SqliteTaskStore(path, boot_id=lambda: "boot-a") as store:
        await _journal_a_session(store, fsync=True)   # every journal commit FULL
        assert await store._read(_runs) == []
        assert await _gaps_seen_by(path, "boot-b") == (False, [False])


async def test_a_store_that_only_reads_keeps_an_earlier_runs_row(tmp_path: Path) -> None:
    """A store that did not restore the journal (``acp-server token`` on the same file)
    leaves another run's row: the server's next start still resyncs."""
    path = str(tmp_path / "store.db")
    async with SqliteTaskStore(path, boot_id=lambda: "boot-a") as crashed:
        await _journal_a_session(crashed, fsync=False)
        async with SqliteTaskStore(path, boot_id=lambda: "boot-b") as other:
            assert other.unsynced_loss
        with sqlite3.connect(path) as conn:
            assert _runs(conn) == [(crashed.run, "boot-a")]


def test_the_boot_id_is_read_from_the_kernel(tmp_path: Path) -> None:
    boot = tmp_path / "boot_id"
    boot.write_text("1234-abcd\n")
    assert read_boot_id(str(boot)) == "1234-abcd"
    assert read_boot_id(str(tmp_path / "missing")) is None   # unknown
    if Path(sqlite_store.BOOT_ID_PATH).exists():
        assert read_boot_id() == Path(sqlite_store.BOOT_ID_PATH).read_text().strip()


def _crashed_run_on(state: Path, boot: str) -> None:
    """What a run that lost power leaves in the file (shown by the tests above)."""
    with sqlite3.connect(state / "lmsp.sqlite3") as conn:
        conn.execute("INSERT INTO unsynced_runs(run, boot_id) VALUES ('crashed', ?)",
                     (boot,))


async def _resync_seen(client: httpx.AsyncClient, sid: str, cursor: int, epoch: str
                       ) -> bool:
    seen = await read_events(client, sid, lambda e: e["type"] == "state_resync_required"
                             or e.get("id") == cursor, last_event_id=cursor - 1, epoch=epoch)
    return seen[0]["type"] == "state_resync_required"


async def test_a_reader_resyncs_after_a_power_loss(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end: after a run that stopped uncleanly on another boot, a reader that
    reconnects with ``Last-Event-ID`` and its epoch gets ``state_resync_required``; the
    new epoch is the session's from then on (the next start keeps it)."""
    boot = tmp_path / "boot_id"
    monkeypatch.setattr(sqlite_store, "BOOT_ID_PATH", str(boot))
    state = tmp_path / "state"
    boot.write_text("boot-1")
    async with local_server(tmp_path, state_dir=state) as srv:
        created = (await srv.client.post("/session", json={"sessionScope": "thread"})).json()
        sid, epoch = created["sessionId"], created["eventEpoch"]
        prompt = (await srv.client.post(f"/session/{sid}/prompt", json={
            "prompt": [{"type": "text", "text": "hello"}]})).json()
        seen = await read_events(srv.client, sid, lambda e: e["type"] == "turn_complete"
                                 and e.get("promptId") == prompt["promptId"], last_event_id=0)
        cursor = [e["id"] for e in seen if e.get("id") is not None][-1]
    _crashed_run_on(state, "boot-1")   # then power came back: a new boot
    boot.write_text("boot-2")
    async with local_server(tmp_path, state_dir=state) as srv:
        assert await _resync_seen(srv.client, sid, cursor, epoch)
        renewed = (await srv.client.post(f"/session/{sid}/load", json={})).json()["eventEpoch"]
        assert renewed != epoch
    async with local_server(tmp_path, state_dir=state) as srv:   # a clean stop: kept
        assert not await _resync_seen(srv.client, sid, cursor, renewed)
    _crashed_run_on(state, "boot-2")   # a kill -9 on this boot: nothing lost, kept
    async with local_server(tmp_path, state_dir=state) as srv:
        assert not await _resync_seen(srv.client, sid, cursor, renewed)
