"""ACP ``fs/*`` requests served for an agent, confined to the session's workspace.

    content = read_text_file("/ws", {"sessionId": s, "path": "/ws/a.txt", "line": 2, "limit": 10})

A path must resolve (symlinks followed) inside the workspace and hold no NUL byte, else
``RequestError`` (-32602). Only regular files are read or written: a directory, FIFO,
device or socket, a symlink loop or any other OS failure is -32602 with a short message
(opened non-blocking, so a FIFO never holds a worker thread). Reads are capped at
``MAX_READ_BYTES``; writes create missing parent folders.
"""

from __future__ import annotations

import os
import stat
from typing import Any

from bridge.agents.base import INVALID_PARAMS, RESOURCE_NOT_FOUND, RequestError

MAX_READ_BYTES = 16 * 1024 * 1024


def confine(workspace: str, path: Any) -> str:
    if not isinstance(path, str) or not path:
        raise RequestError(INVALID_PARAMS, "`path` must be a non-empty string")
    if "\x00" in path:
        raise RequestError(INVALID_PARAMS, "`path` must not contain a NUL byte")
    root = os.path.realpath(workspace)
    full = os.path.realpath(os.path.join(root, path))
    if full != root and not full.startswith(root + os.sep):
        raise RequestError(INVALID_PARAMS, f"Path is outside the workspace: {path}")
    return full


def _open_regular(full: str, shown: Any, flags: int) -> int:
    """A descriptor on a regular file. ``O_NONBLOCK`` so that a FIFO never blocks the
    worker thread; anything but a regular file is refused (-32602)."""
    try:
        fd = os.open(full, flags | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), 0o666)
    except FileNotFoundError:
        raise RequestError(RESOURCE_NOT_FOUND, f"File not found: {shown}") from None
    except IsADirectoryError:
        raise RequestError(INVALID_PARAMS, f"Not a regular file: {shown} is a directory") from None
    except OSError as exc:   # a symlink loop, a FIFO without reader, permissions, ...
        raise RequestError(INVALID_PARAMS, f"Cannot open {shown}: {exc.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise RequestError(INVALID_PARAMS, f"Not a regular file: {shown}")
    os.set_blocking(fd, True)
    return fd


def read_text_file(workspace: str, params: dict[str, Any]) -> dict[str, Any]:
    shown = params.get("path")
    fd = _open_regular(confine(workspace, shown), shown, os.O_RDONLY)
    with open(fd, encoding="utf-8", errors="replace") as fh:
        if os.fstat(fd).st_size > MAX_READ_BYTES:
            raise RequestError(INVALID_PARAMS, f"File is larger than {MAX_READ_BYTES} bytes")
        text = fh.read()
    line, limit = params.get("line"), params.get("limit")
    if line is not None or limit is not None:
        lines = text.splitlines(keepends=True)
        start = max(int(line) - 1, 0) if isinstance(line, int) else 0
        end = start + int(limit) if isinstance(limit, int) and limit >= 0 else None
        text = "".join(lines[start:end])
    return {"content": text}


def write_text_file(workspace: str, params: dict[str, Any]) -> dict[str, Any]:
    shown = params.get("path")
    full = confine(workspace, shown)
    content = params.get("content")
    if not isinstance(content, str):
        raise RequestError(INVALID_PARAMS, "`content` must be a string")
    try:
        os.makedirs(os.path.dirname(full), exist_ok=True)
    except OSError as exc:
        raise RequestError(INVALID_PARAMS, f"Cannot create the folder of {shown}: "
                                           f"{exc.strerror}") from None
    fd = _open_regular(full, shown, os.O_WRONLY | os.O_CREAT)
    with open(fd, "w", encoding="utf-8") as fh:
        fh.truncate(0)   # only now: a non-regular file was never touched
        fh.write(content)
    return {}
