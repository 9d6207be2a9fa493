"""``acp_server.lmsp.service``'s ids: a ULID in Crockford base32."""

from __future__ import annotations

import random
import time

from acp_server.lmsp.service import crockford, new_id

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def _value(text: str) -> int:
    value = 0
    for char in text:
        value = value << 5 | _CROCKFORD.index(char)
    return value


def test_crockford_writes_every_bit_of_128_most_significant_first() -> None:
    values = [0, 1, 31, 32, 1023, 1024, (1 << 128) - 1, 1 << 127, 0x8000_0000_0000_0000_0000,
              *(random.getrandbits(128) for _ in range(2000)),
              *(1 << bit for bit in range(128))]
    for value in values:
        text = crockford(value)
        assert len(text) == 26 and set(text) <= set(_CROCKFORD), text
        assert _value(text) == value, (value, text)
    assert crockford(0) == "0" * 26
    assert crockford((1 << 128) - 1) == "7" + "Z" * 25


def test_new_id_is_the_prefix_and_a_ulid_of_the_time_in_ms() -> None:
    before = time.time_ns() // 1_000_000
    task_id = new_id("task")
    after = time.time_ns() // 1_000_000
    prefix, _, ulid = task_id.partition("_")
    assert prefix == "task" and len(ulid) == 26
    assert before <= _value(ulid) >> 80 <= after
    assert len({new_id("resp") for _ in range(1000)}) == 1000
