"""The audit log: who did what, appended to the store in batches through its writer.

    audit = AuditLog(store, prompts=False, retention_s=30 * 86400)
    audit.record("ci", "session.created", session_id, client="10.0.0.7", agent="reference")
    audit.auth_failed(client="10.0.0.9", reason="unknown_token", path="/session")
    await audit.flush()            # what this process recorded so far is in the store
    async with anyio.create_task_group() as tg:
        await tg.start(audit.run)  # flushes as records come, purges past the retention

Contracts:

* ``record`` never waits and never fails: the record joins a bounded buffer (at most
  ``max_buffered``) that ``run`` writes in one statement per batch through the store's
  writer, as one transaction shared with whatever else the writer commits then: at
  once when the log was quiet, else at most one write per ``flush_interval_s``
  (``FLUSH_INTERVAL_S``), so a stream of records (one ``prompt.accepted`` per
  prompt) costs the store one write per interval, not one commit per turn of the
  loop (measured, the REST accepted-and-completed load on granian, in-memory session
  journal: 220–236 → 172–182 µs of server CPU per prompt; a commit per turn was a
  durable SQLite commit, an fsync, a thread hop, and kept the store's lowered switch
  interval on).
  What a crash (``kill -9``) can lose is what is buffered: about one interval of
  records and the write in flight while the store serves, everything buffered (up
  to ``max_buffered``) while it is down; a clean stop writes it all (``open_principals``), and ``read`` and
  ``flush`` write it before they answer. While the store is unavailable the buffer
  waits and is written when it is back (retried with a backoff); past
  ``max_buffered`` new records are counted (``dropped``), not kept, and one
  ``audit.records_dropped`` record says how many once writing works again.
  A record the store refuses every time (a constraint, a value it cannot take, a
  trigger: any failure but ``StoreUnavailableError``) does not hold the others back
  and is not retried: the batch's halves are written on their own until each refused
  record failed alone (``_isolate``); it is logged once (action and principal, never
  its detail) and counted (``refused``).
* Authentication failures are sampled per client address: the first of a client in
  ``failure_window_s`` is recorded, with ``suppressed`` = how many of that client's
  were not since its previous record; at most ``failures_per_window`` are recorded per
  window across all clients. A client past that cap is still counted (its next record
  carries them); the clients counted are at most ``FAILURE_CLIENTS_KEPT`` (the least
  recently failed go first), and what a forgotten client had not recorded is told in
  one ``auth.failed`` record of reason ``sampled_out`` (``suppressed``: how many) in
  the next window. So a flood of bad tokens costs the log a few rows, and none goes
  uncounted.
* The record's detail is a JSON object; a prompt's text is in it only with
  ``prompts=True`` (``--audit-prompts``; cut to ``PROMPT_TEXT_MAX`` characters).
* ``retention_s`` > 0: records older than that are purged every ``purge_interval_s``
  (and once at start); 0 keeps them forever. ``clock`` is the wall clock (injected).
* Actions: ``token.created``, ``token.revoked``, ``session.created``,
  ``session.closed``, ``session.cancelled``, ``prompt.accepted``,
  ``prompt.removed``, ``permission.answered``, ``setting.changed`` (a session's mode,
  model or config option: ``setting``, ``old``, ``new``), ``task.created``, ``task.cancelled``,
  ``task.deleted``, ``auth.failed``,
  ``access.denied`` (sampled per principal and reason as ``auth.failed`` is per
  client), ``audit.records_dropped``.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import anyio
import anyio.abc
import msgspec

from acp_server.store.audit import AuditQuery, AuditRecord
from acp_server.store.errors import Backoff, StoreUnavailableError, first_line
from bridge.loggable import loggable

log = logging.getLogger("acp_server.principals")

MAX_BUFFERED = 10_000
FLUSH_INTERVAL_S = 0.02   # at most one write per interval while records keep coming
PROMPT_TEXT_MAX = 4096
BATCH = 512
FAILURE_CLIENTS_KEPT = 4096   # clients whose failed credentials are counted at once
_encode = msgspec.json.Encoder().encode


class AuditStore(Protocol):
    async def append_audit(self, records: list[AuditRecord]) -> None: ...
    async def read_audit(self, query: AuditQuery) -> list[AuditRecord]: ...
    async def purge_audit(self, *, before: float) -> int: ...


def prompt_text(blocks: Any) -> str:
    """The text blocks of an ACP prompt, joined (what ``--audit-prompts`` keeps)."""
    if not isinstance(blocks, list):
        return ""
    text = "\n".join(b["text"] for b in blocks
                     if isinstance(b, dict) and b.get("type") == "text"
                     and isinstance(b.get("text"), str))
    return text[:PROMPT_TEXT_MAX]


class AuditLog:
    def __init__(self, store: AuditStore | None, *, prompts: bool = False,
                 retention_s: float = 30 * 86400, clock: Callable[[], float] = time.time,
                 max_buffered: int = MAX_BUFFERED, failure_window_s: float = 60.0,
                 failures_per_window: int = 100, purge_interval_s: float = 3600.0,
                 flush_interval_s: float = FLUSH_INTERVAL_S) -> None:
        self.store = store
        self.prompts = prompts
        self.retention_s = retention_s
        self.clock = clock
        self.max_buffered = max_buffered
        self.failure_window_s = failure_window_s
        self.failures_per_window = failures_per_window
        self.purge_interval_s = purge_interval_s
        self.flush_interval_s = flush_interval_s
        self.dropped = 0          # records not kept (buffer full), since start
        self.written = 0
        self.refused = 0          # records the store refused for good, since start
        self._pending_dropped = 0
        self._buffer: deque[AuditRecord] = deque()
        self._wake = anyio.Event()
        self._lock = anyio.Lock()
        # client -> [window start, suppressed since its last record], least recent first
        self._failures: OrderedDict[str, list[float]] = OrderedDict()
        self._window = (0.0, 0)   # (start, records this window, all clients)
        self._unattributed = 0    # failures of clients forgotten before their next record
        # (principal, reason) -> [window start, suppressed since its last record]
        self._denials: OrderedDict[tuple[str, str], list[float]] = OrderedDict()

    # -- recording -------------------------------------------------------------------
    def record(self, principal: str, action: str, target: str | None = None, *,
               client: str | None = None, **detail: Any) -> None:
        self.append(principal, action, target, client, detail)

    def append(self, principal: str, action: str, target: str | None, client: str | None,
               detail: dict[str, Any]) -> None:
        """``record`` with its detail as a dict (an accepted prompt's record, made on
        the request path: no keywords packed and unpacked on the way)."""
        if self.store is None:
            return
        if len(self._buffer) >= self.max_buffered:
            self.dropped += 1
            self._pending_dropped += 1
            return
        # positional: the frozen dataclass's __init__ is ~0.2 µs cheaper so
        self._buffer.append(AuditRecord(self.clock(), principal, action, target, client,
                                        _encode(detail).decode()))
        self._wake.set()

    def auth_failed(self, *, client: str | None, reason: str, path: str,
                    token_id: str | None = None) -> None:
        """An authentication failure, sampled (see the module docstring)."""
        if self.store is None:
            return
        now = self.clock()
        key = client or "-"
        seen = self._failures.get(key)
        if seen is not None:
            self._failures.move_to_end(key)
            if now - seen[0] < self.failure_window_s:
                seen[1] += 1
                return
        start, count = self._window
        if now - start >= self.failure_window_s:
            start, count = now, 0
            if self._unattributed:   # told once a window, as its first record
                self.record("-", "auth.failed", None, reason="sampled_out",
                            suppressed=self._unattributed)
                self._unattributed = 0
        if count >= self.failures_per_window:
            if seen is not None:
                seen[1] += 1
            else:   # counted from now on: its next record says how many
                self._remember(key, [now, 1])
            return
        self._window = (start, count + 1)
        suppressed = int(seen[1]) if seen is not None else 0
        self._remember(key, [now, 0])
        detail: dict[str, Any] = {"reason": reason, "path": path[:256]}
        if token_id is not None:
            detail["token_id"] = token_id
        if suppressed:
            detail["suppressed"] = suppressed
        self.record("-", "auth.failed", None, client=client, **detail)

    def access_denied(self, principal: str, *, client: str | None, reason: str,
                      request: str, target: str | None = None, **detail: Any) -> None:
        """An authenticated request refused for a scope it lacks (``missing_scope``),
        its rate limit (``rate_limited``) or naming another principal's session, task
        or response (``not_owner``, answered as an unknown id, the id the ``target``):
        one ``access.denied`` record per principal
        and reason in ``failure_window_s``, the next one carrying ``suppressed`` (how
        many were not recorded since). At most ``FAILURE_CLIENTS_KEPT`` (principal,
        reason) pairs are counted at once; a forgotten pair's count is told in the
        next ``access.denied`` record of reason ``sampled_out``."""
        if self.store is None:
            return
        now = self.clock()
        key = (principal, reason)
        seen = self._denials.get(key)
        if seen is not None:
            self._denials.move_to_end(key)
            if now - seen[0] < self.failure_window_s:
                seen[1] += 1
                return
        suppressed = int(seen[1]) if seen is not None else 0
        self._denials[key] = [now, 0]
        forgotten = 0
        while len(self._denials) > FAILURE_CLIENTS_KEPT:
            forgotten += int(self._denials.popitem(last=False)[1][1])
        if suppressed:
            detail["suppressed"] = suppressed
        self.record(principal, "access.denied", target, client=client, reason=reason,
                    request=request[:256], **detail)
        if forgotten:
            self.record("-", "access.denied", None, reason="sampled_out",
                        suppressed=forgotten)

    def _remember(self, key: str, entry: list[float]) -> None:
        self._failures[key] = entry
        self._failures.move_to_end(key)
        while len(self._failures) > FAILURE_CLIENTS_KEPT:
            _, forgotten = self._failures.popitem(last=False)
            self._unattributed += int(forgotten[1])

    # -- writing ---------------------------------------------------------------------
    @property
    def buffered(self) -> int:
        return len(self._buffer)

    async def flush(self) -> None:
        """Write everything recorded so far (waits for the store; raises
        ``StoreUnavailableError`` when it cannot, the records kept for later)."""
        await self._flush(None)

    async def _flush(self, at_most: int | None) -> None:
        """``flush``; ``at_most``: write only that many records (those buffered when the
        write began: the ones recorded while it runs wait for the next write)."""
        if self.store is None:
            return
        async with self._lock:
            left = len(self._buffer) if at_most is None else at_most
            while (self._buffer and (at_most is None or left > 0)) or self._pending_dropped:
                if self._pending_dropped and len(self._buffer) < self.max_buffered:
                    self._buffer.append(AuditRecord(
                        at=self.clock(), principal="-", action="audit.records_dropped",
                        detail=_encode({"count": self._pending_dropped}).decode()))
                    self._pending_dropped = 0
                size = min(BATCH, len(self._buffer))
                if at_most is not None:
                    size = min(size, max(left, 1))   # a drop record goes out alone too
                batch = [self._buffer.popleft() for _ in range(size)]
                try:
                    await self.store.append_audit(batch)
                except StoreUnavailableError:
                    self._buffer.extendleft(reversed(batch))   # kept, in order
                    raise
                except Exception as exc:   # noqa: BLE001 - the store refuses a record
                    await self._isolate(batch, exc)
                except BaseException:
                    self._buffer.extendleft(reversed(batch))
                    raise
                else:
                    self.written += len(batch)
                left -= len(batch)

    async def _isolate(self, batch: list[AuditRecord], exc: Exception) -> None:
        """A write of ``batch`` failed, not for the store being unavailable: a record
        the store refuses every time (a constraint, a value it cannot take, a trigger).
        Its halves are written on their own, a failing part halved again, until each
        refused record failed alone: logged once (its action and principal, the
        database's message, never its detail), counted in ``refused``, not retried.
        The store unavailable meanwhile: what is not written yet goes back to the head
        of the buffer, in order (``StoreUnavailableError``)."""
        log.warning("audit: writing %d record(s) failed (%s); the ones the store refuses "
                    "are found and dropped", len(batch), first_line(exc, 200))
        assert self.store is not None
        parts: deque[list[AuditRecord]] = deque()
        if len(batch) > 1:
            middle = len(batch) // 2
            parts.extend((batch[:middle], batch[middle:]))
        else:
            self._refused(batch[0], exc)
        try:
            while parts:
                part = parts[0]
                try:
                    await self.store.append_audit(part)
                except StoreUnavailableError:
                    raise
                except Exception as error:   # noqa: BLE001 - isolated below
                    parts.popleft()
                    if len(part) == 1:
                        self._refused(part[0], error)
                    else:
                        middle = len(part) // 2
                        parts.extendleft((part[middle:], part[:middle]))
                    continue
                parts.popleft()
                self.written += len(part)
        except BaseException:
            self._buffer.extendleft(reversed([r for part in parts for r in part]))
            raise

    def _refused(self, record: AuditRecord, exc: Exception) -> None:
        self.refused += 1
        log.warning("audit: the store refused a record (%s by %s): %s; not retried",
                    loggable(record.action, 80), loggable(record.principal, 80),
                    first_line(exc, 200))

    async def run(self, *, task_status: anyio.abc.TaskStatus[None]
                  = anyio.TASK_STATUS_IGNORED) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._writer)
            if self.retention_s > 0:
                tg.start_soon(self._purger)
            task_status.started()

    async def _writer(self) -> None:
        backoff = Backoff(0.05, 5.0)
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            if not (self._buffer or self._pending_dropped):
                continue   # taken by the last write already (recorded while it ran)
            try:
                # what is buffered now; what comes meanwhile (a stream of records while
                # the write runs) waits for one write after the interval, not a write
                # per commit of the store (each a durable commit: an fsync)
                await self._flush(len(self._buffer))
                backoff.reset()
                if self.flush_interval_s > 0:
                    await anyio.sleep(self.flush_interval_s)
                if self._buffer or self._pending_dropped:
                    self._wake.set()
            except StoreUnavailableError:
                await anyio.sleep(backoff.next())
                self._wake.set()
            except Exception:   # noqa: BLE001 - a bug must not end the log; the records stay
                log.exception("audit: writing records failed")
                await anyio.sleep(backoff.next())
                self._wake.set()

    async def purge(self) -> int:
        if self.store is None or self.retention_s <= 0:
            return 0
        return await self.store.purge_audit(before=self.clock() - self.retention_s)

    async def _purger(self) -> None:
        while True:
            try:
                purged = await self.purge()
                if purged:
                    log.info("audit: %d records past the retention purged", purged)
            except Exception as exc:   # noqa: BLE001 - retried at the next interval
                log.info("audit purge skipped: %s", exc)
            await anyio.sleep(self.purge_interval_s)

    async def read(self, query: AuditQuery) -> list[AuditRecord]:
        """What the store holds (after writing what this process buffered)."""
        assert self.store is not None, "no audit store"
        await self.flush()
        return await self.store.read_audit(query)


def as_json(records: Iterable[AuditRecord]) -> list[dict[str, Any]]:
    """Records as the wire shows them (``GET /audit``, ``acp-server audit --json``)."""
    return [{"seq": r.seq, "at": r.at, "principal": r.principal, "action": r.action,
             "target": r.target, "client": r.client, "detail": msgspec.json.decode(r.detail)}
            for r in records]


__all__ = ["AuditLog", "AuditStore", "PROMPT_TEXT_MAX", "as_json", "prompt_text"]
