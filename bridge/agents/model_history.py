"""A model agent session's conversation as it is sent upstream, and a prompt's text.

    trim(history, max_messages=200, max_chars=16 << 20)   # in place
    prompt_text([{"type": "text", "text": "hi"}])          # "hi"
    context_exceeded("answered 400: ... (code context_length_exceeded)")   # True

``context_exceeded`` tells, from what a model server said, that the conversation sent
passed the model's context window: llama.cpp (``exceeds the available context size``,
``exceed_context_size_error``), OpenAI (``context_length_exceeded``), vLLM and others
(``maximum context length``).
"""

from __future__ import annotations

import re
from typing import Any

_CONTEXT = re.compile(
    r"context_length_exceeded|exceed_context_size|exceeds? the available context"
    r"|maximum context length|context (?:length|window|size) (?:is )?exceeded"
    r"|prompt is too long", re.IGNORECASE)


def context_exceeded(cause: str) -> bool:
    """Whether a model server's error (its text) says the conversation is over the
    model's context window."""
    return _CONTEXT.search(cause) is not None


def trim(history: list[dict[str, str]], max_messages: int, max_chars: int) -> None:
    """Make ``history`` what a chat template takes: roles alternating, a user message
    first (messages of one role in a row are one, joined by a blank line: a prompt that
    got no reply goes with the next; an assistant message first is dropped). Then drop
    the oldest messages past ``max_messages`` or ``max_chars`` in all; the newest
    message stays, whatever its size. Messages are replaced, never changed in place (a
    fork shares them)."""
    joined: list[dict[str, str]] = []
    for message in history:
        if not joined and message["role"] != "user":
            continue
        if joined and joined[-1]["role"] == message["role"]:
            parts = [p for p in (joined[-1]["content"], message["content"]) if p]
            joined[-1] = {"role": message["role"], "content": "\n\n".join(parts)}
        else:
            joined.append(message)
    if not joined and history:   # only an assistant message (a reply whose prompt went)
        joined = history[-1:]
    del joined[:-max_messages]
    total = sum(len(message["content"]) for message in joined)
    drop = 0
    while drop < len(joined) - 1 and (total > max_chars or joined[drop]["role"] != "user"):
        total -= len(joined[drop]["content"])
        drop += 1
    history[:] = joined[drop:]


def prompt_text(prompt: Any) -> str:
    """The text of a prompt's blocks: text, the text of embedded resources, resource
    links as Markdown links."""
    parts = []
    for block in prompt if isinstance(prompt, list) else ():
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            parts.append(block["text"])
        elif block.get("type") == "resource":
            resource = block.get("resource")
            if isinstance(resource, dict) and isinstance(resource.get("text"), str):
                parts.append(resource["text"])
        elif block.get("type") == "resource_link" and isinstance(block.get("uri"), str):
            name = block.get("name")   # every ACP agent takes links: the model sees one
            parts.append(f"[{name if isinstance(name, str) and name else block['uri']}]"
                         f"({block['uri']})")
    return "\n".join(parts)
