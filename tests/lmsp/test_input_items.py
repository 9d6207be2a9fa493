"""``GET /responses/{id}/input_items`` through the ``openai`` SDK's
``responses.input_items.list`` (acp_server.lmsp.input_items), on both stores."""

from __future__ import annotations

import openai
import pytest

from tests.lmsp.server import LmspServer
from tests.lmsp.test_background import client_of

pytestmark = pytest.mark.anyio

ASKED = [{"role": "system", "content": "terse"},
         {"role": "user", "content": [{"type": "input_text", "text": "first"}]},
         {"role": "assistant", "content": "an answer"},
         {"role": "user", "content": "second"}]


async def test_input_items_in_both_orders_a_page_at_a_time(server: LmspServer) -> None:
    async with client_of(server) as client:
        done = await client.responses.create(model="reference", input=ASKED,  # type: ignore[arg-type]
                                             instructions="not an item")
        page = await client.responses.input_items.list(done.id)
        texts = [(item.role, item.content[0].text) for item in page.data]  # type: ignore[union-attr]
        assert texts == [("user", "second"), ("assistant", "an answer"), ("user", "first"),
                         ("system", "terse")]
        assert page.data[1].content[0].type == "output_text"  # type: ignore[union-attr]
        assert page.has_more is False and page.first_id == page.data[0].id
        walked = [item.id async for item in client.responses.input_items.list(
            done.id, order="asc", limit=1)]          # the SDK follows last_id / has_more
        assert walked == [item.id for item in reversed(page.data)]
        assert len(set(walked)) == 4
        one = await client.responses.create(model="reference", input="just this")
        only = await client.responses.input_items.list(one.id)
        assert [(i.role, i.content[0].text) for i in only.data] == [  # type: ignore[union-attr]
            ("user", "just this")]


async def test_input_items_errors(server: LmspServer) -> None:
    async with client_of(server) as client:
        with pytest.raises(openai.NotFoundError) as caught:
            await client.responses.input_items.list("resp_nope")
        assert caught.value.code == "response_not_found"
        done = await client.responses.create(model="reference", input="x", store=False)
        with pytest.raises(openai.NotFoundError):
            await client.responses.input_items.list(done.id)
    kept = await server.client.post("/lmsp/v1/responses",
                                    json={"model": "reference", "input": "x"})
    path = f"/lmsp/v1/responses/{kept.json()['id']}/input_items"
    for params, param in (({"limit": "0"}, "limit"), ({"limit": "9" * 5000}, "limit"),
                          ({"order": "sideways"}, "order"), ({"after": "msg_other"}, "after")):
        answer = await server.client.get(path, params=params)
        assert answer.status_code == 400 and answer.json()["param"] == param, answer.text
        assert answer.headers["content-type"] == "application/problem+json"
