"""``bridge.agents.chat_wire``: what is lenient in a chunk (usage, thoughts, a null
``choices``) and what is not (the text)."""

from __future__ import annotations

import msgspec
import pytest

from bridge.agents.chat_wire import Usage, chunk_decoder, read_usage


def test_a_thought_is_a_string_any_other_shape_is_ignored() -> None:
    def thought(delta: bytes) -> str | None:
        return chunk_decoder.decode(b'{"choices": [{"delta": ' + delta + b"}]}") \
            .choices[0].delta.thought()

    assert thought(b'{"reasoning_content": "hm"}') == "hm"
    assert thought(b'{"reasoning": "so"}') == "so"
    assert thought(b'{"reasoning_content": null, "reasoning": "so"}') == "so"
    assert thought(b'{"reasoning": {"effort": "low"}, "content": "x"}') is None
    assert thought(b'{"reasoning": ""}') is None
    with pytest.raises(msgspec.ValidationError):   # the text itself is never guessed
        chunk_decoder.decode(b'{"choices": [{"delta": {"content": 5}}]}')


def test_usage_takes_integer_counts_under_either_name() -> None:
    assert read_usage(None) is None and read_usage([1, 2]) is None
    assert read_usage({"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 9}) \
        == Usage(3, 4, 9)
    assert read_usage({"input_tokens": 3, "output_tokens": 4}) == Usage(3, 4, 7)
    assert read_usage({"prompt_tokens": None, "completion_tokens": True,
                       "total_tokens": "9"}) == Usage(0, 0, 0)
    assert read_usage({"prompt_tokens": -1, "completion_tokens": 2.5}) == Usage(0, 0, 0)
    assert chunk_decoder.decode(b'{"choices": null, "usage": null}').choices is None
