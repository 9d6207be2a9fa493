"""ACP ``fs/*`` requests served for an agent, confined to the session's workspace.

    content = read_text_file("/ws", {"sessionId": s, "path": "/ws/a.txt", "line": 2, "limit": 10})

A path must resolve (symlinks followed) inside the workspace, else ``RequestError``
(-32602). Reads are capped at ``MAX_READ_BYTES``; writes create missing parent folders.
"""

from __future__ import annotations

import os
from typing import Any

from bridge.agents.base import INVALID_PARAMS, RESOURCE_NOT_FOUND, RequestError

MAX_READ_BYTES = 16 * 1024 * 1024


def confine(workspace: str, path: Any) -> str:
    if not isinstance(path, str) or not path:
        raise RequestError(INVALID_PARAMS, "`path` must be a non-empty string")
    root = os.path.realpath(workspace)
    full = os.path.realpath(os.path.join(root, path))
    if full != root and not full.startswith(root + os.sep):
        raise RequestError(INVALID_PARAMS, f"Path is outside the workspace: {path}")
    return full


def read_text_file(workspace: str, params: dict[str, Any]) -> dict[str, Any]:
    full = confine(workspace, params.get("path"))
    try:
        if os.path.getsize(full) > MAX_READ_BYTES:
            raise RequestError(INVALID_PARAMS, f"File is larger than {MAX_READ_BYTES} bytes")
        with open(full, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except FileNotFoundError:
        raise RequestError(RESOURCE_NOT_FOUND, f"File not found: {params.get('path')}") from None
    except IsADirectoryError:
        raise RequestError(INVALID_PARAMS, f"Not a file: {params.get('path')}") from None
    line, limit = params.get("line"), params.get("limit")
    if line is not None or limit is not None:
        lines = text.splitlines(keepends=True)
        start = max(int(line) - 1, 0) if isinstance(line, int) else 0
        end = start + int(limit) if isinstance(limit, int) and limit >= 0 else None
        text = "".join(lines[start:end])
    return {"content": text}


def write_text_file(workspace: str, params: dict[str, Any]) -> dict[str, Any]:
    full = confine(workspace, params.get("path"))
    content = params.get("content")
    if not isinstance(content, str):
        raise RequestError(INVALID_PARAMS, "`content` must be a string")
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w", encoding="utf-8") as fh:
        fh.write(content)
    return {}
