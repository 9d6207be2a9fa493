"""Hooks the bridge calls as things happen, for whoever watches it (the metrics).

    class Counting(BridgeObserver):
        def __init__(self) -> None:
            self.rejected = 0
        def prompt_rejected(self) -> None:
            self.rejected += 1

    bridge.observe(Counting())     # before the first session

Contracts: hooks are called synchronously on the event loop, never awaited; they
must not raise and must not block. ``prompt_rejected`` is on the refusal path, so an
implementation should be one bound call (e.g. a pre-bound counter child's ``inc``).
The defaults do nothing. Live quantities (sessions, pending prompts) are not pushed:
readers take them from ``Bridge.stats()`` when they need them.
"""

from __future__ import annotations


class BridgeObserver:
    def prompt_admitted(self) -> None:
        """``send_prompt`` admitted a prompt."""

    def prompt_rejected(self) -> None:
        """``send_prompt`` raised ``PromptQueueFullError``."""

    def turn_started(self, queue_wait_s: float) -> None:
        """A prompt started its turn, ``queue_wait_s`` after its admission."""

    def turn_settled(self, stop_reason: str, duration_s: float) -> None:
        """A started turn settled: its stop reason (``error`` for a failure) and how
        long it ran."""

    def subscriber_evicted(self) -> None:
        """An event subscriber was evicted for reading too slowly."""

    def agent_restarted(self, agent: str) -> None:
        """The agent ``agent`` is being started again after its process died."""

    def agent_abandoned(self, agent: str, action: str) -> None:
        """A session gave up on agent ``agent``, which never ended a cancelled turn
        (``bridge.abandoning``): ``action`` is the ``agent_abandoned`` event's,
        ``agent_stopped`` or ``session_detached``."""

    def foreign_message_dropped(self, agent: str, method: str) -> None:
        """The agent ``agent`` sent ``method`` (``session/update``,
        ``session/request_permission``, ``fs/...``) naming another agent's session:
        dropped (``bridge.agent_client``)."""


NO_OBSERVER = BridgeObserver()
