"""A commit's notices (``kind:instance:id,…``) carry any id whole: an id's ``,`` and
``%`` are escaped; and they are split to stay under PostgreSQL's 8,000-byte ``pg_notify``
payload, counted in bytes: ids of non-ASCII characters (a session id is the agent's,
or a client's through an agent that loads any id) take two to four bytes each. Counted
in characters, a commit of enough of them sent a payload PostgreSQL refused ("payload
string too long"): the COMMIT failed, its session notices were held for the next one,
which failed the same way, and the session journal could commit nothing more (every
new session and prompt a 503) until the server stopped. Real PostgreSQL, two stores on
one schema: the commit lands and the other store hears of every session."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from acp_server.store.postgres import PostgresTaskStore
from tests.lmsp import stores

pytestmark = pytest.mark.anyio

# 1 KiB each in UTF-8 (the longest session id there is), half that in characters
IDS = [f"{'é' * 510}{n:04d}" for n in range(24)]


async def test_notices_of_multibyte_ids_stay_under_the_payload_limit(tmp_path: Path) -> None:
    url = stores.postgres_url_or_skip(tmp_path, "noticesize")
    async with PostgresTaskStore(url) as writer, PostgresTaskStore(url) as reader:
        heard: set[str] = set()
        reader.sessions_followed = set(IDS)
        reader.on_sessions = heard.update

        def journaled(conn: Any, out: Any, state: Any) -> None:
            for sid in IDS:   # what a journal commit carrying their events notices
                writer.notice(state, "s", sid)

        await writer._write(journaled)
        assert writer.health.up
        with anyio.fail_after(30):
            while heard != set(IDS):
                await anyio.sleep(0.02)
        await writer._write(lambda conn, out, state: None)   # the next commit lands too


async def test_ids_with_the_payloads_separators_are_heard_whole(tmp_path: Path) -> None:
    # A payload is ``kind:instance:id,id,…``: an id with a comma was heard as two ids
    # (a hand-off asked for session "a,b" never reached its owner), one with ":" must
    # stay whole too, and "%" (the escape) round-trips.
    odd = ["a,b", ",", "c:d", "e%2Cf", "%", "g,%h:"]
    url = stores.postgres_url_or_skip(tmp_path, "noticesep")
    async with PostgresTaskStore(url) as writer, PostgresTaskStore(url) as reader:
        heard: list[str] = []
        reader.sessions_followed = set(odd)
        reader.on_sessions = heard.extend

        def journaled(conn: Any, out: Any, state: Any) -> None:
            for sid in odd:
                writer.notice(state, "s", sid)

        await writer._write(journaled)
        with anyio.fail_after(30):
            while sorted(heard) != sorted(odd):
                assert set(heard) <= set(odd), heard
                await anyio.sleep(0.02)
