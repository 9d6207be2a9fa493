"""The session journal's bounded write-behind window for events (``--journal-write-behind``).

    policy = WriteBehind(window=1024)
    journal = StoreSessionJournal(store, write_behind=policy.window)   # builds its own
    # in the journal: ``before_event`` may ask for a marker record first; ``early``
    # says whether readers may see the event before its commit; ``landed`` /
    # ``settled`` follow the commits and may ask for the marker to be cleared.

By default (window 0) the journal publishes after commit: readers see an event only
once it is durable, so after ``kill -9`` a reader resumes exactly where it was. With a
window, readers of a session may see up to ``window`` events before their commit
(lower latency, no commit round trip per burst), and a crash may lose what they saw.
That is never a silent gap, thanks to a durable marker:

* Before the first event a session publishes ahead of its commit, a marker (a
  ``session_segments`` row of no events, ``last_id = 0``) is committed: until that
  commit lands the session's events are held as without a window (``arming``). Once
  it has landed (``armed``), each event is released at once while it is at most
  ``window`` events past the session's last committed event; past that it waits for a
  commit.
* When a commit leaves an armed session with every appended event committed and no
  accepted prompt unsettled, the marker is cleared (its deletion appended; the
  session holds its events again from that moment, until a new marker commits).
* At start a session whose marker is present may have shown readers events that were
  lost: it gets a new epoch (``RestoredSession.gap``), so a reader resyncs. A session
  without a marker showed only committed events and keeps its epoch.

* An id's earlier life (a load the agent refused, a session closed, then loaded
  again) whose last commit lands after the next life began counts for nothing in it
  (``ended`` is called between them): its events are told apart by their bus's epoch
  (``committed``), its marker by its generation (unique in the journal), so the new
  life's window opens only once its own marker commits, from its own committed events.

Prompts and session records are unaffected: always committed before they are
acknowledged. Everything here runs in the event loop (no locks).
"""

from __future__ import annotations

import dataclasses
import itertools

import msgspec

ARMING, ARMED = "arming", "armed"
MARKER_ID = 0


class Marker(msgspec.Struct, frozen=True):
    """An internal journal record: set (``on``) or clear a session's marker row."""

    session_id: str
    on: bool
    generation: int


@dataclasses.dataclass(slots=True)
class _Session:
    state: str | None = None     # None (held), ARMING or ARMED
    generation: int = 0          # of its last marker (unique in the journal)
    epoch: str = ""              # its bus's (its events'): an older bus's never count
    appended: int = 0            # the last event id appended
    committed: int = 0           # the last event id committed
    open_prompts: int = 0        # accepted, not yet settled (as far as this journal saw)


class WriteBehind:
    """The per-session bookkeeping of the window; see the module docstring."""

    def __init__(self, window: int) -> None:
        self.window = window
        self._sessions: dict[str, _Session] = {}
        # markers' generations, across sessions and lives: a marker of an id's earlier
        # life that lands late never matches the current one's
        self._generations = itertools.count(1)

    def before_event(self, session_id: str, event_id: int, epoch: str = "") -> Marker | None:
        """An event of the bus ``epoch`` is about to be appended: the marker to
        append first, if any."""
        s = self._sessions.get(session_id)
        if s is None:
            s = self._sessions[session_id] = _Session()
        s.appended, s.epoch = event_id, epoch
        if s.state is not None:
            return None
        s.state, s.generation = ARMING, next(self._generations)
        return Marker(session_id, True, s.generation)

    def early(self, session_id: str, event_id: int) -> bool:
        """Whether readers may see this (appended) event before its commit."""
        s = self._sessions.get(session_id)
        return (s is not None and s.state == ARMED
                and event_id - s.committed <= self.window)

    def prompt(self, session_id: str, delta: int) -> None:
        """A prompt accepted (+1) or settled (-1) was appended."""
        s = self._sessions.get(session_id)
        if s is None:
            s = self._sessions[session_id] = _Session()
        s.open_prompts = max(0, s.open_prompts + delta)

    def ended(self, session_id: str) -> None:
        """The id's life ended (closed, deleted, made anew, a load undone): what of
        it is still in a commit counts for no later life (``committed``, and the
        markers' generations)."""
        self._sessions.pop(session_id, None)

    def committed(self, session_id: str, event_id: int, epoch: str = "") -> None:
        """An event of the bus ``epoch`` was committed (one of an earlier life of the
        id, landing late, is not this life's: ignored)."""
        s = self._sessions.get(session_id)
        if s is not None and s.epoch == epoch and event_id > s.committed:
            s.committed = event_id

    def marker_landed(self, marker: Marker) -> None:
        s = self._sessions.get(marker.session_id)
        if marker.on and s is not None and s.state == ARMING \
                and s.generation == marker.generation:
            s.state = ARMED

    def quiet(self, session_ids: set[str]) -> list[Marker]:
        """After a commit: the markers to clear, for the armed sessions among
        ``session_ids`` that are fully committed and have no prompt unsettled."""
        cleared = []
        for sid in session_ids:
            s = self._sessions.get(sid)
            if s is None or s.state != ARMED or s.appended > s.committed or s.open_prompts:
                continue
            s.state = None
            cleared.append(Marker(sid, False, s.generation))
        return cleared
