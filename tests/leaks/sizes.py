"""What a server holds, read from its object graph: the length of every container
reachable from a root by attributes, keyed by the attribute path.

    before = container_sizes(srv.server)
    ...                                          # drive work, bring it back to idle
    assert grown(before, container_sizes(srv.server)) == {}

Contracts: the walk follows instance attributes (``__dict__`` and ``__slots__``) and
the values of dicts, lists, tuples, sets and deques, from ``root``, breadth first,
visiting each object once (so its path is one of the shortest, the same from one walk
to the next); it does not enter modules, classes, functions, coroutines or objects of
third-party packages outside ``ALLOWED`` (the server's own state lives in
``acp_server`` and ``bridge`` objects). A container's path is the attribute chain
that reached it first, container elements written ``[*]``, so the per-session
dicts of every session add up under one path. ``grown`` is what exceeds its
``before`` by more than ``slack``: sizes that came back are not reported.
"""

from __future__ import annotations

import collections
import types
from typing import Any

ALLOWED = ("acp_server", "bridge", "tests")
CONTAINERS = (dict, list, tuple, set, frozenset, collections.deque)
SKIP = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType,
        types.CoroutineType, types.GeneratorType, types.AsyncGeneratorType, types.FrameType,
        str, bytes, bytearray, int, float, bool, type(None), memoryview)
MAX_DEPTH = 14


def _ours(obj: Any) -> bool:
    module = getattr(type(obj), "__module__", "") or ""
    return module.split(".", 1)[0] in ALLOWED


def _attributes(obj: Any) -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = []
    state = getattr(obj, "__dict__", None)
    if isinstance(state, dict):
        found.extend(state.items())
    for cls in type(obj).__mro__:
        for name in getattr(cls, "__slots__", ()):
            if isinstance(name, str) and hasattr(obj, name):
                try:
                    found.append((name, getattr(obj, name)))
                except Exception:   # noqa: BLE001 - a slot property that refuses
                    continue
    return found


def container_sizes(root: Any) -> dict[str, int]:
    """Summed lengths of the containers reachable from ``root``, by path."""
    sizes: dict[str, int] = collections.defaultdict(int)
    seen: set[int] = set()
    stack: collections.deque[tuple[str, Any, int]] = collections.deque(
        [(type(root).__name__, root, 0)])
    while stack:
        path, obj, depth = stack.popleft()
        if id(obj) in seen or isinstance(obj, SKIP) or depth > MAX_DEPTH:
            continue
        seen.add(id(obj))
        if isinstance(obj, types.MethodType):
            stack.appendleft((path, obj.__self__, depth))
            continue
        if isinstance(obj, CONTAINERS):
            sizes[path] += len(obj)
            items = obj.items() if isinstance(obj, dict) else ((None, v) for v in obj)
            for _key, value in list(items):
                stack.append((path + "[*]", value, depth + 1))
            continue
        if not _ours(obj):
            continue
        for name, value in _attributes(obj):
            stack.append((f"{path}.{name}", value, depth + 1))
    return dict(sizes)


def grown(before: dict[str, int], after: dict[str, int], *, slack: int = 0) -> dict[str, tuple[int, int]]:
    """Paths whose size exceeds ``before`` by more than ``slack``: (before, after)."""
    return {path: (before.get(path, 0), size) for path, size in sorted(after.items())
            if size > before.get(path, 0) + slack}
