"""The items of a session's FIFO: an admitted prompt, a non-prompt job, the wait stats.

    pending = PendingPrompt(prompt_id, prompt, ticket, deadline_ms=None,
                            was_queued=False, client_id=None)
    pending.state                        # QUEUED → RUNNING → DONE (bridge.session moves it)
    item = WorkItem(job); ...; await item.wait()   # a branch: no prompt slot

Contracts: a ``PendingPrompt`` holds no behaviour beyond its snapshot (``info``); its
state is changed only by its ``Session``, which settles it exactly once. A
``WorkItem``'s ``wait`` returns the job's result or raises its exception.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from bridge import events as ev
from bridge.status import PendingPromptInfo, QueueWait
from bridge.ticket import PromptTicket

QUEUED, RUNNING, DONE = "queued", "running", "done"
PROMPT_TEXT_PREVIEW = 500
DISPLAY_NAME_MAX = 200   # code points, then "...": qwen serve's truncatePromptForDisplay


def prompt_text(prompt: list[Any]) -> str:
    parts = [block.get("text", "") for block in prompt
             if isinstance(block, dict) and block.get("type") == "text"]
    text = "\n".join(p for p in parts if isinstance(p, str))
    return text[:PROMPT_TEXT_PREVIEW]


def display_name(prompt: list[Any]) -> str | None:
    """The name qwen serve lists a session under when it has no title: its first
    prompt's first text block that is not empty, cut to ``DISPLAY_NAME_MAX`` code points
    and ``...`` (``None``: no text)."""
    text = next((block["text"] for block in prompt if isinstance(block, dict)
                 and block.get("type") == "text" and isinstance(block.get("text"), str)
                 and block["text"]), None)
    if text is None or len(text) <= DISPLAY_NAME_MAX:
        return text
    return text[:DISPLAY_NAME_MAX] + "..."


class PendingPrompt:
    __slots__ = ("prompt_id", "prompt", "text", "queued_at_ms", "admitted_at", "deadline_ms",
                 "state", "was_queued", "ticket", "cancel_requested", "run_scope",
                 "timer_scope", "unhook_cancel", "client_id", "started_at", "commit_seq",
                 "continued", "sent", "removed", "handed")

    def __init__(self, prompt_id: str, prompt: list[Any], ticket: PromptTicket,
                 deadline_ms: int | None, was_queued: bool, client_id: str | None) -> None:
        self.prompt_id = prompt_id
        self.prompt = prompt
        self.text = prompt_text(prompt)
        self.queued_at_ms = ev.now_ms()
        self.admitted_at = time.monotonic()
        self.deadline_ms = deadline_ms
        self.state = QUEUED
        self.was_queued = was_queued
        self.ticket = ticket
        self.cancel_requested = False
        self.sent = False   # handed to the agent (``session/prompt`` on its way)
        # Sent from a task of its own (``bridge.turn``: an agent in another process): set
        # as that task sends it; a cancel notice waits for it, so never goes first.
        self.handed: anyio.Event | None = None
        self.removed = False   # dropped from the queue by its removal (``remove_pending_prompt``)
        self.run_scope: anyio.CancelScope | None = None
        self.timer_scope: anyio.CancelScope | None = None
        self.unhook_cancel: Callable[[], None] | None = None
        self.client_id = client_id
        self.started_at: float | None = None   # monotonic, when its turn started
        self.commit_seq = 0   # its PromptAccepted in a durable journal (0: none)
        # Set by bridge.restore (policy continue): the turn runs again, marked with it.
        self.continued: dict[str, str] | None = None

    def info(self) -> PendingPromptInfo:
        return PendingPromptInfo(self.prompt_id, self.queued_at_ms, self.text, self.state)


class WorkItem:
    """A non-prompt job on the FIFO (e.g. a branch). Takes no prompt slot."""

    __slots__ = ("job", "done", "outcome")

    def __init__(self, job: Callable[[], Awaitable[Any]]) -> None:
        self.job = job
        self.done = anyio.Event()
        self.outcome: Any = None

    async def wait(self) -> Any:
        await self.done.wait()
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome


class QueueWaitStats:
    __slots__ = ("count", "total_ms", "max_ms", "last_ms")

    def __init__(self) -> None:
        self.count = 0
        self.total_ms = 0.0
        self.max_ms = 0.0
        self.last_ms = 0.0

    def record(self, wait_ms: float) -> None:
        self.count += 1
        self.total_ms += wait_ms
        self.last_ms = wait_ms
        if wait_ms > self.max_ms:
            self.max_ms = wait_ms

    def snapshot(self) -> QueueWait:
        mean = self.total_ms / self.count if self.count else 0.0
        return QueueWait(self.count, round(mean, 3), round(self.max_ms, 3),
                         round(self.last_ms, 3))
