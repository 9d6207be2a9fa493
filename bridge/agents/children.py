"""A record of the agent processes a server started, so that none outlives it.

    registry = ChildRegistry("/var/lib/acp-server")
    registry.reap_stale()            # at start-up: kill what killed earlier runs left
    registry.record(pid, argv)       # after spawning (the child leads its own group)
    registry.forget(pid)             # after reaping it
    registry.close()                 # on a clean exit

Each server records its children in ``agents-<server pid>.json`` in the folder, so
servers sharing the folder leave each other alone: ``reap_stale`` only looks at the
files of servers that are no longer running. A stale child is killed only when
``/proc/<pid>/cmdline`` still shows the recorded command line (a reused pid is left
alone); its whole process group gets SIGKILL. A file is rewritten atomically on every
change and holds at most ``MAX_ENTRIES``.

The record is a safety net, not a condition of running an agent: when it cannot be
written (the state folder's disk full, the folder gone or read-only) ``record`` and
``forget`` log a warning and return; the entries stay in memory and the next change
writes them all. The folder itself (the state folder) is never created here, only
``agents/`` inside it: a state folder renamed away is not made anew under its name.
"""

from __future__ import annotations

import json
import logging
import os
import signal
from collections.abc import Sequence

logger = logging.getLogger(__name__)
MAX_ENTRIES = 1024


class ChildRegistry:
    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.path = os.path.join(directory, f"agents-{os.getpid()}.json")
        self._entries: dict[int, list[str]] = {}

    def record(self, pid: int, argv: Sequence[str]) -> None:
        self._entries[pid] = list(argv)
        while len(self._entries) > MAX_ENTRIES:
            del self._entries[next(iter(self._entries))]
        self._save()

    def forget(self, pid: int) -> None:
        if self._entries.pop(pid, None) is not None:
            self._save()

    def close(self) -> None:
        """Remove this server's record (on a clean exit, once its children are reaped)."""
        self._entries.clear()
        try:
            os.remove(self.path)
        except OSError:
            pass

    def reap_stale(self) -> list[int]:
        """Kill the still-running children recorded by servers that are gone; returns
        their pids. Their records are removed."""
        killed = []
        try:
            names = os.listdir(self.directory)
        except OSError:
            return killed
        for name in names:
            owner = name[len("agents-"):-len(".json")]
            if not (name.startswith("agents-") and name.endswith(".json") and owner.isdigit()):
                continue
            if int(owner) != os.getpid() and _alive(int(owner)):
                continue
            path = os.path.join(self.directory, name)
            killed += self._reap_file(path)
            try:
                os.remove(path)
            except OSError:
                pass
        return killed

    def _reap_file(self, path: str) -> list[int]:
        killed = []
        for pid, argv in _load(path).items():
            if _cmdline(pid) == argv:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    continue
                except PermissionError:
                    logger.warning("stale agent pid=%s: not allowed to kill it", pid)
                    continue
                logger.warning("killed stale agent pid=%s from a previous run: %s", pid,
                               " ".join(argv))
                killed.append(pid)
        return killed

    def _save(self) -> None:
        temporary = f"{self.path}.{os.getpid()}.tmp"
        try:
            try:
                os.mkdir(self.directory, 0o700)
            except FileExistsError:
                pass
            with open(temporary, "w", encoding="utf-8") as fh:
                json.dump({str(pid): argv for pid, argv in self._entries.items()}, fh)
            os.replace(temporary, self.path)
        except OSError as exc:
            logger.warning("cannot record agent processes in %s (%s): a crash now would "
                           "leave them running", self.path, exc)
            try:
                os.remove(temporary)
            except OSError:
                pass


def _load(path: str) -> dict[int, list[str]]:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {int(pid): argv for pid, argv in data.items()
            if str(pid).isdigit() and isinstance(argv, list)}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _cmdline(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    return [part.decode("utf-8", "replace") for part in raw.split(b"\0") if part] or None
