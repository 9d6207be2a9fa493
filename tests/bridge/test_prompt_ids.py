"""A prompt's id (``bridge.session.new_prompt_id``): an RFC 9562 version 7 UUID, made
later sorts later (the durable journal's prompts table then grows at its end), unique
within one millisecond; a prompt admitted without an id gets one."""

from __future__ import annotations

import uuid

import pytest

from bridge import Bridge
from bridge.agents.reference import ReferenceAgentFactory
from bridge.session import new_prompt_id


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


@pytest.mark.anyio
async def test_an_admitted_prompt_gets_one(tmp_path) -> None:
    async with Bridge(ReferenceAgentFactory(), workspace_cwd=str(tmp_path)) as bridge:
        sid = (await bridge.create_session(cwd=str(tmp_path))).session_id
        first = bridge.send_prompt(sid, [{"type": "text", "text": "one"}])
        second = bridge.send_prompt(sid, [{"type": "text", "text": "two"}])
        assert uuid.UUID(first.prompt_id).version == 7
        await first
        await second
