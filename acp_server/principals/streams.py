"""The open streams of each stored token, so that revoking the token ends them.

    with streams.hold(principal.token_id) as scope:   # an SSE response, a WebSocket
        await app(scope, receive, send)                # cancelled when the token goes
    streams.end(["9f2c4d1e0b7a6c35"])                  # revoked here or elsewhere: 1 ended

Contracts: ``hold`` registers a cancel scope under the token id for the block (a
``None`` id, a credential that cannot be revoked, holds nothing); ``end`` cancels
every scope held under those ids and returns how many; ``held()`` are the ids with
something open (what the principals re-check while it is open). Synchronous; the
event loop's thread only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import anyio


class StreamRegistry:
    def __init__(self) -> None:
        self._open: dict[str, set[anyio.CancelScope]] = {}
        self.ended = 0

    @contextlib.contextmanager
    def hold(self, token_id: str | None) -> Iterator[anyio.CancelScope]:
        with anyio.CancelScope() as scope:
            if token_id is None:
                yield scope
                return
            scopes = self._open.setdefault(token_id, set())
            scopes.add(scope)
            try:
                yield scope
            finally:
                scopes.discard(scope)
                if not scopes and self._open.get(token_id) is scopes:
                    del self._open[token_id]

    def end(self, token_ids: Iterable[str]) -> int:
        count = 0
        for token_id in token_ids:
            for scope in list(self._open.get(token_id, ())):
                scope.cancel()
                count += 1
        self.ended += count
        return count

    def held(self) -> list[str]:
        return list(self._open)

    def count(self, token_id: str) -> int:
        return len(self._open.get(token_id, ()))


__all__ = ["StreamRegistry"]
