"""A real ``acp-server serve`` paused past its session lease (``SIGSTOP``), its session
taken over meanwhile (the lease row moved to another instance, token + 1, as an
adoption does), then resumed (``SIGCONT``): the turn it was running wakes up and
publishes, but the store refuses those writes (fencing), nothing more of the session
lands in the journal, and the instance stops the session (a write is forwarded from
there, a read answered from the journal). The turn is the fixture agent's ``gate``: it
ends only once the test, after the take-over, creates the gate's file (a timed turn
could be over before the pause on a loaded machine, and prove nothing)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psycopg
import pytest

from tests.agents.gated import gated_agent
from tests.harness import ServeProcess
from tests.lmsp import stores
from tests.store.segment_rows import stored_events

pytestmark = pytest.mark.slow


def _wait(condition: object, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not condition():   # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_a_paused_owner_writes_nothing_after_losing_its_lease(tmp_path: Path) -> None:
    if not stores.postgres_dsn():
        pytest.skip(stores.SKIP_POSTGRES)
    url = stores.postgres_url_for(tmp_path, "paused")
    gate = tmp_path / "gate-open"
    with ServeProcess(tmp_path, "--store", url, "--session-lease-ttl-ms", "600",
                      "--session-lease-renew-ms", "150",
                      "--agent", str(gated_agent(tmp_path))) as owner, \
            psycopg.connect(url, autocommit=True) as db:
        http = owner.http
        sid = http.post("/session", json={"sessionScope": "thread"}).json()["sessionId"]
        accepted = http.post(f"/session/{sid}/prompt", json={
            "prompt": [{"type": "text", "text": f"gate {gate}"}]})
        assert accepted.status_code == 202

        def ended() -> int:
            return sum(1 for e in stored_events(db.execute, sid, "%s")
                       if e[1] in ("turn_complete", "turn_error"))

        def count() -> int:
            return len(stored_events(db.execute, sid, "%s"))

        _wait(lambda: count() >= 1)   # the prompt started (its echo is journaled)
        os.kill(owner.pid, signal.SIGSTOP)
        try:
            _wait(lambda: db.execute(
                "SELECT expires_at < %s FROM session_leases WHERE session_id = %s",
                (time.time(), sid)).fetchone()[0])
            db.execute("UPDATE session_leases SET instance = 'adopter', token = token + 1, "
                       "expires_at = %s WHERE session_id = %s", (time.time() + 3600, sid))
            written = count()
            assert ended() == 0   # the turn was running at the pause and the take-over
            gate.touch()          # its answer waits in the pipe for the woken server
        finally:
            os.kill(owner.pid, signal.SIGCONT)
        # stopped there: a write for it is now forwarded to the adopter (which
        # advertises no URL here: 503 owner_unreachable); a read comes from the journal
        _wait(lambda: http.post(f"/session/{sid}/cancel").status_code == 503)
        assert http.get(f"/session/{sid}/status").status_code == 200
        assert count() == written and ended() == 0   # nothing of the woken turn landed
        assert db.execute("SELECT instance FROM session_leases WHERE session_id = %s",
                          (sid,)).fetchone() == ("adopter",)
        assert owner.returncode is None   # the process itself carries on
