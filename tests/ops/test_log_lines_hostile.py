"""One rule for what reaches a log line (``bridge.loggable.loggable``), through each
writer of a real ``acp-server serve``: the request log (text and JSON), an agent's
stderr, a start-up line that echoes a path. Readable text stays readable (``café``);
what could forge a line, drive the terminal or reorder what a line shows (CR, LF, ESC,
NUL, bidi overrides and isolates) is escaped."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bridge.loggable import loggable
from tests.harness import ServeProcess

HOSTILE = "café\u202eevil\u2066\r\x1b[31m\x00漢字"
ESCAPED = "café\\u202eevil\\u2066\\r\\x1b[31m\\x00漢字"
RAW = ("\u202e", "\u2066", "\r", "\x1b", "\x00")


def _wait_for(child: ServeProcess, needle: str, timeout: float = 15) -> str:
    """The child's stderr once it holds ``needle`` (polled: a file another process
    writes; no event to wait on)."""
    deadline = time.monotonic() + timeout
    while needle not in (text := child.stderr_text()):
        assert time.monotonic() < deadline, text[-2000:]
        time.sleep(0.02)
    return text


def test_the_rule() -> None:
    assert loggable(HOSTILE) == ESCAPED
    assert loggable("\ud800x") == "\\ud800x"   # a lone surrogate: a JSON line can hold it
    assert loggable("ok é 漢字 🎉") == "ok é 漢字 🎉"
    for c in [*map(chr, range(0x202A, 0x202F)), *map(chr, range(0x2066, 0x206A)),
              "\n", "\x85", "\u2028", "\u2029"]:
        assert loggable(c) != c and loggable(c).isascii(), hex(ord(c))


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_session_id_in_the_request_log(tmp_path: Path, log_format: str) -> None:
    """A path's id as the client chose it: ``é`` was ``\\xe9`` in a text line, and a
    JSON line kept the bidi override raw (a reader's terminal reordered the line)."""
    quoted = "caf%C3%A9%E2%80%AEevil%E2%81%A6%0D%1B%5B31m%00%E6%BC%A2%E5%AD%97"
    with ServeProcess(tmp_path, "--log-format", log_format) as child:
        assert child.http.get(f"/session/{quoted}/status").status_code == 404
        text = _wait_for(child, "/session/{session_id}/status")
    line, = [line for line in text.splitlines() if "/session/{session_id}/status" in line]
    assert not any(c in line for c in RAW), repr(line)
    if log_format == "json":
        assert json.loads(line)["session_id"] == ESCAPED
    else:
        assert line.endswith(" door=rest session=" + ESCAPED), line


def test_an_agents_stderr(tmp_path: Path) -> None:
    script = tmp_path / "noisy_agent.py"
    notification = json.dumps({"jsonrpc": "2.0", "method": HOSTILE + " method?"})
    script.write_text("import sys\n"
                      f"print({notification!r}, flush=True)\n"
                      f"sys.stderr.write({HOSTILE + ' forged?'!r} + '\\n')\n"
                      "sys.stderr.flush()\n")
    with ServeProcess(tmp_path, "--agent", f"{sys.executable} {script}") as child:
        made = child.http.post("/session", json={"sessionScope": "thread"})
        assert made.status_code >= 500, made.text   # it said that much and died
        text = _wait_for(child, "last stderr: ")
    said, died = [line for line in text.splitlines() if " forged?" in line]
    assert said.endswith("] " + ESCAPED + " forged?"), said
    # its death message quotes its last stderr lines: it had them raw
    assert died.endswith("last stderr: " + ESCAPED + " forged?"), died
    # a notification it may not send, named by its method (which it chose): it was raw
    ignored, = [line for line in text.splitlines() if " method?" in line]
    assert ignored.endswith("ignoring notification " + ESCAPED + " method?"), ignored


def test_a_start_up_line_that_names_a_path(tmp_path: Path) -> None:
    """``--state-dir`` of a store another server holds: the refusal names its path, which
    came raw (a newline in it made two lines, the second one the path's to write)."""
    state = "st\u202eate\nFORGED LINE"
    with ServeProcess(tmp_path, state_dir=state) as first:
        second = subprocess.run(ServeProcess(tmp_path, state_dir=state).argv,
                                capture_output=True, text=True, timeout=60)
        assert first.returncode is None
    assert second.returncode == 2, second.stderr
    line, = second.stderr.splitlines()
    assert "is in use by another acp-server serve" in line
    assert "st\\u202eate\\nFORGED LINE" in line and "\u202e" not in line
