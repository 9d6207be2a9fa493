"""``acp-server prompt … | head -c 10``, ``acp-server tasks … | head -1`` and ``acp-server
token list … | head -1`` (``audit`` too): the reader of stdout goes before the command
is done. The command ends quietly (no traceback, no
"unexpected error", nothing on stderr) with status 141 (128 + SIGPIPE, as ``git log |
head`` ends), and ``prompt`` first cancels its prompt on the server, as on Ctrl-C: the
person has stopped reading it. A watched task runs on (as on Ctrl-C).

Real child processes whose stdout is a real pipe the test closes; a raw server
(``tests.sdk.rawserver``) that sends the next piece only once the pipe is closed, so the
command meets the closed pipe on its next write, deterministically.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator

import anyio
import pytest
from anyio.abc import Process

from acp_server.client.cli_run import EXIT_PIPE
from tests.sdk.rawserver import Conn, json_answer, raw_server, routes
from tests.terminal import cli_env

pytestmark = pytest.mark.anyio

CEILING = 60
BUDGET = 1000   # pieces the server sends after the pipe closed, at most (one is enough)


def chunk(text: str, event_id: int) -> bytes:
    return (b'data: {"type": "session_update", "id": %d, "promptId": "p-1", "data": '
            b'{"update": {"sessionUpdate": "agent_message_chunk", "content": '
            b'{"type": "text", "text": "%s"}}}}\n\n' % (event_id, text.encode()))


@contextlib.asynccontextmanager
async def child(args: list[str], url: str) -> AsyncIterator[tuple[Process, int]]:
    """``acp-server ARGS --url URL`` with its stdout the write end of a real pipe whose
    read end (yielded) the test reads and closes; killed if it is still running when the
    block ends (a failed test), so it never outlives it."""
    read_end, write_end = os.pipe()
    try:
        process = await anyio.open_process(
            [sys.executable, "-m", "acp_server", *args, "--url", url], env=cli_env(),
            stdin=subprocess.DEVNULL, stdout=write_end)
    finally:
        os.close(write_end)   # the child holds it now: the pipe closes with our read end
    try:
        async with process:
            try:
                yield process, read_end
            finally:
                if process.returncode is None:
                    process.kill()
    finally:
        with contextlib.suppress(OSError):
            os.close(read_end)


async def finish(process: Process) -> tuple[int, str]:
    """Its exit status and stderr, once it has ended."""
    assert process.stderr is not None
    err = b""
    async for piece in process.stderr:
        err += piece
    return await process.wait(), err.decode()


async def run_until_the_reader_goes(args: list[str], table: dict, first: bytes,
                                    reader_gone: anyio.Event) -> tuple[int, str]:
    """Run ``acp-server ARGS``; read its stdout until ``first`` came, close the pipe, set
    ``reader_gone``; its exit status and stderr."""
    async with raw_server(routes(table)) as server, child(args, server.url) as (process, out):
        with anyio.fail_after(CEILING):
            seen = b""
            while first not in seen:
                piece = await anyio.to_thread.run_sync(os.read, out, 4096)
                assert piece, "stdout ended before the first piece"
                seen += piece
            os.close(out)   # the reader goes: `| head -c 10` has had enough
            reader_gone.set()
            return await finish(process)


async def test_a_prompt_whose_reader_goes_ends_quietly_and_is_cancelled() -> None:
    reader_gone, cancelled = anyio.Event(), anyio.Event()

    async def events(conn: Conn) -> None:
        await conn.head()
        await conn.send(chunk("hello ", 1))
        await reader_gone.wait()
        for n in range(BUDGET):   # the command meets the closed pipe on its next write
            if cancelled.is_set() or not await conn.send(chunk("more ", 2 + n)):
                break
            await anyio.sleep(0)
        await conn.until_gone()

    async def cancel(conn: Conn) -> None:
        cancelled.set()
        await conn.answer(204)

    table = {"POST /session/s-1/prompt": json_answer(b'{"promptId": "p-1", "lastEventId": 0}',
                                                     202),
             "POST /session": json_answer(b'{"sessionId": "s-1"}'),
             "GET /session/s-1/events": events,
             "POST /session/s-1/cancel": cancel,
             "DELETE /session/s-1/pending-prompts/": cancel}
    code, err = await run_until_the_reader_goes(["prompt", "hi"], table, b"hello",
                                                reader_gone)
    assert (code, err) == (EXIT_PIPE, "")
    assert cancelled.is_set()   # the prompt did not run on for no one


TASK = b'{"id": "task_%d", "status": "succeeded", "model": "m", "created_at": 1}'


async def test_a_task_listing_whose_reader_goes_ends_quietly() -> None:
    """The listing prints nothing before its answer: the pipe is closed first."""
    reader_gone, asked = anyio.Event(), anyio.Event()

    async def listing(conn: Conn) -> None:
        asked.set()
        await reader_gone.wait()   # answered once the pipe is closed: the write meets it
        page = b'{"data": [' + b", ".join(TASK % n for n in range(50)) + b"]}"
        await conn.answer(200, page)

    code, err = await _closed_before(["tasks", "list"], {"GET /lmsp/v1/tasks": listing},
                                     reader_gone, asked)
    assert (code, err) == (EXIT_PIPE, "")


async def test_a_watched_task_whose_reader_goes_ends_quietly() -> None:
    reader_gone = anyio.Event()

    async def events(conn: Conn) -> None:
        await conn.head()
        await conn.send(b'data: {"type": "response.output_text.delta", "sequence_number": 1, '
                        b'"delta": "first words"}\n\n')
        await reader_gone.wait()
        for n in range(BUDGET):
            if not await conn.send(b'data: {"type": "response.output_text.delta", '
                                   b'"sequence_number": %d, "delta": "more"}\n\n' % (2 + n)):
                break
            await anyio.sleep(0)
        await conn.until_gone()

    table = {"GET /lmsp/v1/tasks/task_1/events": events,
             "GET /lmsp/v1/tasks/": json_answer(b'{"id": "task_1", "status": "running"}')}
    code, err = await run_until_the_reader_goes(["tasks", "watch", "task_1"], table,
                                                b"first words", reader_gone)
    assert (code, err) == (EXIT_PIPE, "task_1  running\n")   # its status line, no more


TOKEN = (b'{"name": "ci-%d", "id": "tok_%d", "scopes": ["read"], '
         b'"createdAt": "2026-01-01T00:00:00Z", "lastUsedAt": null, "expiresAt": null, '
         b'"revokedAt": null}')
RECORD = (b'{"seq": %d, "at": 1700000000.0, "principal": "ci", "action": "session.created", '
          b'"target": "s-1", "client": "127.0.0.1", "detail": {}}')


@pytest.mark.parametrize(("args", "route", "page"), [
    (["token", "list"], "GET /tokens",
     b'{"tokens": [' + b", ".join(TOKEN % (n, n) for n in range(50)) + b"]}"),
    (["audit"], "GET /audit",
     b'{"records": [' + b", ".join(RECORD % n for n in range(50)) + b"]}"),
    (["audit", "--json"], "GET /audit",
     b'{"records": [' + b", ".join(RECORD % n for n in range(50)) + b"]}"),
], ids=["token-list", "audit", "audit-json"])
async def test_a_principals_listing_whose_reader_goes_ends_quietly(
        args: list[str], route: str, page: bytes) -> None:
    """``acp-server token list --url … | head -1``, ``audit``: 141 and nothing said, as
    ``tasks list`` (``cli_run.printed``); the listing meets the closed pipe on its first
    line."""
    reader_gone, asked = anyio.Event(), anyio.Event()

    async def listing(conn: Conn) -> None:
        asked.set()
        await reader_gone.wait()
        await conn.answer(200, page)

    code, err = await _closed_before([*args, "--token", "admin-token"], {route: listing},
                                     reader_gone, asked)
    assert (code, err) == (EXIT_PIPE, "")


async def _closed_before(args: list[str], table: dict, reader_gone: anyio.Event,
                         asked: anyio.Event) -> tuple[int, str]:
    """Run ``acp-server ARGS`` with its stdout's reader gone before the server answers."""
    async with raw_server(routes(table)) as server, child(args, server.url) as (process, out):
        with anyio.fail_after(CEILING):
            os.close(out)
            await asked.wait()
            reader_gone.set()
            return await finish(process)
