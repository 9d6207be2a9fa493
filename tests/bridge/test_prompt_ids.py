"""A prompt's id (``bridge.ids.new_prompt_id``): an RFC 9562 version 7 UUID, made
later sorts later (the durable journal's prompts table then grows at its end), unique
within one millisecond and across refills of its pool of random bytes, written as
``uuid.UUID`` writes it; a prompt admitted without an id gets one."""

from __future__ import annotations

import os
import uuid

import pytest

from bridge import Bridge
from bridge.agents.reference import ReferenceAgentFactory
from bridge import ids
from bridge.ids import new_prompt_id


def test_a_version_7_uuid_ordered_by_its_millisecond() -> None:
    ids = [new_prompt_id(ms) for ms in (1, 2, 255, 256, 1_764_662_400_000, (1 << 48) - 1)]
    assert ids == sorted(ids)
    for value in ids:
        parsed = uuid.UUID(value)
        assert (parsed.version, parsed.variant) == (7, uuid.RFC_4122)
        assert str(parsed) == value
    assert int(ids[-2].replace("-", "")[:12], 16) == 1_764_662_400_000
    same = {new_prompt_id(5) for _ in range(1000)}
    assert len(same) == 1000


def test_the_random_bits_come_from_the_os_in_bulk_and_never_twice(monkeypatch) -> None:
    """One ``os.urandom`` call per ``POOL_BYTES // 10`` ids (each call lets go of the
    interpreter lock); three refills' worth of ids in one millisecond are all distinct,
    each exactly what ``uuid.UUID`` writes for the same bits."""
    drawn: list[int] = []
    system = os.urandom

    def urandom(size: int) -> bytes:
        drawn.append(size)
        return system(size)

    monkeypatch.setattr(ids.os, "urandom", urandom)
    ids._pool.forget()
    per_pool = ids.POOL_BYTES // 10
    made = [new_prompt_id(7) for _ in range(3 * per_pool)]
    assert drawn == [ids.POOL_BYTES] * 3
    assert len(set(made)) == len(made)
    for value in made[per_pool - 2:per_pool + 2]:   # across a refill
        parsed = uuid.UUID(value)
        assert str(parsed) == value and (parsed.version, parsed.variant) == (7, uuid.RFC_4122)
        assert parsed.int >> 80 == 7


@pytest.mark.anyio
async def test_an_admitted_prompt_gets_one(tmp_path) -> None:
    async with Bridge(ReferenceAgentFactory(), workspace_cwd=str(tmp_path)) as bridge:
        sid = (await bridge.create_session(cwd=str(tmp_path))).session_id
        first = bridge.send_prompt(sid, [{"type": "text", "text": "one"}])
        second = bridge.send_prompt(sid, [{"type": "text", "text": "two"}])
        assert uuid.UUID(first.prompt_id).version == 7
        await first
        await second
