"""A flood of refused requests writes a bounded number of request log lines: per cause
(status, route, door), the first ``lines`` of a window, then one summary that counts
the rest exactly (``acp_server.ops.refusals``), on an injected clock; and a real
``acp-server serve`` answering 10,000 refused requests."""

from __future__ import annotations

import io
import logging
import re
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from acp_server.ops import request_log as r
from acp_server.ops.refusals import RefusalLog, Summary
from tests.harness import ServeProcess

UNMATCHED = (404, "unmatched", "rest")


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_window_logs_its_first_lines_and_counts_the_rest() -> None:
    clock = Clock()
    log = RefusalLog(lines=3, window_s=10, clock=clock)
    assert [log.admit(UNMATCHED) for _ in range(5)] == [True] * 3 + [False] * 2
    assert log.admit((401, "/session", "rest"))   # another cause: its own window
    clock.t += 9.9
    assert log.due() == [] and not log.admit(UNMATCHED)
    clock.t += 0.1   # over: said once, with the exact count
    assert log.due() == [Summary(UNMATCHED, 3, 10.0)] and log.due() == []
    assert log.admit(UNMATCHED)   # a new window


def test_the_next_request_of_a_cause_closes_its_window_and_shutdown_closes_all() -> None:
    clock = Clock()
    log = RefusalLog(lines=1, window_s=10, clock=clock)
    log.admit(UNMATCHED), log.admit(UNMATCHED), log.admit((429, "/session", "rest"))
    log.admit((429, "/session", "rest"))
    clock.t += 12
    assert log.admit(UNMATCHED)
    clock.t += 1
    assert log.due(final=True) == [Summary(UNMATCHED, 1, 10.0),
                                   Summary((429, "/session", "rest"), 1, 10.0)]
    assert log.due(final=True) == []


def test_causes_past_the_cap_share_one() -> None:
    log = RefusalLog(lines=1, window_s=10, clock=Clock(), max_causes=2)
    for n in range(6):
        log.admit((404 + n % 3, "x", "rest"))
    summaries = log.due(final=True)
    assert sum(s.count for s in summaries) == 6 - 3 and summaries[-1].cause[0] == 0


def test_a_window_that_is_over_holds_no_room_under_the_cap() -> None:
    """Windows were only dropped by ``due`` once one had a count, so causes refused a
    few times (never a flood) stayed for the process's life: past ``max_causes`` of
    them, every new cause was logged and summarised as "other causes"."""
    clock = Clock()
    log = RefusalLog(lines=1, window_s=10, clock=clock, max_causes=2)
    a, b, cause = (404, "a", "rest"), (404, "b", "rest"), (401, "/session", "rest")
    assert [log.admit(a), log.admit(a), log.admit(b)] == [True, False, True]
    clock.t += 60   # both over; nothing asked ``due`` since
    assert [log.admit(cause) for _ in range(3)] == [True, False, False]
    assert log.due() == [Summary(a, 1, 10.0)]   # the swept window's count, said once
    clock.t += 1
    assert log.due(final=True) == [Summary(cause, 2, 1.0)]


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_the_recorder_bounds_refused_lines_and_not_the_others(log_format: str) -> None:
    clock = Clock()
    recorder = r.AccessRecorder(router_of=lambda: None,  # type: ignore[arg-type,return-value]
                                refusals=RefusalLog(lines=5, window_s=10, clock=clock))
    stream = io.StringIO()
    writer = r.AccessWriter(stream, log_format)
    old, r.access_writer = r.access_writer, writer
    try:
        route = type("Route", (), {"path": "/health"})()
        for n in range(1000):
            recorder.done("rest", {"method": "GET", "route": route, "path": "/health"},
                          401 if n % 2 else 200, 0.001, None)
        clock.t += 10   # the window is over: the writer's next write says so
        writer.flush()
        said = stream.getvalue()
        recorder.close()   # nothing left to say
    finally:
        r.access_writer = old
        writer.close()
    lines = stream.getvalue().splitlines()
    assert said == stream.getvalue()
    assert sum(" 200 " in line or '"status":200' in line for line in lines) == 500
    refused = [line for line in lines if " 401 " in line or '"status":401' in line]
    assert len(refused) == 6, refused   # 5 and the summary
    assert "WARNING" in refused[-1]
    assert "… and 495 more refused 401 /health door=rest in the last 10.0 s" in refused[-1]


def test_recorders_made_and_closed_while_the_writer_runs_do_not_stop_it() -> None:
    """The writer's thread copied a ``WeakSet`` of the recorders' refusal logs on each
    write while the loop added and removed them: "Set changed size during iteration"
    ended the thread, and no access line was written again. Many recorders (the copy
    takes a while) and one made and closed after another until the writes are done."""
    router_of: Any = lambda: None  # noqa: E731
    many = [r.AccessRecorder(router_of=router_of) for _ in range(50_000)]
    writer = r.AccessWriter(io.StringIO(), "text")
    failed: list[BaseException] = []

    def writes() -> None:
        try:
            for _ in range(4):
                writer.flush()
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=writes)
    thread.start()
    try:
        while thread.is_alive():
            r.AccessRecorder(router_of=router_of).close()
    finally:
        thread.join()
        writer.close()
        for recorder in many:
            recorder.close()
    assert failed == []


def test_a_summary_written_by_the_writer_thread_does_not_tear_the_loops_time_stamp(
        ) -> None:
    """The writer's thread (a summary, a "dropped" line) and the loop (every line's
    prefix) share the formatted second. It was two attributes set one after the other:
    between the two, the other thread took the new second with the old text (a line
    stamped a second early, or with no date at all on the first line). The writer's
    thread is stopped right after its first attribute store, and the loop formats a
    time in that same second."""
    paused, go = threading.Event(), threading.Event()

    class Paused(r.AccessWriter):
        def __setattr__(self, name: str, value: Any) -> None:
            super().__setattr__(name, value)
            if threading.current_thread().name == "summary" and not paused.is_set():
                paused.set()
                go.wait(timeout=30)

    writer = Paused(io.StringIO(), "text")
    second = 1_800_000_000.0
    thread = threading.Thread(target=writer._asctime, name="summary", args=(second + 0.25,))
    try:
        thread.start()   # as ``summary`` formats its time
        assert paused.wait(timeout=30)
        stamp = writer._asctime(second + 0.5)   # as the loop's next line does
    finally:
        go.set()
        thread.join()
        writer.close()
    assert stamp == time.strftime("%Y-%m-%d %H:%M:%S,500", time.localtime(second)), stamp


def _refused_lines(log: str, status: int, route: str) -> tuple[int, list[int]]:
    lines = log.splitlines()
    logged = sum(f"acp_server.access: GET {route} {status} " in line for line in lines)
    counted = [int(m.group(1)) for line in lines if (m := re.search(
        rf"… and (\d+) more refused {status} {re.escape(route)} door=rest", line))]
    return logged, counted


@pytest.mark.parametrize(("flags", "head", "status", "route"), [
    ((), "GET /no/such/path HTTP/1.1\r\nHost: 127.0.0.1", 404, "unmatched"),
    (("--token", "t0k"), "GET /session/s1/status HTTP/1.1\r\nHost: 127.0.0.1", 401,
     "/session/{session_id}/status"),
    ((), "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: http://evil.example", 403,
     "/health"),
], ids=["404", "401", "origin"])
def test_a_real_server_logs_ten_thousand_refusals_in_few_lines(
        tmp_path: Path, flags: tuple[str, ...], head: str, status: int, route: str) -> None:
    """10,000 refused requests, pipelined on 4 connections: a handful of lines and a
    summary that counts the rest exactly (written at the latest when the server stops)."""
    total, per_connection = 10_000, 2_500
    request = (head + "\r\n\r\n").encode()
    answer = f"HTTP/1.1 {status}".encode()
    with ServeProcess(tmp_path, *flags) as child:
        connections = [socket.create_connection(("127.0.0.1", child.port), timeout=60)
                       for _ in range(4)]
        for sock in connections:
            sock.sendall(request * per_connection)
        for sock in connections:
            seen = b""
            while seen.count(answer) < per_connection:
                chunk = sock.recv(1 << 20)
                assert chunk, (seen.count(answer), seen[-300:])
                seen += chunk
            sock.close()
    logged, counted = _refused_lines(child.stderr_text(), status, route)
    assert logged + sum(counted) == total, (logged, counted)
    assert 1 <= len(counted) and logged <= 20 * len(counted) + 20, (logged, counted)


def test_without_the_writer_the_logger_gets_the_summary(
        caplog: pytest.LogCaptureFixture) -> None:
    """An embedding application (no ``configure_logging``): the lines and the summary go
    through the ``acp_server.access`` logger, the summary when the cause's next request
    finds its window over."""
    clock = Clock()
    recorder = r.AccessRecorder(router_of=lambda: None,  # type: ignore[arg-type,return-value]
                                refusals=RefusalLog(lines=2, window_s=10, clock=clock))
    route = type("Route", (), {"path": "/session"})()
    scope = {"method": "POST", "route": route, "path": "/session"}
    assert r.access_writer is None
    with caplog.at_level(logging.INFO, logger="acp_server.access"):
        for _ in range(7):
            recorder.done("rest", scope, 429, 0.001, None)
        clock.t += 10
        recorder.done("rest", scope, 429, 0.001, None)
    messages = [(rec.levelname, rec.getMessage()) for rec in caplog.records
                if rec.name == "acp_server.access"]
    assert len(messages) == 4 and messages[-2] == (
        "WARNING", "… and 5 more refused 429 /session door=rest in the last 10.0 s "
                   "(not logged)")
    assert caplog.records[-2].access["count"] == 5   # type: ignore[attr-defined]
