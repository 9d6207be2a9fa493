"""Request parsing for LMSP: bodies (413/400 with pointers), Idempotency-Key, cursors.

    raw = await read_body(request, limit=1 << 20)        # LmspError 413 / 400
    envelope = parse_task_envelope(decode_json(raw))    # LmspError 400 with errors[]
    key = parse_idempotency_key(request.headers.get("idempotency-key"))

Contracts: every malformed field is reported (``errors`` holds one pointer per
problem, ``param`` names the first); unknown members are ignored; nothing here
touches the store, so failed validation is never recorded (§9.2).

Parse once: the body is decoded once (``decode_json``) and validated; the response
request is then encoded once, canonically (sorted keys: ``ResponseRequest.canonical``).
Those bytes are what the task stores and what the idempotency fingerprint hashes.
Whoever reads a stored request back (the runner, the response objects) decodes it
once into ``StoredRequest``; ``prompt_text`` is the one rule for the text an agent
is sent, at validation and at run time alike.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import msgspec
from starlette.requests import Request

from acp_server.http import body
from acp_server.lmsp.params import check_params
from acp_server.lmsp.problems import LmspError, invalid, pointer_to_param
from acp_server.lmsp.wire import canonical

_any_decoder = msgspec.json.Decoder()

ROLES = ("user", "assistant", "system", "developer")
ON_RESTART = ("fail", "retry", "resume")
_KEY_BARE = re.compile(r"[\x21-\x7e]{1,255}")
_KEY_QUOTED = re.compile(r'"((?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\]){1,255})"')
_DECIMAL = re.compile(r"[0-9]{1,16}")
MAX_CURSOR = 2**53 - 1


@dataclasses.dataclass(frozen=True, slots=True)
class ResponseRequest:
    model: str
    prompt_text: str            # what the agent is sent (and counted as input tokens)
    metadata: dict[str, str]
    stream: bool
    canonical: bytes            # the request, encoded once with sorted keys (stored)
    background: bool = False    # answer at once; the work outlives the connection
    store: bool = True          # retrievable by id (GET /responses/{id})
    previous_response_id: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class TaskEnvelope:
    request: ResponseRequest
    on_restart: str


async def read_body(request: Request, *, limit: int) -> bytes:
    try:
        return await body.read_body(request, limit=limit)
    except body.BodyTooLarge:
        raise LmspError("payload_too_large", f"The body exceeds {limit} bytes.",
                        limit=limit) from None


def decode_json(raw: bytes) -> Any:
    if not raw.strip():
        raise invalid("", "The request body is empty; a JSON object is required.", param="body")
    try:
        return body.decode_json(raw, _any_decoder)
    except body.BodyError as exc:
        raise invalid("", f"The request body is refused: {exc.message}.", param="body") from None
    except msgspec.ValidationError as exc:   # valid JSON: a number no float or int holds
        raise invalid("", f"The request body is refused: {exc}.", param="body") from None
    except msgspec.DecodeError as exc:
        raise invalid("", f"The request body is not valid JSON: {exc}.", param="body") from None


TASK_SHAPE = '{"type": "response", "input": {"model": …, "input": …}}'


def _required(pointer: str, what: str) -> str:
    """The detail of a missing member: its name, that it is required, and what it is
    (the problem's ``detail`` is its first error's: it must say what is missing)."""
    return f"{pointer_to_param(pointer)!r} is required: {what}."


def _check_content(content: Any, pointer: str, errors: list[tuple[str, str]]) -> None:
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        errors.append((pointer, "Must be a string or an array of input_text parts."))
        return
    for j, part in enumerate(content):
        where = f"{pointer}/{j}"
        if not isinstance(part, dict) or part.get("type") != "input_text":
            errors.append((f"{where}/type", "Must be 'input_text'."))
        elif not isinstance(part.get("text"), str):
            errors.append((f"{where}/text", "Must be a string."))


def _check_response_request(body: Any, base: str, errors: list[tuple[str, str]],
                            refusals: list[LmspError]) -> ResponseRequest | None:
    if not isinstance(body, dict):
        errors.append((base, "Must be a JSON object (the response request)."))
        return None
    model = body.get("model")
    if "model" not in body:
        errors.append((f"{base}/model", _required(f"{base}/model", "the model to run (GET "
                                                  "/lmsp/v1/capabilities lists them)")))
    elif not isinstance(model, str) or not model:
        errors.append((f"{base}/model", "Must be a non-empty string."))
    value = body.get("input")
    if "input" not in body:
        errors.append((f"{base}/input", _required(f"{base}/input", "a string, or an array of "
                                                  "input items")))
    elif isinstance(value, str):
        pass
    elif isinstance(value, list) and value:
        for i, item in enumerate(value):
            where = f"{base}/input/{i}"
            if not isinstance(item, dict):
                errors.append((where, "Must be an input item object."))
                continue
            if item.get("type", "message") != "message":
                errors.append((f"{where}/type", "Must be 'message'."))
            if item.get("role") not in ROLES:
                errors.append((f"{where}/role", f"Must be one of {', '.join(ROLES)}."))
            if "content" not in item:
                errors.append((f"{where}/content", _required(
                    f"{where}/content", "a string or an array of input_text parts")))
            else:
                _check_content(item["content"], f"{where}/content", errors)
    else:
        errors.append((f"{base}/input", "Must be a string or a non-empty array of input items."))
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        errors.append((f"{base}/instructions", "Must be a string."))
    tokens = body.get("max_output_tokens")
    if tokens is not None and (not isinstance(tokens, int) or isinstance(tokens, bool)
                               or tokens < 1):
        errors.append((f"{base}/max_output_tokens", "Must be a positive integer."))
    metadata = body.get("metadata")
    if metadata is not None and not (isinstance(metadata, dict) and all(
            isinstance(v, str) for v in metadata.values())):
        errors.append((f"{base}/metadata", "Must be an object of string values."))
    for flag in ("stream", "background", "store"):
        value = body.get(flag)
        if value is not None and not isinstance(value, bool):
            errors.append((f"{base}/{flag}", "Must be a boolean."))
    previous = body.get("previous_response_id")
    if previous is not None and (not isinstance(previous, str) or not previous):
        errors.append((f"{base}/previous_response_id", "Must be a non-empty string."))
    refusal = check_params(body, base, errors)
    if refusal is not None:
        refusals.append(refusal)
    if errors:
        return None
    return ResponseRequest(model=model, prompt_text=prompt_text(value, instructions),
                           metadata=dict(metadata or {}), stream=bool(body.get("stream")),
                           canonical=canonical(body), background=body.get("background") is True,
                           store=body.get("store") is not False,
                           previous_response_id=previous)


class StoredRequest(msgspec.Struct, kw_only=True):
    """A stored (validated) response request, decoded once by those who read it back."""

    model: str = ""
    input: str | list[Any] = ""
    instructions: str | None = None
    max_output_tokens: int | None = None
    metadata: dict[str, str] | None = None
    background: bool | None = None
    store: bool | None = None
    previous_response_id: str | None = None

    @property
    def prompt_text(self) -> str:
        return prompt_text(self.input, self.instructions)


_stored_decoder = msgspec.json.Decoder(StoredRequest)


def decode_stored(data: bytes) -> StoredRequest:
    """The stored request bytes of a task (validated when they were accepted)."""
    try:
        return _stored_decoder.decode(data)
    except msgspec.ValidationError:   # not one of ours: read what is there, loosely
        body = _any_decoder.decode(data)
        return StoredRequest(input=body.get("input", "") if isinstance(body, dict) else "")


def prompt_text(value: Any, instructions: Any) -> str:
    """The text an agent is sent: the input's text (a string, or each message's content
    string or text parts), one line per text, then the instructions."""
    texts: list[str] = []
    if isinstance(value, str):
        texts.append(value)
    elif isinstance(value, list):
        for item in value:
            content = item.get("content") if isinstance(item, dict) else None
            if isinstance(content, str):
                texts.append(content)
            elif isinstance(content, list):
                texts.extend(part["text"] for part in content
                             if isinstance(part, dict) and isinstance(part.get("text"), str))
    if isinstance(instructions, str) and instructions:
        texts.append(instructions)
    return "\n".join(texts)


def _raise(errors: list[tuple[str, str]], refusals: list[LmspError]) -> None:
    """A malformed request is 400 ``invalid_request``; a well-formed one asking for what
    cannot be honoured, 400 ``unsupported_capability`` (``acp_server.lmsp.params``)."""
    if errors:
        (pointer, detail), *more = errors
        raise invalid(pointer, detail, *more)
    if refusals:
        raise refusals[0]


def parse_response_request(body: Any) -> ResponseRequest:
    errors: list[tuple[str, str]] = []
    refusals: list[LmspError] = []
    parsed = _check_response_request(body, "", errors, refusals)
    if parsed is not None and parsed.background and not parsed.store:
        errors.append(("/store", "Background responses must be stored: 'background: true' "
                                 "needs 'store' true or absent."))
    _raise(errors, refusals)
    assert parsed is not None
    return parsed


def parse_task_envelope(body: Any) -> TaskEnvelope:
    errors: list[tuple[str, str]] = []
    refusals: list[LmspError] = []
    if not isinstance(body, dict):
        raise invalid("", "The body must be a JSON object (a task envelope).", param="body")
    if "type" not in body:
        looks = " (this body looks like a response request: send it as the task's " \
                "'input')" if "model" in body else ""
        errors.append(("/type", _required("/type", f"a task body is {TASK_SHAPE}{looks}")))
    elif body["type"] != "response":
        errors.append(("/type", "Unknown task type; 'response' is the only type in 1.0."))
    parsed = None
    if "input" not in body:
        errors.append(("/input", _required("/input", "the response request to run, "
                                                     '{"model": …, "input": …}')))
    else:
        parsed = _check_response_request(body["input"], "/input", errors, refusals)
    on_restart = body.get("on_restart", "fail")
    if on_restart not in ON_RESTART:
        errors.append(("/on_restart", "Must be one of fail, retry, resume."))
    _raise(errors, refusals)
    assert parsed is not None
    return TaskEnvelope(request=parsed, on_restart=on_restart)


def parse_idempotency_key(value: str | None) -> str | None:
    """1–255 visible ASCII characters, bare or as an sf-string (§9.2)."""
    if value is None:
        return None
    quoted = _KEY_QUOTED.fullmatch(value)
    if quoted is not None:
        return re.sub(r'\\(["\\])', r"\1", quoted.group(1))
    if _KEY_BARE.fullmatch(value) and '"' not in value:
        return value
    raise LmspError("invalid_request", "Idempotency-Key must be 1-255 visible ASCII "
                    "characters, bare or as a quoted string.", param="Idempotency-Key",
                    errors=[])


def parse_cursor(request: Request) -> tuple[int, str] | None:
    """``Last-Event-ID`` (wins) or ``starting_after``: events after N (§6.4).
    Returns (N, the parameter it came from)."""
    for name, value in (("Last-Event-ID", request.headers.get("last-event-id")),
                        ("starting_after", request.query_params.get("starting_after"))):
        if value is None:
            continue
        value = value.strip()
        if not _DECIMAL.fullmatch(value) or int(value) > MAX_CURSOR:
            raise LmspError("invalid_request", f"{name} must be a non-negative integer.",
                            param=name, errors=[])
        return int(value), name
    return None
