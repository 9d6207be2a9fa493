"""``GET /lmsp/v1/responses/{id}/input_items``: the messages a response was asked with,
as OpenAI's Responses API lists them (the ``openai`` SDK's ``responses.input_items.list``).

    $ curl -s 'localhost:4170/lmsp/v1/responses/resp_…/input_items?order=asc&limit=2'
    {"object":"list","data":[{"id":"msg_…_input_0","type":"message","role":"user",…}],…}

* Each message of the stored request's ``input`` is one item (a string input is one
  ``user`` message); ``instructions`` are not items (as OpenAI). Item ids are the
  response's, ``msg_<ulid>_input_<n>``, stable across reads and instances.
* ``order`` ``desc`` (default, newest first) or ``asc``; ``limit`` 1..100 (default 20);
  ``after`` an item id of this response (the ``last_id`` of a page), else 400.
* Unknown, deleted, expired or ``store: false`` response → 404 ``response_not_found``.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from acp_server.lmsp.conversation import input_messages
from acp_server.lmsp.listing import parse_limit
from acp_server.lmsp.problems import LmspError
from acp_server.lmsp.service import LmspService
from acp_server.lmsp.wire import InputItem, InputItemList, ItemText, decode_any, encode
from acp_server.principals import caller_of


def _invalid(param: str, detail: str) -> LmspError:
    return LmspError("invalid_request", detail, param=param, errors=[])


def input_items(response_id: str, request: bytes) -> list[InputItem]:
    """The items of a stored request, in the order they were sent."""
    stem = "msg_" + response_id.removeprefix("resp_") + "_input_"
    return [InputItem(id=f"{stem}{n}", role=role, content=[ItemText(
                type="output_text" if role == "assistant" else "input_text", text=text)])
            for n, (role, text) in enumerate(input_messages(decode_any(request)))]


async def list_input_items(request: Request, service: LmspService) -> Response:
    query = request.query_params
    limit = parse_limit(query.get("limit"))
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise _invalid("order", "order must be asc or desc.")
    record = await service.get_response(request.path_params["response_id"],
                                        caller=caller_of(request.scope))
    items = input_items(record.response_id, record.request)
    if order == "desc":
        items.reverse()
    after = query.get("after")
    if after is not None:
        ids = [item.id for item in items]
        if after not in ids:
            raise _invalid("after", "after must be an input item id of this response "
                           "(the last_id of a page).")
        items = items[ids.index(after) + 1:]
    page = items[:limit]
    body = InputItemList(data=page, first_id=page[0].id if page else None,
                         last_id=page[-1].id if page else None, has_more=len(items) > limit)
    return Response(encode(body), media_type="application/json")


__all__ = ["input_items", "list_input_items"]
