"""Session leases and the instance registry on a shared PostgreSQL store (issue #24).

    leases = SessionLeases("a1b2c3d4e5f6", ttl_s=8)   # times on the store's clock
    tokens = leases.take_own(conn)             # at start: the live sessions this instance ran
    token = leases.open(conn, sid)             # a session being journaled (None: owned elsewhere)
    stale = leases.stale(conn, {sid: token})   # fencing: which tokens are no longer current
    lost = leases.renew(conn, tokens)          # every lease in one statement + the heartbeat
    token = leases.adopt(conn, sid)            # an expired lease taken over (token + 1)
    owner = leases.owner(conn, sid)            # who runs it, where it is reached
    leases.hand_over(conn, sid, token, "b7")   # an idle session's lease given to b7

Every method runs on a connection inside the store's transaction (a worker thread: the
session journal's group commit, ``acp_server.store.sessions``). Contracts:

* A live session has one row in ``session_leases`` (migration 5): the instance that runs
  it, a fencing token and ``expires_at``: epoch seconds on the store's clock
  (PostgreSQL's ``clock_timestamp()``), which every expiry, liveness check and
  heartbeat reads too, so the instances' own clocks never matter (skewed ones
  neither steal live leases nor keep expired ones). ``offset`` (tests only) is added
  to the store's clock in this instance's statements: a test moves time with it.
  Only the holder renews it, every ``--session-lease-renew-ms``, for
  ``--session-lease-ttl-ms``. Another instance may take it only once expired
  (``adopt``), and every take-over by another instance adds 1 to the token.
* Fencing: each journal commit locks the lease rows of the sessions it writes
  (``stale``: one ``SELECT … FOR SHARE`` per commit, not a round trip per record) and
  drops the records of any session whose token changed. A take-over therefore either
  waits for that commit (and then restores what it wrote) or makes it refuse: an
  instance that lost a lease, paused past it say, never writes into the session again.
* ``fleet_secret`` (migration 6) holds one random secret every instance of the store
  reads at start (``load_secret``): a forwarded request's client address is proved
  with it (``acp_server.http.clients``).
* ``owner`` of an id with a NUL (a client's, ``/session/%00``) is ``None`` without a
  query: no TEXT holds one, and psycopg refuses to send it (the door's 503 before).
* ``instances`` is the registry: each instance's advertised base URL and heartbeat,
  refreshed with the renewal. A lease names its instance; ``owner`` joins the two.
* A hand-off (``hand_over``: an idle session asked for by another instance,
  ``acp_server.fleet.handoff``) names the asker in the lease, fenced by the giver's
  token and keeping it: the asker then adopts it (token + 1) as an expired one.
* A closed or deleted session has no lease (its journal row says closed; any instance
  serves it from the journal).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

# The store's clock (epoch seconds) plus a parameter: the offset tests move (``offset``).
NOW = "(extract(epoch FROM clock_timestamp())::float8 + %s::float8)"
DEFAULT_TTL_S = 8.0
DEFAULT_RENEW_S = 2.0


@dataclasses.dataclass(frozen=True, slots=True)
class Owner:
    """Who holds a session's lease: ``live`` when it has not expired."""

    instance: str
    token: int
    expires_at: float
    url: str | None
    live: bool


class SessionLeases:
    """See the module docstring. ``url``: this instance's advertised base URL."""

    def __init__(self, instance: str, *, ttl_s: float = DEFAULT_TTL_S,
                 renew_s: float = DEFAULT_RENEW_S,
                 offset: Callable[[], float] = lambda: 0.0, url: str | None = None) -> None:
        self.instance = instance
        self.ttl_s = ttl_s
        self.renew_s = renew_s
        self.offset = offset
        self.url = url
        self.started_at: float | None = None   # on the store's clock, at the first heartbeat
        self.secret: bytes | None = None   # the fleet's shared secret (``load_secret``)

    def shared_secret(self) -> bytes | None:
        """The fleet's shared secret, once loaded (``acp_server.http.clients``)."""
        return self.secret

    def load_secret(self, conn: Any) -> bytes:
        """The fleet's shared secret (migration 6: one row, made by the first instance
        that asks): a forwarded request's client address is proved with it."""
        conn.execute("INSERT INTO fleet_secret(id, secret) VALUES (1, %s) "
                     "ON CONFLICT (id) DO NOTHING", (os.urandom(32),))
        row = conn.execute("SELECT secret FROM fleet_secret WHERE id = 1").fetchone()
        self.secret = bytes(row[0])
        return self.secret

    def _now(self) -> float:
        """The parameter of ``NOW`` (``offset``)."""
        return float(self.offset())

    def _expiry(self) -> tuple[float, float]:
        """The parameters of ``NOW`` and ``NOW + ttl``."""
        now = self._now()
        return now, now + self.ttl_s

    def take_own(self, conn: Any) -> dict[str, int]:
        """At start: the leases of the live sessions this instance (its stable id) ran
        and nobody took over, renewed; sessions journaled before leases existed are
        leased to the instance that made them. ``{session id: token}``."""
        _, expires = self._expiry()
        me = self.instance
        conn.execute(
            f"INSERT INTO session_leases(session_id, instance, token, expires_at) "
            f"SELECT id, %s, 1, {NOW} FROM sessions WHERE closed_at IS NULL "
            f"AND (owner = %s OR owner IS NULL) ON CONFLICT (session_id) DO NOTHING",
            (me, expires, me))
        rows = conn.execute(
            f"UPDATE session_leases l SET token = l.token + 1, expires_at = {NOW} "
            f"FROM sessions s WHERE s.id = l.session_id AND s.closed_at IS NULL "
            f"AND l.instance = %s RETURNING l.session_id, l.token", (expires, me)).fetchall()
        self.heartbeat(conn)
        return {sid: token for sid, token in rows}

    def open(self, conn: Any, session_id: str) -> int | None:
        """The lease of a session being journaled (its ``SessionOpened``): taken when
        free, expired or already ours; ``None`` when another instance holds it live."""
        now, expires = self._expiry()
        row = conn.execute(
            f"INSERT INTO session_leases(session_id, instance, token, expires_at) "
            f"VALUES (%s, %s, 1, {NOW}) ON CONFLICT (session_id) DO UPDATE SET "
            f"token = CASE WHEN session_leases.instance = excluded.instance "
            f"THEN session_leases.token ELSE session_leases.token + 1 END, "
            f"instance = excluded.instance, expires_at = excluded.expires_at "
            f"WHERE session_leases.instance = excluded.instance "
            f"OR session_leases.expires_at < {NOW} RETURNING token",
            (session_id, self.instance, expires, now)).fetchone()
        return None if row is None else row[0]

    def held_elsewhere(self, conn: Any, session_id: str) -> bool:
        """Whether another instance holds ``session_id``'s lease, unexpired."""
        now, _ = self._expiry()
        return conn.execute(
            f"SELECT 1 FROM session_leases WHERE session_id = %s AND instance <> %s "
            f"AND expires_at >= {NOW}", (session_id, self.instance, now)).fetchone() \
            is not None

    def stale(self, conn: Any, tokens: dict[str, int]) -> set[str]:
        """Fencing (see the module docstring): the sessions whose lease is no longer
        ``tokens``' (taken over, or gone), their rows locked until the commit."""
        sids = sorted(tokens)
        rows = conn.execute(
            "SELECT session_id, instance, token FROM session_leases "
            "WHERE session_id = ANY(%s) ORDER BY session_id FOR SHARE", (sids,)).fetchall()
        current = {sid: (instance, token) for sid, instance, token in rows}
        return {sid for sid in sids if current.get(sid) != (self.instance, tokens[sid])}

    def renew(self, conn: Any, tokens: dict[str, int]) -> set[str]:
        """Every lease in ``tokens`` renewed in one statement, and the heartbeat; the
        sessions whose lease this instance no longer holds (to stop here)."""
        _, expires = self._expiry()
        held: dict[str, int] = {}
        if tokens:
            held = dict(conn.execute(
                f"UPDATE session_leases SET expires_at = {NOW} WHERE instance = %s "
                f"AND session_id = ANY(%s) RETURNING session_id, token",
                (expires, self.instance, sorted(tokens))).fetchall())
        self.heartbeat(conn)
        return {sid for sid, token in tokens.items() if held.get(sid) != token}

    def heartbeat(self, conn: Any) -> None:
        now = self._now()
        started = self.started_at
        row = conn.execute(
            f"INSERT INTO instances(id, url, heartbeat_at, started_at) "
            f"VALUES (%s, %s, {NOW}, COALESCE(%s, {NOW})) "
            f"ON CONFLICT (id) DO UPDATE SET url = excluded.url, "
            f"heartbeat_at = excluded.heartbeat_at RETURNING heartbeat_at",
            (self.instance, self.url, now, started, now)).fetchone()
        if started is None and row is not None:
            self.started_at = float(row[0])

    def alive(self, conn: Any, instance: str) -> bool:
        """Whether ``instance`` renewed its heartbeat within the TTL (a paused or dead
        one did not)."""
        row = conn.execute(f"SELECT heartbeat_at + %s >= {NOW} FROM instances WHERE id = %s",
                           (self.ttl_s, self._now(), instance)).fetchone()
        return row is not None and bool(row[0])

    def adopt(self, conn: Any, session_id: str) -> int | None:
        """Take over a live (not closed) session whose lease expired, or that has none:
        the new token, or ``None`` (a live lease elsewhere, or no such live session)."""
        now, expires = self._expiry()
        row = conn.execute(
            f"INSERT INTO session_leases(session_id, instance, token, expires_at) "
            f"SELECT id, %s, 1, {NOW} FROM sessions WHERE id = %s AND closed_at IS NULL "
            f"ON CONFLICT (session_id) DO UPDATE SET instance = excluded.instance, "
            f"token = session_leases.token + 1, expires_at = excluded.expires_at "
            f"WHERE session_leases.expires_at < {NOW} OR session_leases.instance = "
            f"excluded.instance RETURNING token",
            (self.instance, expires, session_id, now)).fetchone()
        if row is None:
            return None
        conn.execute("UPDATE sessions SET owner = %s WHERE id = %s", (self.instance, session_id))
        return int(row[0])

    def hand_over(self, conn: Any, session_id: str, token: int, to: str) -> bool:
        """Give this instance's lease of ``session_id`` (``token``) to instance ``to``,
        live for a TTL on the store's clock, the token kept (``to`` adopts it: token
        + 1); whether this instance still held it."""
        _, expires = self._expiry()
        row = conn.execute(
            f"UPDATE session_leases SET instance = %s, expires_at = {NOW} "
            f"WHERE session_id = %s AND instance = %s AND token = %s RETURNING token",
            (to, expires, session_id, self.instance, token)).fetchone()
        return row is not None

    def expired(self, conn: Any, limit: int = 64) -> list[str]:
        """Live sessions whose lease expired (their owner died or stopped)."""
        return [sid for (sid,) in conn.execute(
            f"SELECT l.session_id FROM session_leases l JOIN sessions s "
            f"ON s.id = l.session_id WHERE s.closed_at IS NULL AND l.expires_at < {NOW} "
            f"ORDER BY l.expires_at LIMIT %s", (self._now(), limit)).fetchall()]

    def owner(self, conn: Any, session_id: str) -> Owner | None:
        if "\x00" in session_id:   # a client's id no TEXT holds (psycopg refuses to send it)
            return None
        row = conn.execute(
            f"SELECT l.instance, l.token, l.expires_at, i.url, l.expires_at >= {NOW} "
            f"FROM session_leases l LEFT JOIN instances i ON i.id = l.instance "
            f"WHERE l.session_id = %s", (self._now(), session_id)).fetchone()
        if row is None:
            return None
        instance, token, expires_at, url, live = row
        return Owner(instance, int(token), float(expires_at), url, live=bool(live))
