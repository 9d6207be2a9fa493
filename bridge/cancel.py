"""A cancellation token a caller hands to ``Bridge.send_prompt``.

    token = CancelToken()
    ticket = bridge.send_prompt(session_id, prompt, cancel=token)
    token.cancel("client went away")     # queued: dropped; running: ACP session/cancel

A token that is already cancelled at admission makes ``send_prompt`` raise
``PromptCancelledError`` before a slot is counted. ``cancel`` is synchronous and
idempotent; callbacks run once, in registration order.
"""

from __future__ import annotations

from collections.abc import Callable


class CancelToken:
    __slots__ = ("_cancelled", "_reason", "_callbacks")

    def __init__(self) -> None:
        self._cancelled = False
        self._reason: str | None = None
        self._callbacks: list[Callable[[str | None], None]] | None = []

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @property
    def reason(self) -> str | None:
        return self._reason

    def cancel(self, reason: str | None = None) -> None:
        if self._cancelled:
            return
        self._cancelled = True
        self._reason = reason
        callbacks, self._callbacks = self._callbacks, None
        for callback in callbacks or ():
            callback(reason)

    def add_callback(self, callback: Callable[[str | None], None]) -> Callable[[], None]:
        """Run ``callback(reason)`` on cancel (at once if already cancelled).
        Returns a function that unregisters it."""
        if self._callbacks is None:
            callback(self._reason)
            return _noop
        self._callbacks.append(callback)

        def remove() -> None:
            if self._callbacks is not None and callback in self._callbacks:
                self._callbacks.remove(callback)

        return remove


def _noop() -> None:
    return None
