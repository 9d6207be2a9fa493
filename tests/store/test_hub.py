"""The live hub: a commit's events reach the watchers of their own task only."""

from __future__ import annotations

from acp_server.store.hub import Hub
from acp_server.store.tasks import CommittedEvent


def _event(task_id: str, seq: int) -> CommittedEvent:
    return CommittedEvent(task_id, seq, "response.failed", b"{}")


def test_one_commit_of_several_tasks_reaches_each_tasks_watchers() -> None:
    # A recovery (PostgreSQL: expired leases, any instance's) commits the terminal events
    # of several tasks at once: all went to the first task's watchers, none to the others
    # (they waited for the polling fallback).
    hub = Hub()
    with hub.watch("a") as a, hub.watch("b") as b, hub.watch("c") as c:
        hub.publish([_event("b", 3), _event("a", 7), _event("b", 4)])
        assert b.take(2) == [_event("b", 3), _event("b", 4)]
        assert a.take(6) == [_event("a", 7)]
        assert c.take(0) == []
