"""The OpenAI Responses request parameters beyond LMSP §6.1: checked, refused when they
cannot be honoured, and repeated in the response object as they were applied.

    errors: list[tuple[str, str]] = []
    refusal = check_params(body, "/input", errors)   # bad types → ``errors`` (400)
    if refusal: raise refusal                        # 400 unsupported_capability
    fields = echoed_params(stored_request_bytes)     # [(name, value)] for ResponseObject

Per parameter (docs/lmsp.md, "Request parameters"):

* repeated as given: ``store``, ``parallel_tool_calls``, ``truncation``,
  ``text.verbosity`` (a hint, as at OpenAI), ``user``, ``safety_identifier``,
  ``prompt_cache_key`` (nothing is cached; it changes nothing);
* accepted only as no-ops (refused otherwise, 400 ``unsupported_capability`` naming
  the ``param``): ``tools`` (``[]``), ``tool_choice`` (``auto`` / ``none``: with no
  function tools they mean the same), ``text.format`` (``{"type": "text"}``),
  ``top_logprobs`` (``0``), ``max_tool_calls`` /
  ``reasoning.effort`` / ``reasoning.summary`` (``null``), ``conversation`` and
  ``prompt`` (absent: no conversation objects, no prompt templates): the agents behind the
  server choose their own sampling and run their own tools, so a value here would
  be silently ignored and the caller misled (a limit on tool calls that is not kept,
  a ``json_schema`` that is not followed, functions never called);
* ``temperature`` / ``top_p``: any number in OpenAI's range is accepted and not applied
  (echoed ``null``): clients send them by default whatever the model, and a refusal
  would lock them out; the ``null`` says what was applied;
* ``service_tier``: any of OpenAI's values is accepted; the response says
  ``default``, the tier it was served with (as OpenAI's does).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from acp_server.lmsp.problems import LmspError, pointer_to_param
from acp_server.lmsp.wire import TextConfig

_TIERS = ("auto", "default", "flex", "scale", "priority")
_STRINGS = ("user", "safety_identifier", "prompt_cache_key")
_NULL_ONLY = {
    "max_tool_calls": ("tools", "an agent runs its own tools and takes no limit on them"),
}
# Sampling: accepted and not applied (echoed ``null``): the agents choose their own, and
# many clients send a temperature whatever the model (LangChain, LlamaIndex), so a refusal
# would lock them out for a value OpenAI itself treats as a hint to a model.
_SAMPLING = {"temperature": 2.0, "top_p": 1.0}
_ABSENT_ONLY = {
    "conversation": ("conversations", "there are no conversation objects here; continue "
                     "a response with 'previous_response_id'"),
    "prompt": ("prompt_templates", "there are no stored prompt templates here"),
}
_ERRORS = list[tuple[str, str]]


def _refuse(pointer: str, capability: str, why: str) -> LmspError:
    param = pointer_to_param(pointer)
    return LmspError("unsupported_capability", f"{param!r} is not supported: {why}; "
                     "leave it out.", capability=capability, param=param)


def _check_text(value: Any, where: str, errors: _ERRORS) -> LmspError | None:
    if not isinstance(value, dict):
        errors.append((where, "Must be an object."))
        return None
    verbosity = value.get("verbosity")
    if verbosity is not None and verbosity not in ("low", "medium", "high"):
        errors.append((f"{where}/verbosity", "Must be one of low, medium, high."))
    fmt = value.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
        errors.append((f"{where}/format", "Must be an object with a 'type'."))
    elif fmt["type"] != "text":
        return _refuse(f"{where}/format", "structured_output", "the agents answer in "
                       "plain text, so a format other than {\"type\": \"text\"} would not "
                       "be followed")
    return None


def _check_reasoning(value: Any, where: str, errors: _ERRORS) -> LmspError | None:
    if not isinstance(value, dict):
        errors.append((where, "Must be an object."))
        return None
    for name in ("effort", "summary", "generate_summary"):
        if value.get(name) is not None:
            return _refuse(f"{where}/{name}", "reasoning", "an agent reasons as it does "
                           "and writes no summaries of it")
    return None


def check_params(body: dict[str, Any], base: str, errors: _ERRORS) -> LmspError | None:
    """Malformed parameters go to ``errors``; the first one that is well formed but
    cannot be honoured is returned (raise it once ``errors`` is empty)."""
    refusals: list[LmspError] = []

    def refuse(found: LmspError | None) -> None:
        if found is not None:
            refusals.append(found)

    for name in _STRINGS:
        if body.get(name) is not None and not isinstance(body[name], str):
            errors.append((f"{base}/{name}", "Must be a string."))
    if body.get("parallel_tool_calls") is not None and \
            not isinstance(body["parallel_tool_calls"], bool):
        errors.append((f"{base}/parallel_tool_calls", "Must be a boolean."))
    truncation = body.get("truncation")
    if truncation is not None and truncation not in ("auto", "disabled"):
        errors.append((f"{base}/truncation", "Must be 'auto' or 'disabled'."))
    tier = body.get("service_tier")
    if tier is not None and tier not in _TIERS:
        errors.append((f"{base}/service_tier", f"Must be one of {', '.join(_TIERS)}."))
    for name, most in _SAMPLING.items():
        value = body.get(name)
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)
                                  or not 0 <= value <= most):
            errors.append((f"{base}/{name}", f"Must be a number from 0 to {most:g}."))
    for name, (capability, why) in _NULL_ONLY.items():
        value = body.get(name)
        if value is None:
            continue
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            errors.append((f"{base}/{name}", "Must be a number."))
        else:
            refuse(_refuse(f"{base}/{name}", capability, why))
    logprobs = body.get("top_logprobs")
    if logprobs is not None:
        if not isinstance(logprobs, int) or isinstance(logprobs, bool) or logprobs < 0:
            errors.append((f"{base}/top_logprobs", "Must be a non-negative integer."))
        elif logprobs:
            refuse(_refuse(f"{base}/top_logprobs", "logprobs", "no agent reports "
                           "log probabilities"))
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            errors.append((f"{base}/tools", "Must be an array."))
        elif tools:
            refuse(_refuse(f"{base}/tools", "tools", "an agent runs its own tools and "
                           "cannot call the caller's"))
    choice = body.get("tool_choice")
    if choice is not None and choice not in ("auto", "none"):
        if isinstance(choice, (str, dict)):
            refuse(_refuse(f"{base}/tool_choice", "tools", "there are no function tools "
                           "to choose ('auto' and 'none' are accepted)"))
        else:
            errors.append((f"{base}/tool_choice", "Must be a string or an object."))
    for name, (capability, why) in _ABSENT_ONLY.items():
        if body.get(name) is not None:
            refuse(_refuse(f"{base}/{name}", capability, why))
    if body.get("text") is not None:
        refuse(_check_text(body["text"], f"{base}/text", errors))
    if body.get("reasoning") is not None:
        refuse(_check_reasoning(body["reasoning"], f"{base}/reasoning", errors))
    return refusals[0] if refusals else None


class _Text(msgspec.Struct):
    verbosity: Literal["low", "medium", "high"] | None = None


class _Echo(msgspec.Struct):
    """The parameters a stored (validated) request repeats in its response."""

    store: bool | None = None
    parallel_tool_calls: bool | None = None
    tool_choice: Literal["auto", "none"] | None = None   # (others refused)
    truncation: Literal["auto", "disabled"] | None = None
    text: _Text | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None


_echo_decoder = msgspec.json.Decoder(_Echo)
ECHO_NAMES = (b'"store"', b'"parallel_tool_calls"', b'"tool_choice"', b'"truncation"',
              b'"text"', b'"user"', b'"safety_identifier"', b'"prompt_cache_key"')


def echoed_params(request: bytes) -> list[tuple[str, Any]]:
    """(member, value) of the response object for what the request set."""
    try:
        echo = _echo_decoder.decode(request)
    except msgspec.ValidationError:   # not one of ours (validated before this change)
        return []
    fields: list[tuple[str, Any]] = []
    for name in ("store", "parallel_tool_calls", "tool_choice", "truncation", "user",
                 "safety_identifier", "prompt_cache_key"):
        value = getattr(echo, name)
        if value is not None:
            fields.append((name, value))
    if echo.text is not None and echo.text.verbosity is not None:
        fields.append(("text", TextConfig(verbosity=echo.text.verbosity)))
    return fields
