"""PostgreSQL connections that give up on a server that does not answer.

    watchdog = Watchdog(on_hang=lambda reason: ...)       # one per engine
    conn = watchdog.connect(url, answer_s=10.0, autocommit=True, connect_timeout=3)
    conn.execute("SELECT 1")   # NoAnswer (an OperationalError) after 10 s without an answer
    watchdog.close()           # its thread ends (a later round trip starts another)

Why: a PostgreSQL can hang rather than fail. Paused (SIGSTOP), or behind a network
gone silent, it keeps its TCP connections open and a statement on them never returns:
``statement_timeout`` is the server's and does not fire while it is paused, and TCP
keepalives or ``tcp_user_timeout`` do not fire on loopback, where the kernel still
acknowledges every byte. A statement runs on a worker thread, which cancelling its
caller cannot stop, so every caller waited as long as the store did: requests, the
lease renewals, a clean stop.

Contracts:

* Every round trip of a watched connection (``Answered.wait``: each statement, COMMIT
  and ROLLBACK goes through it) is armed with a deadline of ``answer_s`` seconds.
  One thread per watchdog (started on the first round trip, ended by ``close``)
  wakes at the earliest deadline and, for a round trip still waiting past it, shuts
  the connection's socket down (``socket.shutdown`` on a duplicate of libpq's
  descriptor: the caller's blocked poll returns, libpq sees the connection closed and
  marks it broken). The caller's thread gets ``NoAnswer``, an ``OperationalError``
  (so the engine treats it as a lost connection), and ``on_hang(reason)`` is called
  once per abandoned connection, on the watchdog's thread (not under its lock).
* The socket is only ever shut down while its round trip is armed (arming, disarming
  and firing hold one lock), never between two statements: a round trip whose answer
  came just before its deadline completes. Nor while an answer is waiting to be read
  on it (the deadline is moved on instead): the process itself may have been paused
  past the deadline (SIGSTOP, a VM paused) while the server answered.
* A connection with ``answer_s = None`` is not watched (a LISTEN connection waiting
  for notices: silence is what it expects).
* Shutting the socket down sends a FIN: a COMMIT already sent may still be committed
  once the server runs again (the engine reports such an outcome as unknown); any
  statement not yet answered inside a transaction is rolled back by the server when it
  reads the end of the connection.
"""

from __future__ import annotations

import math
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg


class NoAnswer(psycopg.OperationalError):
    """A round trip the server did not answer within its bound: the connection was
    abandoned (shut down from the client's side)."""


class Answered(psycopg.Connection[Any]):
    """A connection whose round trips a ``Watchdog`` bounds (``answer_s``)."""

    watchdog: Watchdog | None = None
    answer_s: float | None = None   # None: not watched
    abandoned = False

    def wait(self, gen: Any, *args: Any, **kwargs: Any) -> Any:
        watchdog, bound = self.watchdog, self.answer_s
        if watchdog is None or bound is None:
            return super().wait(gen, *args, **kwargs)
        watchdog.arm(self, bound)
        try:
            return super().wait(gen, *args, **kwargs)
        except psycopg.Error as exc:
            if self.abandoned:
                raise NoAnswer(f"no answer within {bound:g} s; the connection was "
                               f"abandoned") from exc
            raise
        finally:
            watchdog.disarm(self)


class Watchdog:
    """See the module docstring."""

    def __init__(self, on_hang: Callable[[str], None]) -> None:
        self._on_hang = on_hang
        self._cond = threading.Condition()
        self._armed: dict[int, tuple[float, Answered]] = {}   # id(conn) -> deadline, conn
        self._wake_at = math.inf   # when the thread wakes next (inf: nothing armed)
        self._thread: threading.Thread | None = None

    def connect(self, url: str, *, answer_s: float | None, **kwargs: Any) -> Answered:
        """``psycopg.connect(url, **kwargs)``, watched: its first statements (the
        session's settings) are bounded too (``connect_timeout`` bounds the rest)."""
        conn = Answered.connect(url, **kwargs)
        conn.watchdog, conn.answer_s = self, answer_s
        return conn

    def arm(self, conn: Answered, bound: float) -> None:
        deadline = time.monotonic() + bound
        with self._cond:
            self._armed[id(conn)] = (deadline, conn)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="acp-store-watchdog")
                self._thread.start()
            elif deadline < self._wake_at:
                self._cond.notify_all()

    def disarm(self, conn: Answered) -> None:
        with self._cond:
            self._armed.pop(id(conn), None)

    def close(self) -> None:
        """The thread ends (a round trip armed later starts a new one)."""
        with self._cond:
            thread, self._thread = self._thread, None
            self._cond.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def _run(self) -> None:
        me = threading.current_thread()
        while True:
            fired: list[tuple[Answered, float]] = []
            with self._cond:
                if self._thread is not me:   # closed
                    return
                now = time.monotonic()
                for key, (deadline, conn) in list(self._armed.items()):
                    if deadline > now:
                        continue
                    bound = conn.answer_s or 0.0
                    if _answering(conn):   # its thread has yet to read it
                        self._armed[key] = (now + bound, conn)
                        continue
                    del self._armed[key]
                    fired.append((conn, bound))
                    _shut_down(conn)
                if not fired:
                    self._wake_at = min((d for d, _ in self._armed.values()),
                                        default=math.inf)
                    self._cond.wait(None if self._wake_at == math.inf
                                    else self._wake_at - now)
                    self._wake_at = math.inf
            for _conn, bound in fired:
                try:
                    self._on_hang(f"PostgreSQL: no answer within {bound:g} s (a "
                                  f"connection abandoned)")
                except Exception:   # noqa: BLE001 - a hook's bug must not end the watch
                    pass


def _answering(conn: Answered) -> bool:
    """Whether bytes from the server wait on ``conn``'s socket."""
    try:
        poller = select.poll()
        poller.register(conn.pgconn.socket, select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, psycopg.Error):
        return False


def _shut_down(conn: Answered) -> None:
    """Abandon ``conn`` from the client's side (the caller holds the watchdog's lock,
    and ``conn``'s round trip is armed: its owner's thread is inside ``wait``)."""
    conn.abandoned = True
    try:
        fd = conn.pgconn.socket
        sock = socket.socket(fileno=os.dup(fd))
    except (OSError, psycopg.Error):
        return   # closed meanwhile: its caller fails anyway
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.close()
