"""An agent's stderr is logged at a bounded rate (``bridge.agents.stderr``), on an
injected clock; and a real agent flooding its stderr costs the log only that."""

from __future__ import annotations

import logging
import sys
import textwrap

import anyio
import pytest

from bridge.agents.stderr import StderrLog
from bridge.agents.stdio import StdioAgentFactory
from tests.bridge.fake_agent_client import FakeClient


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "bridge.agents.stdio.stderr"]


def test_a_burst_then_a_rate_and_the_rest_counted(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    log = StderrLog("[agent x]", burst=3, per_s=2.0, clock=clock)
    with caplog.at_level(logging.INFO, logger="bridge.agents.stdio.stderr"):
        for n in range(10):
            log.line(f"line {n}\n".encode())
        assert logged(caplog) == ["[agent x] line 0", "[agent x] line 1", "[agent x] line 2"]
        clock.t = 1.0   # two more lines' worth
        for n in range(10, 14):
            log.line(f"line {n}\n".encode())
        assert logged(caplog)[3:] == [
            "[agent x] 7 stderr line(s) not logged (more than 2 a second)",
            "[agent x] line 10", "[agent x] line 11"]
        log.close()
        assert logged(caplog)[-1] == "[agent x] 2 stderr line(s) not logged (more than 2 a second)"
        log.close()   # nothing more to say
        assert len(logged(caplog)) == 7
    assert list(log.tail)[-1] == "line 13"   # every line is kept in the tail


@pytest.mark.anyio
async def test_an_agent_flooding_its_stderr(caplog: pytest.LogCaptureFixture) -> None:
    child = textwrap.dedent("""
        import sys
        for n in range(50000):
            sys.stderr.write(f"noise {n}\\n")
        sys.stderr.flush()
        sys.stdin.readline()
    """)
    factory = StdioAgentFactory([sys.executable, "-c", child], name="noisy")
    with caplog.at_level(logging.INFO, logger="bridge.agents.stdio.stderr"):
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                conn = await factory.connect(FakeClient(), tg)
                while not conn.stderr_tail or conn.stderr_tail[-1] != "noise 49999":
                    await anyio.sleep(0.01)
                await conn.aclose()
    lines = logged(caplog)
    assert len(lines) < 1000          # 50,000 written: a burst of 200 and 20 a second
    assert "not logged" in lines[-1]
    suppressed = sum(int(line.split()[3]) for line in lines if "not logged" in line)
    assert suppressed + len(lines) - sum("not logged" in line for line in lines) == 50000


def test_a_line_is_logged_escaped_and_kept_whole(caplog: pytest.LogCaptureFixture) -> None:
    """An agent's stderr line went to the log raw: a CR or an ANSI escape in it forged
    or recoloured the server's log (a terminal's title too); a 64 KB line whole."""
    log = StderrLog("[agent x]", clock=Clock())
    head = "\x1b[31mred\x1b[0m\r2026-12-06 INFO forged\x00"
    raw = head + "y" * 5000
    with caplog.at_level(logging.INFO, logger="bridge.agents.stdio.stderr"):
        log.line(raw.encode() + b"\n")
    (message,) = logged(caplog)
    assert message == ("[agent x] \\x1b[31mred\\x1b[0m\\r2026-12-06 INFO forged\\x00"
                       + "y" * (4096 - len(head)) + "…")
    assert log.tail[-1] == raw   # the death message's tail: the agent's own words
