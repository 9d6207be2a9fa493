"""Property: under any interleaving of completion, failure, cancel, deadline, removal
and close, every ticket settles exactly once, with exactly one terminal event, and the
pending count never goes negative and returns to 0."""

from __future__ import annotations

from collections import Counter

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge import CancelToken, PromptTicket
from bridge.errors import PromptQueueFullError, SessionNotFoundError
from tests.bridge.helpers import drain, open_bridge, text

actions = st.lists(st.one_of(
    st.tuples(st.just("send"), st.sampled_from(["hold", "fail", "ok", "stubborn"]),
              st.sampled_from([None, 5, 40])),
    st.tuples(st.just("release"), st.integers(0, 30)),
    st.tuples(st.just("cancel_active")),
    st.tuples(st.just("remove"), st.integers(0, 30)),
    st.tuples(st.just("token_cancel"), st.integers(0, 30)),
    st.tuples(st.just("sleep"), st.sampled_from([0, 1, 10])),
    st.tuples(st.just("close")),
), max_size=40)


async def run_scenario(tmp_path, steps) -> None:
    settle_counts: Counter[str] = Counter()
    original = PromptTicket._settle

    def counting(ticket, outcome):
        won = original(ticket, outcome)
        settle_counts[ticket.prompt_id] += won
        return won

    PromptTicket._settle = counting
    try:
        await _scenario(tmp_path, steps, settle_counts)
    finally:
        PromptTicket._settle = original


async def _scenario(tmp_path, steps, settle_counts) -> None:
    async with open_bridge(tmp_path, max_pending_prompts_per_session=4, prompt_deadline_ms=60_000,
                           cancel_grace_ms=20, subscriber_max_queued=2048) as (bridge, agent):
        sid = (await bridge.create_session()).session_id
        session = bridge.get_session(sid)
        sub = bridge.subscribe(sid)
        tickets, tokens = [], []
        observed_counts = []
        for step in steps:
            kind = step[0]
            if kind == "send":
                token = CancelToken()
                try:
                    ticket = bridge.send_prompt(sid, text(f"{step[1]} k{len(tickets)}"),
                                                deadline_ms=step[2], cancel=token)
                except (PromptQueueFullError, SessionNotFoundError):
                    continue
                tickets.append(ticket)
                tokens.append(token)
            elif kind == "release" and tickets:
                agent.release(f"k{step[1] % len(tickets)}")
            elif kind == "cancel_active":
                try:
                    await bridge.cancel_session(sid)
                except SessionNotFoundError:
                    pass
            elif kind == "remove" and tickets:
                try:
                    bridge.remove_pending_prompt(sid, tickets[step[1] % len(tickets)].prompt_id)
                except LookupError:
                    pass
            elif kind == "token_cancel" and tokens:
                tokens[step[1] % len(tokens)].cancel("property")
            elif kind == "sleep":
                await anyio.sleep(step[1] / 1000)
            elif kind == "close":
                try:
                    await bridge.close_session(sid)
                except SessionNotFoundError:
                    pass
            observed_counts.append(session.pending_count)
            assert 0 <= session.pending_count == len(session.pending)
        for i in range(len(tickets)):
            agent.release(f"k{i}")
        with anyio.fail_after(10):
            for ticket in tickets:
                try:
                    await ticket
                except Exception:
                    pass
        assert session.pending_count == 0 and not session.pending
        assert all(settle_counts[t.prompt_id] == 1 for t in tickets)
        terminal = Counter(f.prompt_id for f in drain(sub) if f.type in ("turn_complete", "turn_error"))
        assert all(terminal[t.prompt_id] == 1 for t in tickets), terminal
        assert min(observed_counts, default=0) >= 0


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=actions)
def test_every_ticket_settles_exactly_once(tmp_path, backend, steps):
    anyio.run(run_scenario, tmp_path, steps, backend=backend)
