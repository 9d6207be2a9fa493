"""Request logs: one line per request (route template, status, duration, door, ids),
stream open/close with events sent, text and JSON, never a token or a body; and
``acp-server serve --log-format json`` end to end in a child process."""

from __future__ import annotations

import io
import json
import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pytest

from acp_server.ops.request_log import JsonFormatter, configure_logging, count_events
from tests.ops.test_metrics import daemon, run_task
from tests.rest.server import text_prompt
from tests.harness import ServeProcess

TOKEN = "tok-never-logged"
SECRET_TEXT = "body-never-logged"


@pytest.fixture
def access() -> Iterator[io.StringIO]:
    """The access log as JSON lines, for the test."""
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("acp_server.access")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield buffer
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def records(buffer: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in buffer.getvalue().splitlines()]


@pytest.mark.anyio
async def test_one_line_per_request_with_template_door_and_ids(
        tmp_path: Path, access: io.StringIO) -> None:
    async with daemon(tmp_path, token=TOKEN) as (client, _bridge, _app):
        auth = {"Authorization": f"Bearer {TOKEN}"}
        sid = (await client.post("/session", json={}, headers=auth)).json()["sessionId"]
        prompt = await client.post(f"/session/{sid}/prompt?x={SECRET_TEXT}",
                                   json=text_prompt(SECRET_TEXT), headers=auth)
        assert prompt.status_code == 202
        assert (await client.get(f"/session/{sid}/status")).status_code == 401
        assert (await client.get("/no/such/route", headers=auth)).status_code == 404
        client.headers.update(auth)
        task_id = await run_task(client)
    lines = records(access)
    text = access.getvalue()
    assert TOKEN not in text and SECRET_TEXT not in text
    requests = [r for r in lines if r["kind"] == "request"]
    first = requests[0]
    assert {k: first[k] for k in ("method", "route", "status", "door")} == {
        "method": "POST", "route": "/session", "status": 200, "door": "rest"}
    assert first["duration_ms"] >= 0 and first["logger"] == "acp_server.access"
    assert {k: requests[1][k] for k in ("route", "status", "session_id")} == {
        "route": "/session/{session_id}/prompt", "status": 202, "session_id": sid}
    assert {k: requests[2][k] for k in ("route", "status", "session_id")} == {
        "route": "/session/{session_id}/status", "status": 401, "session_id": sid}
    assert (requests[3]["route"], requests[3]["status"]) == ("unmatched", 404)
    assert not any("/no/such" in json.dumps(r) for r in lines)
    task_lines = [r for r in lines if r.get("task_id") == task_id]
    assert [(r["kind"], r["route"]) for r in task_lines] == [
        ("stream_open", "/lmsp/v1/tasks/{task_id}/events"),
        ("stream_close", "/lmsp/v1/tasks/{task_id}/events"),
        ("request", "/lmsp/v1/tasks/{task_id}")]
    opened, closed = task_lines[0], task_lines[1]
    assert "duration_ms" not in opened and opened["door"] == "lmsp"
    assert closed["status"] == 200 and closed["duration_ms"] >= 0
    assert closed["events"] >= 4   # created, in_progress, …, completed


@pytest.mark.anyio
async def test_a_rest_stream_counts_its_events(tmp_path: Path, access: io.StringIO) -> None:
    async with daemon(tmp_path) as (client, _bridge, _app):
        sid = (await client.post("/session", json={})).json()["sessionId"]
        assert (await client.post(f"/session/{sid}/prompt",
                                  json=text_prompt("/chunks 3 x"))).status_code == 202
        seen = 0
        with anyio.fail_after(10):
            async with client.stream("GET", f"/session/{sid}/events",
                                     headers={"Last-Event-ID": "0"}) as stream:
                async for line in stream.aiter_lines():
                    seen += line.startswith("data:")
                    if line.startswith("event: turn_complete"):
                        break
    # the server logs the close once it sees the client go; wait for that line
    with anyio.fail_after(30):
        while not any(r["kind"] == "stream_close" for r in records(access)):
            await anyio.sleep(0.01)
    closed = next(r for r in records(access) if r["kind"] == "stream_close")
    assert closed["route"] == "/session/{session_id}/events" and closed["session_id"] == sid
    assert seen >= 4 and closed["events"] >= seen + 1   # + turn_complete itself


@pytest.mark.anyio
async def test_a_client_chosen_id_cannot_forge_a_line(tmp_path: Path) -> None:
    from acp_server.ops import request_log

    buffer = io.StringIO()
    configure_logging("text", stream=buffer)
    try:
        async with daemon(tmp_path) as (client, _bridge, _app):
            forged = "x%0A2026-01-01 00:00:00,000 INFO acp_server.access: GET fake 200"
            assert (await client.get(f"/session/{forged}/status")).status_code == 404
            long = "y" * 5000
            assert (await client.get(f"/session/{long}/status")).status_code == 404
        assert request_log.access_writer is not None
        request_log.access_writer.flush()
    finally:
        request_log.unconfigure_access_writer()
        logging.basicConfig(force=True)
    lines = [line for line in buffer.getvalue().splitlines()
             if line.split(" ")[2:4] == ["INFO", "acp_server.access:"]]
    assert len(lines) == 2   # one per request: the %0A did not start another
    assert "session=x\\n2026-01-01" in lines[0]
    assert lines[1].endswith("door=rest session=" + "y" * 128 + "…")


@pytest.mark.anyio
async def test_a_json_line_keeps_a_client_chosen_id_as_short_as_a_text_line(
        tmp_path: Path, access: io.StringIO) -> None:
    async with daemon(tmp_path) as (client, _bridge, _app):
        assert (await client.get(f"/session/{'y' * 5000}/status")).status_code == 404
    line, = [r for r in records(access) if r.get("route") == "/session/{session_id}/status"]
    assert line["session_id"] == "y" * 128 + "…"


def test_count_events_skips_comments_and_retry() -> None:
    assert count_events(b"retry: 3000\n\n") == 0
    assert count_events(b": heartbeat\n\n") == 0
    assert count_events(b"id: 1\nevent: a\ndata: {}\n\n: hb\n\nid: 2\ndata: x\n\n") == 2
    assert count_events(b"data: {\"t\":\"retry: 1\\n\\n\"}\n\n") == 1


FIELDS = {"kind": "request", "method": "GET", "route": "/session/{session_id}/status",
          "status": 404, "door": "rest", "duration_ms": 0.5, "session_id": "abc"}
TEXT_LINE = "INFO acp_server.access: GET /session/{session_id}/status 404 0.50ms door=rest session=abc"


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_the_cli_writer_and_the_logger_write_the_same_lines(log_format: str) -> None:
    from acp_server.ops import request_log

    through_logger, through_writer = io.StringIO(), io.StringIO()
    configure_logging(log_format, stream=through_logger)
    request_log.unconfigure_access_writer()
    try:
        logging.getLogger("acp_server.access").info(
            "%s", request_log._Line(FIELDS), extra={"access": FIELDS})
        configure_logging(log_format, stream=through_writer)
        assert request_log.access_writer is not None
        request_log.access_writer.write(FIELDS)
        request_log.access_writer.flush()
    finally:
        request_log.unconfigure_access_writer()
        logging.basicConfig(force=True)   # pytest's capture again, no stream of ours
    a, b = through_logger.getvalue(), through_writer.getvalue()
    assert a.count("\n") == b.count("\n") == 1
    if log_format == "text":
        assert a.strip().endswith(TEXT_LINE) and b.strip().endswith(TEXT_LINE)
        assert len(a) == len(b)   # the same time stamp format
    else:
        one, two = json.loads(a), json.loads(b)
        stamps = one.pop("ts"), two.pop("ts")
        assert all(len(t) == 24 and t.endswith("Z") for t in stamps)
        assert one == two and one["route"] == FIELDS["route"] and one["level"] == "INFO"


def test_serve_logs_json_lines(tmp_path: Path) -> None:
    with ServeProcess(tmp_path, "--log-format", "json") as child:
        assert child.http.get("/health").status_code == 200
    lines = [json.loads(line) for line in child.stderr_text().splitlines() if line.strip()]
    health = [r for r in lines if r.get("route") == "/health"]
    assert len(health) == 1 and health[0]["status"] == 200 and health[0]["door"] == "rest"
    assert all({"ts", "level", "logger", "message"} <= r.keys() for r in lines)
    assert any(r["logger"] == "acp_server" and r["level"] == "WARNING" for r in lines)


def test_an_unknown_log_format_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    from acp_server.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["serve", "--log-format", "xml"])
    assert exited.value.code == 2
    assert "--log-format" in capsys.readouterr().err


class _StuckStream:
    """A log stream whose writes wait until ``release`` (a pipe nobody reads)."""

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()
        self.text = ""

    def write(self, text: str) -> None:
        self.entered.set()
        assert self.release.wait(10)
        self.text += text

    def flush(self) -> None:
        pass


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_stuck_stream_bounds_the_queue_and_the_next_write_counts_the_drops(
        log_format: str) -> None:
    from acp_server.ops.request_log import AccessWriter

    stream = _StuckStream()
    writer = AccessWriter(stream, log_format)
    writer.MAX_QUEUED = 4
    try:
        writer.write(FIELDS)
        assert stream.entered.wait(10)            # the writer thread is stuck in write
        for _ in range(10):
            writer.write(FIELDS)
        assert len(writer.queue) == 4 and writer.dropped == 6
    finally:
        stream.release.set()
        writer.close()                            # a clean stop writes what is queued
    lines = stream.text.splitlines()
    assert len(lines) == 1 + 1 + 4
    assert "6 access lines dropped" in lines[1]
    if log_format == "json":
        assert json.loads(lines[1])["dropped"] == 6
        assert all(json.loads(line)["route"] == FIELDS["route"] for line in lines[2:])
    else:
        assert " WARNING acp_server.access: 6 access lines dropped" in lines[1]
        assert all(line.endswith(TEXT_LINE.split("INFO ", 1)[1].split(": ", 1)[1])
                   for line in lines[2:])


def test_the_writers_one_call_line_is_text_line_with_its_prefix() -> None:
    """``AccessWriter.text`` (the request path's call) writes what ``text_line`` does,
    its shortcut for a plain request line included (the second of each pair)."""
    from acp_server.ops.request_log import AccessWriter, text_line

    cases = [("request", "POST", "/session/{session_id}/prompt", 503, 0.123, "rest", "s1",
              None, None),
             ("request", "GET", "/session/{session_id}/status", 404, 1.0, "rest",
              "x\n2026-01-01 00:00:00,000 INFO forged", None, None),
             ("request", "GET", "/session/{session_id}/status", 404, 2.5, "rest", "z" * 300,
              None, None),
             ("request", "GET", "/lmsp/v1/tasks/{task_id}", 200, 0.5, "lmsp", None, "t1", None),
             ("stream_open", "GET", "/session/{session_id}/events", 200, None, "rest", "s2",
              None, None),
             ("stream_close", "GET", "/session/{session_id}/events", 200, 9.0, "rest", "s2",
              None, 7)]
    stream = io.StringIO()
    writer = AccessWriter(stream, "text")
    try:
        for case in cases:
            writer.text(*case)
            writer.text(*case)
    finally:
        writer.close()   # everything queued is written
    queued = stream.getvalue().splitlines()
    expected = [text_line(*case) for case in cases for _ in range(2)]
    assert [line.split("acp_server.access: ", 1)[1] for line in queued] == expected
    assert all(line.split(" ")[2:4] == ["INFO", "acp_server.access:"] for line in queued)


def test_the_session_part_memo_is_bounded_in_entries_and_bytes() -> None:
    """``_SESSION_PARTS`` (both formats' text line) keeps ids up to ``MAX_ID_CHARS``
    and is cleared when full; a longer id (a client's, refused or not) is formatted
    each time: long distinct ids do not grow it."""
    import tracemalloc

    from acp_server.ops import request_log as r

    r._SESSION_PARTS.clear()
    for i in range(r._MAX_SESSION_PARTS):
        assert r._session_part(f"s{i}") == f" session=s{i}"
    assert len(r._SESSION_PARTS) == r._MAX_SESSION_PARTS
    assert r._session_part("next") == " session=next" and len(r._SESSION_PARTS) == 1
    long = "x" * (r.MAX_ID_CHARS + 1)
    assert r._session_part(long) == " session=" + "x" * r.MAX_ID_CHARS + "…"
    assert long not in r._SESSION_PARTS
    writer = r.AccessWriter(io.StringIO(), "text")
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(r._MAX_SESSION_PARTS):
            session_id = f"{i:06d}{'a' * 60_000}"
            writer.text("request", "POST", "/session/{session_id}/prompt", 414, 0.1, "rest",
                        session_id, None, None)
            r.text_line("request", "POST", "/session/{session_id}/prompt", 414, 0.1, "rest",
                        session_id, None, None)
            writer.queue.clear()   # the lines themselves are bounded by MAX_QUEUED
        grown = tracemalloc.get_traced_memory()[0] - before
        kept = [key for key in r._SESSION_PARTS if len(key) > r.MAX_ID_CHARS]
    finally:
        tracemalloc.stop()
        writer.close()
        r._SESSION_PARTS.clear()
    assert kept == []   # none of the long ids memoized
    # kept, they would be ~245 MB; the bound leaves room for what the worker's other
    # threads allocate meanwhile (tracemalloc traces them all: 65,752 bytes seen in CI)
    assert grown < 1 << 20, grown


def test_a_flush_that_fails_does_not_end_the_writer(caplog: pytest.LogCaptureFixture) -> None:
    """A bug in one flush (here: the stream raising what it never should) is logged, and
    the writer's thread goes on writing the lines that come after it."""
    from acp_server.ops.request_log import AccessWriter

    class Once(io.StringIO):
        failed = False

        def write(self, text: str) -> int:
            if not self.failed:
                self.failed = True
                raise RuntimeError("a bug")
            return super().write(text)

    def until(condition: Callable[[], bool]) -> None:
        for _ in range(2000):   # the guard: 20 s
            if condition():
                return
            assert writer._thread.is_alive(), "the writer's thread ended"
            threading.Event().wait(0.01)
        raise AssertionError("not within 20 s")

    stream = Once()
    with caplog.at_level(logging.ERROR):
        writer = AccessWriter(stream, "text")
        try:
            writer.queue.append("first")
            until(lambda: stream.failed)
            writer.queue.append("second")
            until(lambda: "second" in stream.getvalue())
        finally:
            writer.close()
    assert "a flush failed" in caplog.text
