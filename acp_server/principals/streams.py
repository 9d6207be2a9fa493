"""The open streams of each stored token, so that revoking the token ends them.

    with streams.hold(principal.token_id) as scope:   # an SSE response, a WebSocket
        await app(scope, receive, send)                # cancelled when the token goes
    streams.end(["9f2c4d1e0b7a6c35"])                  # revoked here or elsewhere: 1 ended

Contracts: ``hold`` registers a cancel scope under the token id for the block (a
``None`` id, a credential that cannot be revoked, holds nothing); ``end`` cancels
every scope held under those ids and returns how many; ``held()`` are the ids with
something open (what the principals re-check while it is open). The ``local``
principal's streams are held under ``LOCAL_STREAMS`` (``stream_id``), ended when a
credential is first configured. Synchronous; the event loop's thread only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import anyio


# The streams of the ``local`` principal (no credential configured) are held under this
# id: they end when a credential is first configured (``Gate``), as a revoked token's do.
LOCAL_STREAMS = "(local)"


def stream_id(principal: Any) -> str | None:
    """What a principal's streams are held under: its stored token's id, the
    ``LOCAL_STREAMS`` id for ``local``, else ``None`` (the bootstrap token: nothing)."""
    token_id: str | None = principal.token_id
    if token_id is None and principal.kind == "local":
        return LOCAL_STREAMS
    return token_id


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
        """The stored tokens' ids with something open (``LOCAL_STREAMS`` left out)."""
        return [token_id for token_id in self._open if token_id != LOCAL_STREAMS]

    def count(self, token_id: str) -> int:
        return len(self._open.get(token_id, ()))


__all__ = ["LOCAL_STREAMS", "StreamRegistry", "stream_id"]
