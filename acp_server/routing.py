"""A Starlette ``Router`` that looks routes up by path shape instead of trying each.

    app = Starlette(routes=routes)
    app.router = IndexedRouter(routes=routes)

Starlette's router tries every route's regex in order; with a dozen routes before
``POST /session/{id}/prompt`` that is most of the cost of a refused prompt. This
router indexes each ``Route``/``WebSocketRoute`` by (segment count, first segment,
last segment or ``*`` for a parameter) and tries only the few candidates, in their
original order, so the answer is the same as Starlette's: first full match wins, else
the first partial match (405), else 404. An HTTP ``Route`` whose parameters are plain
``{name}`` (Starlette's ``str`` convertor, ``[^/]+``) is matched segment by segment,
without its regex; others use ``Route.matches``. Routes it cannot index (mounts,
``{x:path}`` parameters) are candidates for every path. No trailing-slash redirects,
and a request path is matched as it is, as Starlette's regexes match it: ``/a/b/``
and ``//a/b`` are not ``/a/b`` (the front layer makes ``/a/b/`` ``/a/b`` and answers
``//a/b`` 404 before the router, ``acp_server.http.front.canonical_path``).
"""

from __future__ import annotations

from typing import Any

from starlette.routing import BaseRoute, Match, Route, Router, WebSocketRoute, get_route_path
from starlette.types import Receive, Scope, Send

_Key = tuple[int, str, str]
# A plain route's path as segments: a literal, or (the parameter's name,) for ``{name}``.
_Template = tuple["str | tuple[str]", ...]


def _template(route: BaseRoute) -> _Template | None:
    if type(route) is not Route or ":" in route.path:
        return None
    template: list[str | tuple[str]] = []
    for segment in route.path.strip("/").split("/"):
        if "{" in segment:
            if not (segment.startswith("{") and segment.endswith("}")) or \
                    segment.count("{") != 1:
                return None
            template.append((segment[1:-1],))
        else:
            template.append(segment)
    return tuple(template)


def _match(route: Route, template: _Template, segments: list[str],
           scope: Scope) -> tuple[Match, Scope]:
    """``Route.matches`` for a plain route, without the regex."""
    if len(segments) != len(template):
        return Match.NONE, {}
    params: dict[str, Any] = {}
    for want, got in zip(template, segments):
        if type(want) is tuple:
            if not got:
                return Match.NONE, {}
            params[want[0]] = got
        elif want != got:
            return Match.NONE, {}
    path_params = {**scope["path_params"], **params} if scope.get("path_params") else params
    child = {"endpoint": route.endpoint, "path_params": path_params}
    if route.methods and scope["method"] not in route.methods:
        return Match.PARTIAL, child
    return Match.FULL, child


def _shape(path: str) -> _Key | None:
    if ":path}" in path:
        return None
    segments = path.strip("/").split("/")
    last = segments[-1]
    return (len(segments), segments[0], "*" if "{" in last else last)


def _segments(path: str) -> list[str]:
    """A request path's segments as they are: ``//a`` is ``["", "a"]``, ``/a/`` is
    ``["a", ""]`` (no route has either), ``/`` is ``[""]`` (the route ``/``)."""
    return path[1:].split("/") if path[:1] == "/" else path.split("/")


class IndexedRouter(Router):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("redirect_slashes", False)
        super().__init__(*args, **kwargs)
        self._indexed_count = -1
        self._index: dict[_Key, list[BaseRoute]] = {}
        self._anywhere: list[BaseRoute] = []
        self._templates: dict[int, _Template] = {}

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
        self._templates = {id(r): t for r in self.routes if (t := _template(r)) is not None}
        self._indexed_count = len(self.routes)

    def candidates(self, path: str) -> list[BaseRoute]:
        if self._indexed_count != len(self.routes):   # routes were added after construction
            self._build_index()
        segments = _segments(path)
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
        candidates = self.candidates(scope["path"])
        segments = _segments(get_route_path(scope)) if scope["type"] == "http" else None
        for route in candidates:
            template = self._templates.get(id(route)) if segments is not None else None
            if template is not None:
                match, child_scope = _match(route, template, segments, scope)  # type: ignore[arg-type]
            else:
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
