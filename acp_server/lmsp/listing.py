"""``GET /lmsp/v1/tasks``: the tasks of the caller, newest first, a page at a time.

    $ curl -s 'localhost:4170/lmsp/v1/tasks?limit=2&status=running'
    {"object":"list","data":[{"id":"task_01J…","object":"task","status":"running",
      "model":"reference","usage":null,…}],"first_id":"task_01J…","last_id":"task_01J…",
     "has_more":true}
    $ curl -s 'localhost:4170/lmsp/v1/tasks?after=task_01J…'     # the next page

Contracts:

* Only the caller's tasks (its principal's; every principal's for an admin or with
  ``--share-sessions``), in creation order reversed; tasks past the task retention
  window are left out, as ``GET /tasks/{id}`` answers 404 for them.
* ``limit`` 1..100 (default 20; ASCII digits, leading zeros or not, of any length);
  ``after`` is the ``last_id`` of the previous page: the page holds the tasks created
  before it. An ``after`` that names no task of the caller (deleted or purged since,
  or never the caller's) still pages: its id is a ULID, so the page holds the tasks
  whose ids sort before it (a task created within the same few milliseconds may be
  shown twice or not at all). ``status`` is one task status. A malformed parameter
  is a 400 ``invalid_request`` problem naming it.
* Each item is the task object (§7.1) plus ``model``, ``input_text`` (the text the
  agent is sent, cut to ``INPUT_PREVIEW_CHARS``) and ``usage`` (the final response's
  usage, ``null`` until the task has ended).
"""

from __future__ import annotations

import re

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from acp_server.lmsp.problems import LmspError
from acp_server.lmsp.requests import decode_stored
from acp_server.lmsp.service import LmspService
from acp_server.principals import caller_of
from acp_server.store.tasks import TaskRecord
from acp_server.lmsp.wire import TaskList, TaskSummary, decode_response, encode

DEFAULT_LIMIT = 20
MAX_LIMIT = 100
INPUT_PREVIEW_CHARS = 500
STATUSES = ("queued", "loading", "running", "cancelling", "succeeded", "failed", "cancelled")
_TASK_ID = re.compile(r"^task_[0-9A-Z]{26}$")


def _invalid(param: str, detail: str) -> LmspError:
    return LmspError("invalid_request", detail, param=param, errors=[])


def parse_limit(raw_limit: str | None) -> int:
    """``limit``: 1..``MAX_LIMIT``, ``DEFAULT_LIMIT`` when absent; else 400."""
    if raw_limit is None:
        return DEFAULT_LIMIT
    # digits only, and few of them: int() refuses more than 4300 digits (ValueError)
    digits = raw_limit.lstrip("0")
    if not (raw_limit.isascii() and raw_limit.isdigit()) or len(digits) > 3 or \
            not 1 <= int(digits or "0") <= MAX_LIMIT:
        raise _invalid("limit", f"limit must be an integer from 1 to {MAX_LIMIT}.")
    return int(digits)


def parse_query(request: Request) -> tuple[int, str | None, str | None]:
    query = request.query_params
    limit = parse_limit(query.get("limit"))
    status = query.get("status")
    if status is not None and status not in STATUSES:
        raise _invalid("status", f"status must be one of {', '.join(STATUSES)}.")
    after = query.get("after")
    if after is not None and not _TASK_ID.fullmatch(after):
        raise _invalid("after", "after must be a task id (the last_id of a page).")
    return limit, status, after


def summary(service: LmspService, record: TaskRecord) -> TaskSummary:
    task = service.task_object(record)
    usage = None
    if record.response is not None:
        try:
            usage = decode_response(record.response).usage
        except msgspec.DecodeError:   # not a response object: no usage to show
            usage = None
    try:
        text = decode_stored(record.request).prompt_text
    except msgspec.DecodeError:
        text = ""
    if len(text) > INPUT_PREVIEW_CHARS:
        text = text[:INPUT_PREVIEW_CHARS - 1] + "…"
    return TaskSummary(**{f: getattr(task, f) for f in task.__struct_fields__},
                       model=record.model, input_text=text, usage=usage)


async def list_tasks(request: Request, service: LmspService) -> Response:
    limit, status, after = parse_query(request)
    caller = caller_of(request.scope)
    # an admin (or --share-sessions) lists every principal's tasks
    principal = None if caller.sees(None) else caller.name
    by_id = False
    if after is not None:   # an anchor gone since (deleted, purged) or not the caller's
        anchor = await service.store.get_task(after)   # is a place in time: its id's
        by_id = anchor is None or not caller.sees(anchor.principal)
    now = service.config.clock()
    records = await service.store.list_tasks(   # tasks past retention are left out
        principal, status=status, after=after, limit=limit + 1,
        finished_since=now - service.config.task_retention_s, after_by_id=by_id)
    page = records[:limit]
    items = [summary(service, r) for r in page]
    body = TaskList(data=items, first_id=page[0].id if page else None,
                    last_id=page[-1].id if page else None, has_more=len(records) > limit)
    return Response(encode(body), status_code=200, media_type="application/json")
