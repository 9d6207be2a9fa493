"""Run ``acp-server`` as a person does: in a terminal (a pty) or with pipes.

    with Terminal("prompt", "/permission may I", "--url", url, columns=100) as term:
        term.expect(r"Choose 1-3")
        term.send("2\\n")
        assert term.finish() == 0 and "allow_always" in term.text

    done = piped("tasks", "list", "--url", url)     # stdin, stdout, stderr are pipes

Both run this checkout (``PYTHONPATH``) without the caller's ``ACP_SERVER_TOKEN``.
Every wait is a condition with a ceiling (``timeout``), never a sleep.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
from pathlib import Path
from types import TracebackType

ROOT = Path(__file__).resolve().parents[1]
CEILING_S = 60.0
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")


def cli_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ACP_SERVER_TOKEN", "ACP_SERVER_URL")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def piped(*args: str, stdin: str = "", timeout: float = CEILING_S
          ) -> subprocess.CompletedProcess[str]:
    """``acp-server ARGS`` with pipes only (no terminal anywhere)."""
    return subprocess.run([sys.executable, "-m", "acp_server", *args], input=stdin,
                          capture_output=True, text=True, env=cli_env(), timeout=timeout)


class Terminal:
    """``acp-server ARGS`` with stdin, stdout and stderr on one pty of the given size."""

    def __init__(self, *args: str, columns: int = 100, rows: int = 40) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        env = {**cli_env(), "COLUMNS": str(columns), "LINES": str(rows), "TERM": "xterm"}
        env.pop("NO_COLOR", None)
        self.proc = subprocess.Popen([sys.executable, "-m", "acp_server", *args], stdin=slave,
                                     stdout=slave, stderr=slave, env=env, close_fds=True,
                                     start_new_session=True)
        os.close(slave)
        self.master = master
        self.raw = b""

    def __enter__(self) -> Terminal:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        os.close(self.master)

    @property
    def text(self) -> str:
        """What was shown, without escape sequences and carriage returns."""
        return _ANSI.sub("", self.raw.decode(errors="replace"))

    def _read(self, timeout: float) -> bool:
        """Read what is there; False at the end of output."""
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            raise AssertionError(f"no output for {timeout} s; shown so far:\n{self.text}")
        try:
            chunk = os.read(self.master, 65536)
        except OSError:   # EIO: every writer has gone
            return False
        self.raw += chunk
        return bool(chunk)

    def expect(self, pattern: str, timeout: float = CEILING_S) -> re.Match[str]:
        while True:
            found = re.search(pattern, self.text)
            if found:
                return found
            if not self._read(timeout):
                raise AssertionError(f"{pattern!r} never shown; shown:\n{self.text}")

    def send(self, text: str) -> None:
        os.write(self.master, text.encode())

    def finish(self, timeout: float = CEILING_S) -> int:
        """Read to the end of output; the exit status."""
        while self._read(timeout):
            pass
        return self.proc.wait(timeout=timeout)
