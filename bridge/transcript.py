"""A session's conversation as the journal keeps it: what a restored agent is seeded with.

    messages = transcript(session.bus.ring_events(), skip={interrupted_prompt_id})
    # [{"role": "user", "text": "hello"}, {"role": "agent", "text": "Echo: hello"}, ...]
    params["_meta"] = {TRANSCRIPT_META: messages}     # on the restoring session/new

The seam is agent-agnostic: when an agent cannot ``session/load`` a journaled session
(it does not offer it, or does not know the session: our reference and model agents
keep their sessions in memory), ``bridge.restore`` makes a fresh ``session/new`` under
the same id and hands it the transcript in ``_meta["acp-server/transcript"]``. An agent
that knows the key seeds the new session's conversation with it (the reference agent,
the model agent); any other ignores ``_meta``, as ACP requires, and starts empty.

Contracts:

* Messages come from the journaled ``session_update`` events, in event order:
  ``user_message_chunk`` (the bridge's echo of a prompt, one chunk per block) and
  ``agent_message_chunk`` updates with text content. Adjacent chunks of one role and
  one prompt are one message (user blocks joined with ``"\\n"``, as agents read a
  prompt's text blocks; agent chunks joined as sent). Chunks with no prompt (an
  agent's own ``session/load`` replay) are one message each.
* Events of the prompts in ``skip`` are left out (a turn that runs again after the
  restart: the agent gets its prompt anew, never twice), and those of a prompt whose
  ``turn_error`` has ``errorKind`` ``context_length_exceeded`` (the agent did not keep
  it: the model agent's conversation goes on without it).
* A branch's or fork's record keeps its parent's conversation at its making
  (``seed_of``; ``SessionOpened.seed``): its restored agent gets that, then its own
  (``after_seed``).
* Bounded: the newest messages whose texts total at most ``max_bytes`` (UTF-8) are
  kept, oldest first; the journal itself keeps only the newest events of a session
  (``docs/restarts.md``, "Compaction"), so the transcript starts where they do.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

import msgspec

from bridge import events as ev
from bridge.events import Event
from bridge.history import text_update
from bridge.wire import CONTEXT_LENGTH_EXCEEDED, agent_error_kind

TRANSCRIPT_META = "acp-server/transcript"
MAX_TRANSCRIPT_BYTES = 1 << 20
_ROLES = {"user_message_chunk": "user", "agent_message_chunk": "agent"}


def transcript(events: Iterable[Event], *, skip: Collection[str] = (),
               max_bytes: int = MAX_TRANSCRIPT_BYTES) -> list[dict[str, str]]:
    """The conversation the events record (see the module contracts)."""
    events = list(events)
    skip = {*skip, *_not_kept(events)}
    messages: list[dict[str, str]] = []
    parts: list[str] = []
    key: tuple[str, str | None] | None = None   # (role, prompt id) of the open message

    def flush() -> None:
        if key is not None and parts:
            sep = "\n" if key[0] == "user" else ""
            messages.append({"role": key[0], "text": sep.join(parts)})

    for event in events:
        if event.type != ev.SESSION_UPDATE or (event.prompt_id is not None
                                               and event.prompt_id in skip):
            continue
        found = _chunk(event.data)
        if found is None:
            continue
        role, text = found
        here = (role, event.prompt_id)
        if here != key or event.prompt_id is None:
            flush()
            key, parts = here, []
        parts.append(text)
    flush()
    return _newest(messages, max_bytes)


_SEED = msgspec.json.Decoder(list[dict[str, str]])


def seed_of(parent_seed: str | None, events: Iterable[Event],
            max_bytes: int = MAX_TRANSCRIPT_BYTES) -> str:
    """The conversation a branch starts from, as a record keeps it (JSON): its parent's
    own seed (a branch of a branch), then the parent's journaled turns, the newest
    ``max_bytes`` of them."""
    return msgspec.json.encode(after_seed(parent_seed, transcript(events, max_bytes=max_bytes),
                                          max_bytes)).decode()


def after_seed(seed: str | None, messages: list[dict[str, str]],
               max_bytes: int = MAX_TRANSCRIPT_BYTES) -> list[dict[str, str]]:
    """``messages`` after the conversation ``seed`` holds (``seed_of``), the newest
    ``max_bytes`` of both; an unreadable seed counts as none."""
    if not seed:
        return messages
    try:
        before = _SEED.decode(seed)
    except msgspec.MsgspecError:
        return messages
    return _newest([*before, *messages], max_bytes)


def _not_kept(events: list[Event]) -> set[str]:
    """The prompts whose turn failed as over the model's context: the agent did not
    keep them (the model agent drops such a prompt from its conversation)."""
    ids = set()
    for event in events:
        if event.type == ev.TURN_ERROR and event.prompt_id is not None:
            data = event.data   # typed, or (an event built from its wire form) a dict
            kind = agent_error_kind(data) if isinstance(data, dict) \
                else getattr(data, "error_kind", None)
            if kind == CONTEXT_LENGTH_EXCEEDED:
                ids.add(event.prompt_id)
    return ids


def _chunk(data: Any) -> tuple[str, str] | None:
    """(role, text) of a text message chunk update, else ``None``."""
    found = text_update(data)
    if found is None:
        return None
    update = found[1]
    role = _ROLES.get(update.get("sessionUpdate"))   # type: ignore[arg-type]
    return None if role is None else (role, update["content"]["text"])


def _newest(messages: list[dict[str, str]], max_bytes: int) -> list[dict[str, str]]:
    total, start = 0, len(messages)
    while start > 0:
        size = len(messages[start - 1]["text"].encode("utf-8", "replace"))
        if total + size > max_bytes:
            break
        total += size
        start -= 1
    return messages[start:]


def seeded(meta: Any) -> list[tuple[str, str]]:
    """An agent's side: the ``(role, text)`` pairs of a ``session/new`` ``_meta``
    transcript (``role`` ``"user"`` or ``"agent"``); malformed entries are skipped."""
    found = meta.get(TRANSCRIPT_META) if isinstance(meta, dict) else None
    if not isinstance(found, list):
        return []
    return [(m["role"], m["text"]) for m in found
            if isinstance(m, dict) and m.get("role") in ("user", "agent")
            and isinstance(m.get("text"), str)]


__all__ = ["MAX_TRANSCRIPT_BYTES", "TRANSCRIPT_META", "after_seed", "seed_of", "seeded",
           "transcript"]
