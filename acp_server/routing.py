"""A Starlette ``Router`` that looks routes up by path shape instead of trying each.

    app = Starlette(routes=routes)
    app.router = IndexedRouter(routes=routes)

Starlette's router tries every route's regex in order; with a dozen routes before
``POST /session/{id}/prompt`` that is most of the cost of a refused prompt. This
router indexes each ``Route``/``WebSocketRoute`` by (segment count, first segment,
last segment or ``*`` for a parameter) and runs ``matches`` only on the few
candidates, in their original order, so the answer is the same as Starlette's:
first full match wins, else the first partial match (405), else 404. Routes it
cannot index (mounts, ``{x:path}`` parameters) are candidates for every path. No
trailing-slash redirects.
"""

from __future__ import annotations

from typing import Any

from starlette.routing import BaseRoute, Match, Route, Router, WebSocketRoute
from starlette.types import Receive, Scope, Send

_Key = tuple[int, str, str]


def _shape(path: str) -> _Key | None:
    if ":path}" in path:
        return None
    segments = path.strip("/").split("/")
    last = segments[-1]
    return (len(segments), segments[0], "*" if "{" in last else last)


class IndexedRouter(Router):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("redirect_slashes", False)
        super().__init__(*args, **kwargs)
        self._indexed_count = -1
        self._index: dict[_Key, list[BaseRoute]] = {}
        self._anywhere: list[BaseRoute] = []

    def _build_index(self) -> None:
        index: dict[_Key, list[BaseRoute]] = {}
        anywhere: list[BaseRoute] = []
        for route in self.routes:
            key = _shape(route.path) if isinstance(route, (Route, WebSocketRoute)) else None
            if key is None or "{" in key[1]:
                anywhere.append(route)
            else:
                index.setdefault(key, []).append(route)
        self._index, self._anywhere = index, anywhere
        self._indexed_count = len(self.routes)

    def candidates(self, path: str) -> list[BaseRoute]:
        if self._indexed_count != len(self.routes):   # routes were added after construction
            self._build_index()
        segments = path.strip("/").split("/")
        count, first = len(segments), segments[0]
        exact = self._index.get((count, first, segments[-1]), ())
        param = self._index.get((count, first, "*"), ())
        if not self._anywhere and not (exact and param):
            return list(exact or param)
        order = {id(route): i for i, route in enumerate(self.routes)}
        return sorted([*exact, *param, *self._anywhere], key=lambda r: order[id(r)])

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await super().app(scope, receive, send)
            return
        scope.setdefault("router", self)
        partial = partial_scope = None
        for route in self.candidates(scope["path"]):
            match, child_scope = route.matches(scope)
            if match is Match.FULL:
                scope["route"] = route
                scope.update(child_scope)
                await route.handle(scope, receive, send)
                return
            if match is Match.PARTIAL and partial is None:
                partial, partial_scope = route, child_scope
        if partial is not None:
            scope["route"] = partial
            scope.update(partial_scope or {})
            await partial.handle(scope, receive, send)
            return
        await self.default(scope, receive, send)
