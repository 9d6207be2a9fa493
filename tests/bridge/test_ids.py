"""Random ids (``bridge.ids``). A prompt's id (``new_prompt_id``): an RFC 9562 version 7
UUID, made later sorts later (the durable journal's prompts table then grows at its
end), unique within one millisecond and across refills of its pool of random bytes,
written as ``uuid.UUID`` writes it; a prompt admitted without an id gets one. Version
4 UUIDs and random integers from the same pool."""

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


def _count_urandom(monkeypatch) -> list[int]:
    """The sizes of each ``os.urandom`` call the pool makes from now on (emptied first)."""
    drawn: list[int] = []
    system = os.urandom

    def urandom(size: int) -> bytes:
        drawn.append(size)
        return system(size)

    monkeypatch.setattr(ids.os, "urandom", urandom)
    ids._pool.forget()
    return drawn


def test_the_random_bits_come_from_the_os_in_bulk_and_never_twice(monkeypatch) -> None:
    """One ``os.urandom`` call per ``POOL_BYTES // 10`` ids (each call lets go of the
    interpreter lock); three refills' worth of ids in one millisecond are all distinct,
    each exactly what ``uuid.UUID`` writes for the same bits."""
    drawn = _count_urandom(monkeypatch)
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


def test_threads_draw_distinct_ids_of_the_same_form() -> None:
    import threading

    drawn: list[list[str]] = [[] for _ in range(8)]

    def draw(i: int) -> None:
        drawn[i] = [new_prompt_id(9) for _ in range(5000)]

    threads = [threading.Thread(target=draw, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    flat = [x for one in drawn for x in one]
    assert len(set(flat)) == len(flat)
    for value in flat[:50]:
        parsed = uuid.UUID(value)
        assert (parsed.version, parsed.variant) == (7, uuid.RFC_4122) and str(parsed) == value


def test_a_forked_child_draws_its_own_bytes_even_if_the_lock_was_held() -> None:
    """The child never repeats the parent's next ids, and the pool's lock, held by
    another thread at the fork (here: this one), does not deadlock the child."""
    new_prompt_id()   # the pool is full, mostly unused
    read_end, write_end = os.pipe()
    ids._pool._lock.acquire()   # stands for a thread inside take() at the fork
    try:
        pid = os.fork()
        if pid == 0:   # the child: no pytest, no exceptions past this point
            try:
                os.close(read_end)
                os.write(write_end, ",".join(new_prompt_id(3) for _ in range(20)).encode())
            finally:
                os._exit(0)
    finally:
        ids._pool._lock.release()
    os.close(write_end)
    child = os.read(read_end, 1 << 16).decode().split(",")
    os.close(read_end)
    os.waitpid(pid, 0)
    parent = [new_prompt_id(3) for _ in range(20)]
    assert len(child) == 20 and not set(child) & set(parent)


def test_version_4_uuids_and_random_integers_from_the_same_pool(monkeypatch) -> None:
    """``uuid4_str`` writes what ``str(uuid.uuid4())`` writes (version 4, RFC 4122),
    ``random_bits(k)`` stays below ``2**k``; both draw from the pool, one ``os.urandom``
    call for many, never the same bytes twice."""
    drawn = _count_urandom(monkeypatch)
    made = [ids.uuid4_str() for _ in range(ids.POOL_BYTES // 16 * 2)]
    assert drawn == [ids.POOL_BYTES] * 2
    assert len(set(made)) == len(made)
    for value in made[:100]:
        parsed = uuid.UUID(value)
        assert str(parsed) == value and (parsed.version, parsed.variant) == (4, uuid.RFC_4122)
    bits = [ids.random_bits(80) for _ in range(500)]
    assert all(0 <= b < 1 << 80 for b in bits) and len(set(bits)) == 500
    assert max(bits).bit_length() > 70   # the top bits are used
    assert {ids.random_bits(1) for _ in range(200)} == {0, 1}
    assert ids.random_bits(0) == 0 and all(ids.random_bits(3) < 8 for _ in range(100))
