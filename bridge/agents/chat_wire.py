"""What an OpenAI-compatible server sends the model agent (``bridge.agents.model``):
``chat.completion.chunk`` events, a whole ``chat.completion``, the ``/models`` list.

    chunk = chunk_decoder.decode(data)            # msgspec.DecodeError: not a chunk
    usage = read_usage(chunk.usage)               # Usage | None, whatever its shape

Contracts:

* Only what the agent uses is typed; any other field is ignored. A field of the wrong
  type where it matters (``choices`` neither a list nor null, ``delta.content`` a
  number) is a ``msgspec.ValidationError``.
* A thought is ``reasoning_content`` (vLLM, DeepSeek, LM Studio) or ``reasoning``
  (Ollama, OpenRouter) when a string, in a delta and in a whole message alike; any
  other shape of them is ignored (never a reason to fail).
* Usage is never a reason to fail: ``read_usage`` takes the counts that are integers
  (``prompt_tokens``/``completion_tokens``, else ``input_tokens``/``output_tokens`` as
  mlx-vlm names them; a total missing is their sum), any other value counts 0; a usage
  that is no object is none.
"""

from __future__ import annotations

from typing import Any

import msgspec


class Delta(msgspec.Struct):
    content: str | None = None
    reasoning_content: Any = None   # vLLM, DeepSeek, LM Studio (a string)
    reasoning: Any = None           # Ollama, OpenRouter (a string)

    def thought(self) -> str | None:
        """The reasoning, when a string (another shape is ignored, as before)."""
        for value in (self.reasoning_content, self.reasoning):
            if isinstance(value, str) and value:
                return value
        return None


class Choice(msgspec.Struct):
    delta: Delta | None = None
    finish_reason: str | None = None


class Usage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class Chunk(msgspec.Struct):
    choices: list[Choice] | None = None   # null in some servers' usage chunk
    usage: Any = None   # read_usage: never a reason to fail the turn
    error: Any = None


class WholeChoice(msgspec.Struct):
    message: Delta | None = None   # a whole message has a delta's fields
    finish_reason: str | None = None


class Completion(msgspec.Struct):
    """A whole ``chat.completion``: what a server that ignores ``stream`` answers."""
    choices: list[WholeChoice] = []
    usage: Any = None
    error: Any = None


class Models(msgspec.Struct):
    data: list[Any]


chunk_decoder = msgspec.json.Decoder(Chunk)
completion_decoder = msgspec.json.Decoder(Completion)
models_decoder = msgspec.json.Decoder(Models)


def read_usage(value: Any) -> Usage | None:
    """The counts of a reported usage (see the module contracts)."""
    if not isinstance(value, dict):
        return None

    def count(*keys: str) -> int:
        for key in keys:
            number = value.get(key)
            if isinstance(number, int) and not isinstance(number, bool) and number >= 0:
                return number
        return 0

    prompt = count("prompt_tokens", "input_tokens")
    completion = count("completion_tokens", "output_tokens")
    return Usage(prompt, completion, count("total_tokens") or prompt + completion)


__all__ = ["Choice", "Chunk", "Completion", "Delta", "Models", "Usage", "WholeChoice",
           "chunk_decoder", "completion_decoder", "models_decoder", "read_usage"]
