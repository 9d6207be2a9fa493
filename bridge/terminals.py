"""How a session's prompts ended: the newest ``MAX_PROMPT_TERMINALS``, oldest first.

    terminals = Terminals()
    terminals.keep(PromptTerminal(prompt_id="p1", terminal="completed", at=1))
    terminals.latest("p1")            # PromptTerminal, or None (unknown, or refused)
    terminals.forget_refused("p2")    # "p2" admitted again: its refusal is dropped

A ``deque`` (the doors read it as one: ``/load``'s ``promptTerminals``) that also
knows which ids were refused at admission (``bridge.status.REFUSED_CODES``: the prompt
never ran), so that an id sent again after its refusal names one prompt with one
terminal, at no cost for an id never refused.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from bridge.status import MAX_PROMPT_TERMINALS, PromptTerminal, refused


class Terminals(deque[PromptTerminal]):
    def __init__(self, terminals: Iterable[PromptTerminal] = (),
                 maxlen: int | None = MAX_PROMPT_TERMINALS) -> None:   # (deque.copy's call)
        super().__init__((), maxlen)
        # the ids whose terminal here is a refusal: an id leaves with its terminal
        self.refused_ids: set[str] = set()
        self.keep_all(terminals)

    def keep(self, terminal: PromptTerminal) -> None:
        if len(self) == self.maxlen and refused(self[0]):   # the oldest goes: its id too
            self.refused_ids.discard(self[0].prompt_id)
        self.append(terminal)
        if refused(terminal):
            self.refused_ids.add(terminal.prompt_id)

    def keep_all(self, terminals: Iterable[PromptTerminal]) -> None:
        for terminal in terminals:
            self.keep(terminal)

    def latest(self, prompt_id: str) -> PromptTerminal | None:
        """How ``prompt_id`` ended; ``None`` when unknown or refused at admission."""
        found = next((t for t in reversed(self) if t.prompt_id == prompt_id), None)
        return None if found is None or refused(found) else found

    def forget_refused(self, prompt_id: str) -> None:
        """``prompt_id`` is admitted again: drop its refusal (nothing else is dropped)."""
        if prompt_id in self.refused_ids:
            self.refused_ids.discard(prompt_id)
            kept = [t for t in self if t.prompt_id != prompt_id]
            self.clear()
            self.extend(kept)
