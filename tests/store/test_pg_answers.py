"""``acp_server.store.pg_answers``: a round trip PostgreSQL does not answer within its
bound is given up on from the client's side; one answered in time never is, nor a
connection that is not watched. The silence is real: the connection's own backend is
paused (SIGSTOP), the cluster otherwise serves."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from acp_server.store.pg_answers import Answered, NoAnswer, Watchdog
from tests.lmsp import stores


@pytest.fixture
def pg_url(tmp_path: Path) -> str:
    return stores.postgres_url_or_skip(tmp_path, "answers")


@contextlib.contextmanager
def _paused(conn: Answered) -> Iterator[None]:
    pid = conn.info.backend_pid
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def _watched(url: str, answer_s: float | None) -> tuple[Watchdog, Answered, list[str]]:
    hung: list[str] = []
    watchdog = Watchdog(hung.append)
    return watchdog, watchdog.connect(url, answer_s=answer_s, autocommit=True), hung


def test_a_round_trip_with_no_answer_is_given_up(pg_url: str) -> None:
    watchdog, conn, hung = _watched(pg_url, 0.3)
    try:
        with _paused(conn), pytest.raises(NoAnswer, match="no answer within 0.3 s"):
            conn.execute("SELECT 1")
        assert conn.broken and hung == ["PostgreSQL: no answer within 0.3 s (a connection "
                                        "abandoned)"]
    finally:
        conn.close()
        watchdog.close()


def test_answered_round_trips_and_unwatched_connections_are_left_alone(pg_url: str) -> None:
    watchdog, conn, hung = _watched(pg_url, 0.3)
    try:
        for _ in range(200):   # each answered within its bound: never cut, however many
            assert conn.execute("SELECT 1").fetchone() == (1,)
        conn.answer_s = None   # not watched: waits as long as the server does
        done = threading.Event()

        def query() -> None:
            conn.execute("SELECT 1")
            done.set()
        with _paused(conn):
            worker = threading.Thread(target=query)
            worker.start()
            assert not done.wait(1.0)   # more than the bound, paused: still waiting
        worker.join(30)
        assert done.is_set() and not conn.broken and hung == []
    finally:
        conn.close()
        watchdog.close()


def test_a_closed_watchdog_watches_again_on_the_next_round_trip(pg_url: str) -> None:
    watchdog, conn, hung = _watched(pg_url, 0.3)
    try:
        conn.execute("SELECT 1")
        watchdog.close()   # its thread ends
        with _paused(conn), pytest.raises(NoAnswer):
            conn.execute("SELECT 1")   # a new thread watches
        assert len(hung) == 1
    finally:
        conn.close()
        watchdog.close()


def test_an_answer_waiting_to_be_read_is_not_cut(pg_url: str) -> None:
    """The process itself paused past a deadline (SIGSTOP, a VM paused) while the
    server answered: the answer waits on the socket, and the deadline moves on."""
    watchdog, conn, hung = _watched(pg_url, 0.05)
    try:
        conn.pgconn.send_query(b"SELECT 1")   # sent; its answer not read yet
        while conn.pgconn.flush():
            pass
        fd = conn.pgconn.socket
        assert select.select([fd], [], [], 30)[0]   # the answer is there
        watchdog.arm(conn, 0.05)
        first = watchdog._armed[id(conn)][0]
        deadline = time.monotonic() + 30
        while watchdog._armed[id(conn)][0] == first:   # past it: moved on, not fired
            assert time.monotonic() < deadline
            time.sleep(0.01)   # a tick of the wait for the condition above
        watchdog.disarm(conn)
        conn.pgconn.consume_input()
        assert conn.pgconn.get_result() is not None
        assert not conn.abandoned and hung == []
    finally:
        conn.close()
        watchdog.close()
