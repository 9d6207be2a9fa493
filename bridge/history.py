"""A session's history as ``load`` hands it over: the compacted replay, the live
journal, the prompt terminals and the cursor placed after them (as ``qwen serve``).

    history = session_history(session)            # bridge.status.SessionHistory
    history.compacted_replay   # [Event(id=1, type='session_update', ...), ...]
    history.live_journal       # the running prompt's events, as published
    history.prompt_terminals   # [PromptTerminal(prompt_id=..., terminal="completed", ...)]
    history.last_event_id      # the id of the last event above: subscribe from here

Contracts:

* The events are the bus ring's, in order, the very ``Event`` objects (so a door's
  encoding of them is the one it already built), except that adjacent
  ``agent_message_chunk`` updates of one prompt (same non-null ``prompt_id``, text
  content) are compacted into one new event: the text joined, the other fields, the
  id and the timestamp those of the last chunk. Chunks without a prompt (an agent's
  ``session/load`` replay) stay as sent.
* ``live_journal`` holds the running prompt's events from its first one on
  (uncompacted: the turn is still changing); ``compacted_replay`` the rest.
* ``prompt_terminals`` outlive the session: ``Bridge`` keeps them when the session is
  closed, and a cold ``load`` under the same id carries them again.
* Everything is read synchronously, so ``last_event_id`` is exactly the last event
  returned: a subscriber from it misses nothing and doubles nothing.
* Nothing is shown before it is committed (a durable journal holds events back from
  readers until then, ``bridge.bus``): the replay holds the released events only, and
  a prompt's terminal is listed once none of its events is held, so a ``load``
  answered before a crash never lists a terminal the journal does not have.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from bridge import events as ev
from bridge.events import Event
from bridge.status import PromptTerminal, SessionHistory

if TYPE_CHECKING:
    from bridge.session import Session


def session_history(session: Session) -> SessionHistory:
    held = session.bus.held_prompt_ids()   # a terminal shows once its events are committed
    terminals = [t for t in session.prompt_terminals if t.prompt_id not in held] if held \
        else list(session.prompt_terminals)
    return history_of(session.bus.ring_events(),
                      session.active.prompt_id if session.active is not None else None,
                      terminals, session.bus.released_id)


def history_of(events: list[Event], active: str | None, terminals: list[PromptTerminal],
               last_event_id: int) -> SessionHistory:
    """The history of ``events`` (a ring, oldest first) while prompt ``active`` runs
    (also of a session read back from its journal: ``acp_server.fleet.replica``)."""
    split = len(events)
    if active is not None:   # from its turn's first event (its queueing came before)
        split = next((i for i, e in enumerate(events) if e.prompt_id == active
                      and e.type != ev.PENDING_PROMPT_ADDED), split)
    return SessionHistory(
        compacted_replay=compact(events[:split]),
        live_journal=events[split:],
        prompt_terminals=terminals,
        last_event_id=events[-1].id if events else last_event_id)  # type: ignore[arg-type]


def compact(events: list[Event]) -> list[Event]:
    out: list[Event] = []
    run: list[tuple[Event, dict[str, Any]]] = []
    for event in events:
        update = _text_chunk(event)
        if update is not None and run and run[-1][0].prompt_id == event.prompt_id:
            run.append((event, update))
            continue
        out.extend(_flush(run))
        run = []
        if update is not None:
            run.append((event, update))
        else:
            out.append(event)
    out.extend(_flush(run))
    return out


def text_update(data: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(the event's data, decoded, and its ``update``) for a ``session_update`` whose
    content is one text block, else ``None`` (the history's joins, the transcript)."""
    if isinstance(data, msgspec.Raw):
        try:
            data = msgspec.json.decode(data)
        except msgspec.DecodeError:
            return None
    update = data.get("update") if isinstance(data, dict) else None
    if not isinstance(update, dict):
        return None
    content = update.get("content")
    if not isinstance(content, dict) or content.get("type") != "text" \
            or not isinstance(content.get("text"), str):
        return None
    return data, update


def _text_chunk(event: Event) -> dict[str, Any] | None:
    """The update of a prompt's text ``agent_message_chunk``, else ``None``."""
    if event.type != ev.SESSION_UPDATE or event.prompt_id is None:
        return None
    found = text_update(event.data)
    if found is None or found[1].get("sessionUpdate") != "agent_message_chunk":
        return None
    return {"data": found[0], "update": found[1]}


def _flush(run: list[tuple[Event, dict[str, Any]]]) -> list[Event]:
    if len(run) <= 1:
        return [event for event, _ in run]
    last, parts = run[-1]
    text = "".join(p["update"]["content"]["text"] for _, p in run)
    update = {**parts["update"], "content": {**parts["update"]["content"], "text": text}}
    joined = Event(last.id, last.type, {**parts["data"], "update": update},
                   prompt_id=last.prompt_id, originator_client_id=last.originator_client_id,
                   timestamp_ms=last.timestamp_ms)
    joined.size = last.size
    return [joined]
