"""``qwen serve``'s per-workspace mounts of this daemon's one workspace: the path a
``/workspaces/{ws}/{tail}`` request stands for, for the front layer.

    mounts = WorkspaceMounts("/srv/ws", "6a48a62980ca2198", {
        "acp": "/acp", "sessions": "/workspace/6a48a62980ca2198/sessions"})
    FrontLayer(app, policy, doors=DOORS, aliases=mounts.exact, stray_alias=mounts.of_stray)
    mounts.exact["/workspaces/6a48a62980ca2198/acp"]    # "/acp"
    mounts.exact["/workspaces//srv/ws/acp"]             # "/acp" (sent as %2Fsrv%2Fws)
    mounts.of_stray("/workspaces//srv/ws/../ws/acp")    # "/acp"
    mounts.of_stray("/workspaces//srv/other/acp")       # "/workspaces/%2Fsrv%2Fother/acp"
    mounts.of_stray("/session//x")                      # None

Contracts:

* ``{ws}`` names the workspace by its id (``/capabilities`` ``workspaces[0].id``) or by
  its absolute path URL-encoded as one segment (``%2Fsrv%2Fws``, what
  ``@qwen-code/sdk``'s ``workspaceByCwd`` sends). The HTTP server decodes the path, so
  the app sees ``/workspaces//srv/ws/acp``: a path with an empty segment, which the
  front layer answers 404 unless an alias claims it.
* ``exact``: each mount's path as the server hands it over (``{ws}`` the id, the path
  as given, its ``realpath``) → the path it stands for. The front layer's one dict
  lookup per request.
* ``of_stray(path)``: called by the front layer only for a path it would answer 404
  (an empty or a dot segment), never on the hot path. When ``path`` is
  ``/workspaces/{S}/{tail}`` (one trailing slash allowed) with a ``tail`` of
  ``targets`` and a non-empty ``S``: an absolute ``S`` that names this workspace once
  normalized as the peer does (``posixpath.normpath``: ``//x`` is ``/x``, ``.`` and
  ``..`` resolved, a trailing slash dropped) → the tail's target. Any other ``S`` (the
  path of another folder, a relative one) → ``/workspaces/{S URL-encoded}/{tail}``
  (``.`` and ``..`` as ``%2E``: never a dot segment), the route that answers another
  workspace (``rest.workspace``: 400 ``workspace_mismatch``, as the peer does), never
  a route of this workspace. Every other path → ``None`` (it stays a 404). No file
  system access: a symlink to the workspace is not followed (the peer follows it), so
  a request never makes the server look at a path it names.
* ``by_path``: the same for ``/workspace/{S}/{tail}`` (``@qwen-code/sdk``'s
  ``listWorkspaceSessions(cwd)`` sends the path there): ``S`` this workspace's path
  (however spelt, as above) → the tail's target; any other ``S`` → the singular route
  itself, ``/workspace/{S URL-encoded}/{tail}``, an absolute ``S`` normalized first
  (so its one segment starts with ``%2F``: ``ABSOLUTE``), where the route answers as
  qwen's ``resolveRuntimeFromWorkspaceParam`` (``rest.workspace``: an absolute path is
  400 ``workspace_mismatch`` naming it, a relative one 400 "`:id` must decode to a
  workspace id or absolute path"). The id form ``/workspace/{id}/{tail}`` is the route
  itself.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Mapping
from urllib.parse import quote

PREFIX = "/workspaces/"
SINGULAR = "/workspace/"   # qwen's ``/workspace/:id/sessions`` takes the path too
ABSOLUTE = "%2F"   # how an absolute ``S`` begins once encoded as one segment


class WorkspaceMounts:
    """The mounts of one workspace (``cwd``, its id ``wid``) for ``targets``: tail →
    the path it stands for (``{"acp": "/acp", …}``); ``by_path``: the same for
    ``/workspace/{path}/{tail}`` (the singular prefix, whose id form is the route
    itself), another path there reaching ``/workspaces/{S URL-encoded}/{tail}`` too."""

    __slots__ = ("by_path", "exact", "paths", "targets")

    def __init__(self, cwd: str, wid: str, targets: Mapping[str, str],
                 by_path: Mapping[str, str] | None = None) -> None:
        self.targets = dict(targets)
        self.by_path = dict(by_path or {})
        self.paths = frozenset({cwd, os.path.realpath(cwd)})
        self.exact = {f"{PREFIX}{sel}/{tail}": target
                      for sel in {wid, *self.paths} for tail, target in self.targets.items()}
        self.exact.update({f"{SINGULAR}{sel}/{tail}": target
                           for sel in self.paths for tail, target in self.by_path.items()})

    def of_stray(self, path: str) -> str | None:
        if path.startswith(PREFIX):
            rest, targets = path[len(PREFIX):], self.targets
        elif path.startswith(SINGULAR):
            rest, targets = path[len(SINGULAR):], self.by_path
        else:
            return None
        if rest.endswith("/"):
            rest = rest[:-1]
        selector, slash, tail = rest.rpartition("/")
        target = targets.get(tail)
        if target is None or not slash or not selector or tail not in self.targets:
            return None
        named = selector
        if selector.startswith("/"):
            normal = posixpath.normpath(selector)
            if normal.startswith("//"):   # POSIX keeps two leading slashes; the peer does not
                normal = "/" + normal.lstrip("/")
            if normal in self.paths:
                return target
            if targets is self.by_path:   # the singular route names the path it was given
                named = normal
        encoded = quote(named, safe="")
        if encoded in (".", ".."):   # no dot segment in a path that reaches a route
            encoded = encoded.replace(".", "%2E")
        prefix = SINGULAR if targets is self.by_path else PREFIX
        return f"{prefix}{encoded}/{tail}"


__all__ = ["ABSOLUTE", "PREFIX", "SINGULAR", "WorkspaceMounts"]
