"""``WorkspaceMounts``: the per-workspace mounts' exact paths, and what a path the front
layer would answer 404 stands for (an absolute ``{ws}``, decoded by the server)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from acp_server.http.front import canonical_path
from acp_server.http.mounts import WorkspaceMounts

WID = "6a48a62980ca2198"
TARGETS = {"acp": "/acp", "sessions": f"/workspace/{WID}/sessions"}


@pytest.fixture
def mounts(tmp_path: Path) -> WorkspaceMounts:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    return WorkspaceMounts(str(tmp_path / "link"), WID, TARGETS)


def test_the_exact_paths_are_the_id_the_path_and_its_realpath(mounts: WorkspaceMounts,
                                                              tmp_path: Path) -> None:
    link, real = str(tmp_path / "link"), os.path.realpath(tmp_path / "real")
    assert mounts.exact == {f"/workspaces/{sel}/{tail}": target
                            for sel in (WID, link, real) for tail, target in TARGETS.items()}


@pytest.mark.parametrize("form", ["{cwd}/", "{cwd}//", "/{cwd}", "//{cwd}", "{cwd}/.",
                                  "{cwd}/../link", "{cwd}/x/..", "{real}/"])
@pytest.mark.parametrize("tail", ["acp", "sessions", "acp/", "sessions/"])
def test_another_spelling_of_the_workspace_is_its_mount(mounts: WorkspaceMounts,
                                                        tmp_path: Path, form: str,
                                                        tail: str) -> None:
    selector = form.format(cwd=tmp_path / "link", real=os.path.realpath(tmp_path / "real"))
    path = f"/workspaces/{selector}/{tail}"
    assert canonical_path(path) is None   # the front layer asks only about these
    assert mounts.of_stray(path) == TARGETS[tail.rstrip("/")]


@pytest.mark.parametrize(("path", "target"), [
    ("/workspaces//srv/other/acp", "/workspaces/%2Fsrv%2Fother/acp"),
    ("/workspaces//srv/other/sessions/", "/workspaces/%2Fsrv%2Fother/sessions"),
    ("/workspaces///acp", "/workspaces/%2F/acp"),
    ("/workspaces/../acp", "/workspaces/%2E%2E/acp"),
    ("/workspaces/./sessions", "/workspaces/%2E/sessions"),
    ("/workspaces/a//acp", "/workspaces/a%2F/acp"),
    # a relative selector is never the workspace, even one that normalizes to its id
    (f"/workspaces/x/../{WID}/acp", f"/workspaces/x%2F..%2F{WID}/acp"),
    ("/workspaces//srv/ws%2F/acp", "/workspaces/%2Fsrv%2Fws%252F/acp"),
])
def test_any_other_selector_is_the_route_of_another_workspace(mounts: WorkspaceMounts,
                                                              path: str, target: str) -> None:
    assert mounts.of_stray(path) == target
    assert canonical_path(target) == target   # no empty, no dot segment: a route's path


@pytest.mark.parametrize("path", ["/workspaces//acp", "/workspaces//srv/ws/files",
                                  "/workspaces//srv/ws/acp/x", "/session//x", "//workspaces/a/acp",
                                  "/workspace//srv/ws/sessions", "/workspaces/", "/workspaces//"])
def test_other_paths_stay_unknown(mounts: WorkspaceMounts, path: str) -> None:
    assert mounts.of_stray(path) is None


def test_the_singular_prefix_takes_the_path_only(tmp_path: Path) -> None:
    """``by_path``: ``/workspace/{path}/{tail}`` (qwen's listing under its path) is the
    tail's target however the path is spelt; any other selector is the singular route
    itself with it as one segment (an absolute one normalized, so it starts ``%2F``: qwen
    names it in its answer); the id form is the route itself, not an alias."""
    real = tmp_path / "real"
    real.mkdir()
    mounts = WorkspaceMounts(str(real), WID, TARGETS, by_path={"sessions": TARGETS["sessions"]})
    assert mounts.exact[f"/workspace/{real}/sessions"] == TARGETS["sessions"]
    assert f"/workspace/{WID}/sessions" not in mounts.exact
    assert mounts.of_stray(f"/workspace/{real}//sessions/") == TARGETS["sessions"]
    for stray, target in (
            ("/workspace//srv/other/sessions", "/workspace/%2Fsrv%2Fother/sessions"),
            ("/workspace//srv/x/../other//sessions/", "/workspace/%2Fsrv%2Fother/sessions"),
            ("/workspace////sessions", "/workspace/%2F/sessions"),
            ("/workspace/rel//x/sessions", "/workspace/rel%2F%2Fx/sessions"),
            ("/workspace/rel/../x/sessions", "/workspace/rel%2F..%2Fx/sessions"),
            ("/workspace/%2Fx//y/sessions", "/workspace/%252Fx%2F%2Fy/sessions"),
            ("/workspace/../sessions", "/workspace/%2E%2E/sessions")):
        assert mounts.of_stray(stray) == target, stray
        assert canonical_path(target) == target   # a route's path
    assert mounts.of_stray(f"/workspace/{real}/acp") is None   # not a tail of it
