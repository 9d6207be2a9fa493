"""A stable instance identity for a shared (PostgreSQL) store, kept in the state dir.

    identity = claim_identity("/var/lib/acp-server", "postgresql://db/acp")
    identity.instance          # the same id as the previous run with this state dir
    identity.release()         # at close (the process exit also releases it)

Contracts: the id lives in ``<state_dir>/lmsp-instance-<store digest>[.<n>]`` and is
held under an exclusive ``flock`` for the life of the store, so two live processes
never share one: a second process on the same state dir takes the next free slot
(``.1``, ``.2``, … up to ``MAX_SLOTS``, else a fresh unsaved id). A restarted
instance therefore gets its old id back and recovers its own running tasks at
start-up, before listening, instead of waiting for their leases to expire.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import logging
import os
import re
import secrets
import urllib.parse

log = logging.getLogger("acp_server.lmsp")

MAX_SLOTS = 16
_ID = re.compile(r"[0-9a-f]{12}")


@dataclasses.dataclass
class InstanceIdentity:
    instance: str
    path: str | None
    fd: int | None

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)   # drops the lock
            self.fd = None


def _digest(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    safe = f"{parts.scheme}://{parts.username or ''}@{host}:{parts.port or ''}{parts.path}" \
        f"?{parts.query}"   # no password in what is hashed
    return hashlib.sha256(safe.encode()).hexdigest()[:12]


def claim_identity(state_dir: str, url: str) -> InstanceIdentity:
    os.makedirs(state_dir, exist_ok=True)
    base = os.path.join(state_dir, f"lmsp-instance-{_digest(url)}")
    for slot in range(MAX_SLOTS):
        path = base if slot == 0 else f"{base}.{slot}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue   # a live process holds this one
        text = os.read(fd, 64).decode("ascii", "replace").strip()
        if not _ID.fullmatch(text):
            text = secrets.token_hex(6)
            os.ftruncate(fd, 0)
            os.pwrite(fd, text.encode() + b"\n", 0)
            os.fsync(fd)
        return InstanceIdentity(text, path, fd)
    log.warning("lmsp: every instance slot of %s is held; using a fresh identity", state_dir)
    return InstanceIdentity(secrets.token_hex(6), None, None)
