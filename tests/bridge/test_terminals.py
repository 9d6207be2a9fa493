"""``bridge.terminals.Terminals``: the newest 256 ends, which ids were refused at
admission, and dropping a refusal when its id is admitted again."""

from __future__ import annotations

import copy

from bridge.status import MAX_PROMPT_TERMINALS, PromptTerminal
from bridge.terminals import Terminals


def _end(pid: str, code: str | None = None) -> PromptTerminal:
    if code is None:
        return PromptTerminal(prompt_id=pid, terminal="completed", at=1, stop_reason="end_turn")
    return PromptTerminal(prompt_id=pid, terminal="failed", at=1, error_code=code)


def test_a_refusal_is_no_answer_and_is_dropped_when_its_id_comes_again() -> None:
    ends = Terminals([_end("a", "store_unavailable"), _end("b"), _end("c", "agent_died")])
    assert ends.latest("a") is None                       # refused: it never ran
    assert ends.latest("b") == _end("b")
    assert ends.latest("c") == _end("c", "agent_died")    # a turn that failed: it ran
    assert ends.refused_ids == {"a"}
    ends.forget_refused("a")
    ends.forget_refused("b")                              # not refused: kept
    assert [t.prompt_id for t in ends] == ["b", "c"] and ends.refused_ids == set()
    ends.keep(_end("a"))
    assert ends.latest("a") == _end("a")


def test_it_keeps_the_newest_and_copies_as_a_deque() -> None:
    ends = Terminals(_end(str(n), "store_unavailable") for n in range(MAX_PROMPT_TERMINALS + 5))
    assert len(ends) == MAX_PROMPT_TERMINALS and ends[0].prompt_id == "5"
    assert ends.refused_ids == {str(n) for n in range(5, MAX_PROMPT_TERMINALS + 5)}
    ends.keep_all(_end(f"ok-{n}") for n in range(MAX_PROMPT_TERMINALS))
    assert ends.refused_ids == set()   # bounded with the terminals it names
    for twin in (ends.copy(), copy.copy(ends)):
        assert isinstance(twin, Terminals) and list(twin) == list(ends)
        assert twin.maxlen == MAX_PROMPT_TERMINALS
