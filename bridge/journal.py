"""The session journal: the seam through which the bridge makes its sessions durable.

    journal = MemoryJournal()                       # the default: nothing outlives the process
    async with Bridge(factory, workspace_cwd="/ws", journal=journal) as bridge: ...

    # acp_server.store.sessions.StoreSessionJournal: the same records on SQLite/PostgreSQL
    seq = journal.append(PromptAccepted(session_id=sid, prompt_id=pid, ...))
    await journal.wait(seq)          # committed, or JournalUnavailableError
    state = await journal.restore()  # what start-up needs: RestoredSession, in creation order
    page = await journal.ended(before=None, limit=50)   # closed sessions kept, newest first

The bridge defines this protocol as it defines ``AgentConnection``; composition hands
it an implementation (``acp_server.server.open_server``: the store's). The bridge
never imports a store.

Contracts:

* ``append`` is synchronous and keeps order: records are committed in the order they
  were appended (one session's events in id order, after its ``SessionOpened``). It
  returns a sequence number; ``wait(seq)`` returns once that record (and everything
  appended before it) is committed, or raises ``JournalUnavailableError`` when the
  commit that carried it failed. Records nobody waits for (events, terminals, closes)
  are retried until they commit; records that were waited for and failed are not
  (their caller answered 503 and settled).
* ``durable`` is ``False`` for ``MemoryJournal``: the bridge then publishes at once and
  never waits. With a durable journal events are published when their commit
  lands (``on_events``), so no reader ever sees an event the journal could lose:
  the event ids and the epoch survive even ``kill -9``.
* A session id made anew (``EventsReset``, appended before its new bus's first event)
  starts from no events: a commit of the old bus that lands after it releases only
  that bus (``on_events`` gets each bus's newest event: ``EventRecord.epoch``).
* ``restore()`` decodes what it can; a record it cannot decode is logged and skipped,
  never a crash.
* ``aclose()`` commits what is queued (the clean stop); after it nothing is written.
* Session ids are ``storable``: no NUL (PostgreSQL's TEXT cannot hold one), UTF-8,
  at most ``MAX_SESSION_ID_BYTES`` (1 KiB) of it (PostgreSQL's b-tree takes at most
  2,704 bytes an entry: a session's keys must fit, with a prompt id). The bridge
  never journals, restores or asks ``record_of`` for a session whose id is not
  (``bridge.bridge``: no such session exists); a store may rely on it.
* Records are msgspec structs in snake_case: no door's wire. Those of scalar fields
  only are not tracked by the garbage collector (``gc=False``: they cannot be in a
  cycle), so a burst of events journaled does not add to its collections.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import msgspec

from bridge.events import Event
from bridge.status import PromptTerminal


class SessionOpened(msgspec.Struct, kw_only=True, frozen=True, tag="session", tag_field="kind",
                    gc=False):
    """A session's record: committed before its creation is answered."""

    session_id: str
    agent: str
    cwd: str
    created_at: float   # epoch seconds
    epoch: str
    scope: str = "thread"
    forked_from: str | None = None
    origin: str | None = None
    owner: str | None = None   # the principal that made it (an opaque label), or None
    # A branch's or fork's conversation at its making (its parent's transcript, JSON:
    # ``bridge.transcript``): a restored agent side is seeded with it before its own.
    seed: str | None = None
    # The settings a client changed through the agent, as the agent accepted them
    # (``bridge.settings``): applied to the agent again when the session is restored.
    settings: dict[str, Any] | None = None
    # Its first prompt's name (``bridge.pending.display_name``), once it had one.
    display_name: str | None = None


class PromptAccepted(msgspec.Struct, kw_only=True, frozen=True, tag="prompt", tag_field="kind"):
    """An accepted prompt: committed before its 202 / its /acp acknowledgement."""

    session_id: str
    prompt_id: str
    prompt: list[Any]
    queued_at_ms: int
    seq: int   # admission order across restarts (epoch nanoseconds)
    deadline_ms: int | None = None
    was_queued: bool = False
    # the admission's cursor (the 202's lastEventId and eventEpoch), answered again to
    # a prompt sent again under its id after a restart (absent in older records)
    last_event_id: int | None = None
    epoch: str | None = None


class PromptSettled(msgspec.Struct, kw_only=True, frozen=True, tag="terminal", tag_field="kind",
                    gc=False):
    """How a prompt ended (``PromptTerminal``), or that it was dropped while queued."""

    session_id: str
    prompt_id: str
    terminal: str
    at: int
    stop_reason: str | None = None
    error_code: str | None = None


class EventRecord(msgspec.Struct, kw_only=True, frozen=True, tag="event", tag_field="kind",
                  gc=False):
    """One bus event: its envelope (``bridge.wire.envelope``) is a complete record.
    ``epoch``: its bus's, so a commit landing after the id was made anew releases the
    bus it came from, not the new one (not written: the stored record has it)."""

    session_id: str
    event_id: int
    type: str
    prompt_id: str | None
    envelope: bytes
    epoch: str = ""


class SessionEnded(msgspec.Struct, kw_only=True, frozen=True, tag="end", tag_field="kind",
                   gc=False):
    """``deleted``: the session's journal is removed. Else closed at ``at`` (epoch
    seconds): kept readable until the retention purge."""

    session_id: str
    at: float
    deleted: bool = False


class EventsReset(msgspec.Struct, kw_only=True, frozen=True, tag="reset", tag_field="kind",
                  gc=False):
    """A new life of ``session_id`` starts (a new bus, its ids from 1 again: a session
    made, loaded or resumed; or a load undone): the journal's events of that id, left
    by a closed session or a refused load, are deleted (its record and prompts stay).
    An id with no record (a load undone, or one a crash cut short) keeps nothing: the
    prompts admitted while the agent had not answered go too."""

    session_id: str


JournalRecord = (SessionOpened | PromptAccepted | PromptSettled | EventRecord | SessionEnded
                 | EventsReset)


@dataclasses.dataclass(slots=True)
class RestoredSession:
    """One journaled session as start-up finds it."""

    record: SessionOpened
    events: list[Event]                 # the newest events (at most the ring), in id order
    last_event_id: int
    terminals: list[PromptTerminal]     # oldest first
    unsettled: list[PromptAccepted]     # accepted, never settled, in admission order
    started: set[str]                   # of those, the ones whose turn had started
    closed_at: float | None = None
    gap: bool = False                   # events are missing: a new epoch

    def last_activity(self) -> float:
        """When the journal last saw the session active (epoch seconds): its newest
        event, prompt end or accepted prompt, else its creation."""
        times = [self.record.created_at]
        if self.events:
            times.append(self.events[-1].timestamp_ms / 1000)
        times.extend(t.at / 1000 for t in self.terminals[-1:])
        times.extend(p.queued_at_ms / 1000 for p in self.unsettled[-1:])
        return max(times)


@dataclasses.dataclass(frozen=True, slots=True)
class EndedSession:
    """A closed session the journal keeps (until the retention purge): its record and
    when it closed (epoch seconds)."""

    record: SessionOpened
    ended_at: float

    def key(self) -> tuple[float, str]:
        """Its place in ``ended``'s order (newest first): ``(ended_at, session id)``,
        both descending."""
        return self.ended_at, self.record.session_id


class SessionJournal(Protocol):
    durable: bool

    def bind(self, on_events: Callable[[Sequence[EventRecord]], None]) -> None:
        """``on_events`` gets committed events, in order (event loop): of each batch at
        least the newest event of every session it carried (readers may see that
        session's events through it)."""

    def append(self, record: JournalRecord) -> int: ...

    async def wait(self, seq: int, *, fail_fast: bool = False) -> None:
        """Return once record ``seq`` is committed. A record somebody waits for
        (``SessionOpened``, ``PromptAccepted``) whose commit failed raises
        ``JournalUnavailableError``; any other is kept for the next attempt, and waited
        for, unless ``fail_fast``: then ``JournalUnavailableError`` at once while the
        store is failing (the record still commits once it is back)."""

    def hold(self, session_id: str, held: bool) -> None:
        """While ``held``, the session's events reach readers only once committed, even
        past the journal's bound on queued records (where it may let other sessions'
        events through uncommitted): a turn waits for its start's commit
        (``EventBus.wait_released``) before its agent is handed the prompt."""

    async def restore(self) -> list[RestoredSession]: ...

    async def purge(self, closed_before: float, max_bytes: int = 0) -> int:
        """Remove the sessions closed before ``closed_before`` (epoch seconds); with
        ``max_bytes``, also the longest closed of the others while the closed sessions'
        events take more than that in all (the most recently closed are kept)."""
        ...

    async def record_of(self, session_id: str) -> SessionOpened | None:
        """The session's journaled record (its maker, its agent), live or closed;
        ``None`` when it is not journaled; raises ``JournalUnavailableError`` when the
        journal cannot answer."""
        ...

    async def read(self, session_id: str, *, seed: bool = False) -> RestoredSession | None:
        """One session as the journal keeps it, live or closed (``closed_at``), or
        ``None``: what a cold load of a closed session its agent no longer knows is
        seeded from. ``seed``: its record with a branch's seed (``SessionOpened.seed``,
        kept apart: only what restores an agent side reads it), else without.
        Raises ``JournalUnavailableError`` when the journal cannot answer."""
        ...

    async def ended(self, *, before: tuple[float, str] | None, limit: int
                    ) -> list[EndedSession]:
        """Up to ``limit`` of the closed sessions the journal keeps, newest end first
        (``EndedSession.key`` descending), strictly after ``before`` in that order
        (``None``: from the newest): fewer only when no more follow (a caller takes a
        short answer for the end). Records that cannot be decoded are logged and
        skipped, and read past. Raises ``JournalUnavailableError`` when the journal
        cannot answer."""
        ...

    async def aclose(self) -> None: ...


class MemoryJournal:
    """Nothing outlives the process: today's behaviour, for embedding and unit tests."""

    durable = False

    def bind(self, on_events: Callable[[Sequence[EventRecord]], None]) -> None:
        pass

    def append(self, record: JournalRecord) -> int:
        return 0

    async def wait(self, seq: int, *, fail_fast: bool = False) -> None:
        return None

    def hold(self, session_id: str, held: bool) -> None:
        pass

    async def restore(self) -> list[RestoredSession]:
        return []

    async def purge(self, closed_before: float, max_bytes: int = 0) -> int:
        return 0

    async def record_of(self, session_id: str) -> SessionOpened | None:
        return None

    async def read(self, session_id: str, *, seed: bool = False) -> RestoredSession | None:
        return None

    async def ended(self, *, before: tuple[float, str] | None, limit: int
                    ) -> list[EndedSession]:
        return []

    async def aclose(self) -> None:
        return None


MAX_SESSION_ID_BYTES = 1024   # real agents' ids are UUIDs (36)


def storable(session_id: str) -> bool:
    """Whether every journal can key a session by ``session_id`` (see the contracts)."""
    if "\x00" in session_id or len(session_id) > MAX_SESSION_ID_BYTES:
        return False
    if session_id.isascii():
        return True
    try:
        return len(session_id.encode()) <= MAX_SESSION_ID_BYTES
    except UnicodeEncodeError:   # a lone surrogate: not UTF-8
        return False


RECORD_DECODER = msgspec.msgpack.Decoder(JournalRecord)
RECORD_ENCODER = msgspec.msgpack.Encoder()

__all__ = ["EventRecord", "EventsReset", "JournalRecord", "MAX_SESSION_ID_BYTES",
           "MemoryJournal", "PromptAccepted", "PromptSettled", "RECORD_DECODER", "RECORD_ENCODER",
           "RestoredSession", "SessionEnded", "SessionJournal", "SessionOpened", "storable"]
