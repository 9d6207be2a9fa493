"""Strict checks of LMSP answers against the ``openai`` SDK's pydantic types (the SDK
itself builds its objects without validating them, so a missing required member or an
unknown one would pass unseen).

    response = strict_response(json.loads(raw_body))   # the SDK's Response, validated
    event = strict_event(json.loads(sse_data))         # a ResponseStreamEvent, validated
"""

from __future__ import annotations

from typing import Any

from openai.types.responses import Response, ResponseStreamEvent
from pydantic import BaseModel, TypeAdapter

EXTRA_OK = {"store"}   # in OpenAI's response objects, not in the SDK's type
_events = TypeAdapter(ResponseStreamEvent)


def _unknown(model: Any, where: str = "") -> list[str]:
    """The members of ``model`` (recursively) its SDK type does not declare."""
    found: list[str] = []
    if isinstance(model, BaseModel):
        found += [f"{where}.{name}" for name in (model.model_extra or {})]
        for name in type(model).model_fields:
            found += _unknown(getattr(model, name), f"{where}.{name}")
    elif isinstance(model, list):
        for i, item in enumerate(model):
            found += _unknown(item, f"{where}[{i}]")
    return found


def _sdk_codes(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with its ``error.code`` one the SDK's literal lists: ours are LMSP's and
    the docs' (``server_restarted``, ``agent_error``, …; docs/lmsp.md), which the SDK
    reads as any string (it does not validate what it receives)."""
    if isinstance(raw.get("error"), dict):
        assert isinstance(raw["error"]["code"], str) and raw["error"]["code"]
        raw = {**raw, "error": {**raw["error"], "code": "server_error"}}
    return raw


def strict_response(raw: dict[str, Any]) -> Response:
    """``raw`` validated by the SDK's ``Response`` (every required member, every
    type), with nothing it does not know but ``EXTRA_OK``."""
    response = Response.model_validate(_sdk_codes(raw))
    assert _unknown(response) == [f".{name}" for name in EXTRA_OK if name in raw], raw
    if response.error is not None:
        response.error.code = raw["error"]["code"]  # type: ignore[assignment]
    return response


def strict_event(raw: dict[str, Any]) -> Any:
    """``raw`` validated as one of the SDK's stream events (``response.cancelled``, not
    one of them, as its ``response``), with nothing it does not know but ``EXTRA_OK``."""
    if raw["type"] == "response.cancelled":   # not in the SDK's union (docs/lmsp.md)
        assert set(raw) == {"type", "sequence_number", "response"}
        strict_response(raw["response"])
        return raw
    if "response" in raw:
        raw = {**raw, "response": _sdk_codes(raw["response"])}
    event = _events.validate_python(raw)
    unknown = _unknown(event)
    assert unknown == [".response.store"] if "response" in raw else unknown == [], unknown
    return event
