"""``GET /workspace/{id}/ended-sessions`` over real HTTP on SQLite and PostgreSQL: the
closed sessions the journal keeps (``acp_server.rest.ended``), what ``/load`` brings
back.

* A session whose agent died, or that the idle timeout closed, leaves the live listing
  and is listed here, newest end first, until it is loaded again (live: not here) or
  deleted (its journal gone).
* Paging by the route's own keyset cursor: every session on exactly one page; a cursor
  it did not mint (garbage, the live listing's, another spelling) is 400
  ``invalid_cursor``; another workspace 404.
* Each principal sees its own, an admin all.
* The store down: 503 ``store_unavailable`` in REST's shape; listed again once it is
  back.
"""

from __future__ import annotations

import base64
import json
import math
import struct
from pathlib import Path
from typing import Any

import anyio
import pytest

from acp_server.http import ended_cursor as ended
from tests.lmsp.server import running_lmsp
from tests.principals.helpers import bearer, mint
from tests.store.faults import faulty

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("store_name")]


async def _workspace(client: Any) -> str:
    return str((await client.get("/capabilities")).json()["workspaces"][0]["id"])


async def _session(server: Any, text: str, headers: dict[str, str] | None = None) -> str:
    made = await server.client.post("/session", json={"sessionScope": "thread"},
                                    headers=headers)
    assert made.status_code == 200, made.text
    sid = str(made.json()["sessionId"])
    said = await server.client.post(f"/session/{sid}/prompt", headers=headers,
                                    json={"prompt": [{"type": "text", "text": text}]})
    assert said.status_code == 202, said.text
    with anyio.fail_after(20):
        while (await server.client.get(f"/session/{sid}/status", headers=headers)
               ).json()["pendingPrompts"]:
            await anyio.sleep(0.01)
    return sid


async def _end(server: Any, sid: str, reason: str = "agent_exited") -> None:
    """What the agent's death (or the idle timeout) does to a session: closed, kept."""
    await server.server.bridge.close_session(sid, reason=reason)


async def _ended(server: Any, wid: str, headers: dict[str, str] | None = None,
                 **params: Any) -> Any:
    response = await server.client.get(f"/workspace/{wid}/ended-sessions", params=params,
                                       headers=headers)
    assert response.status_code == 200, response.text
    return response.json()


async def _ids_when_committed(server: Any, wid: str, expected: list[str],
                              headers: dict[str, str] | None = None) -> None:
    """The listing once the closes it waits for are committed (a close is journaled
    behind the answer)."""
    with anyio.fail_after(20):
        while [s["sessionId"] for s in (await _ended(server, wid, headers))["sessions"]
               ] != expected:
            await anyio.sleep(0.01)


async def test_a_session_whose_agent_died_is_listed_until_it_is_loaded_again(
        tmp_path: Path) -> None:
    async with running_lmsp(tmp_path) as server:
        wid = await _workspace(server.client)
        assert await _ended(server, wid) == {"sessions": []}
        first = await _session(server, "apricot")
        second = await _session(server, "quince")
        kept = await _session(server, "damson")
        await _end(server, first)
        await _end(server, second, reason="idle_timeout")
        await _ids_when_committed(server, wid, [second, first])   # newest end first
        [item, _] = (await _ended(server, wid))["sessions"]
        assert item["agent"] == "reference" and item["workspaceCwd"] == str(tmp_path)
        assert item["endedAt"].endswith("Z") and item["createdAt"] <= item["endedAt"]
        assert item["owner"] is not None and item["origin"] is None
        assert item["forkedFrom"] is None
        live = (await server.client.get(f"/workspace/{wid}/sessions")).json()["sessions"]
        assert [s["sessionId"] for s in live] == [kept]
        loaded = await server.client.post(f"/session/{first}/load", json={})
        assert loaded.status_code == 200, loaded.text
        assert (await _ended(server, wid))["sessions"][0]["sessionId"] == second
        assert [s["sessionId"] for s in (await _ended(server, wid))["sessions"]] == [second]
        assert (await server.client.delete(f"/session/{first}")).status_code == 204
        await _ids_when_committed(server, wid, [second])   # deleted: nothing to list


async def test_pages_hold_every_ended_session_once(tmp_path: Path) -> None:
    async with running_lmsp(tmp_path) as server:
        wid = await _workspace(server.client)
        made = [await _session(server, f"plum {n}") for n in range(5)]
        for sid in made:
            await _end(server, sid)
        await _ids_when_committed(server, wid, made[::-1])
        seen: list[str] = []
        page = await _ended(server, wid, size=2)
        pages = 1
        while "nextCursor" in page:
            seen += [s["sessionId"] for s in page["sessions"]]
            page = await _ended(server, wid, size=2, cursor=page["nextCursor"])
            pages += 1
        seen += [s["sessionId"] for s in page["sessions"]]
        assert seen == made[::-1] and pages == 3


def _b64(raw: bytes, pad: bool = False) -> str:
    text = base64.urlsafe_b64encode(raw).decode()
    return text if pad else text.rstrip("=")


@pytest.mark.parametrize("cursor", [
    "nonsense!", "AAAA", _b64(b"E" + struct.pack(">d", math.inf)),     # no instant
    _b64(b"E" + struct.pack(">d", math.nan) + b"s1"),                   # not a time
    _b64(b"F" + struct.pack(">d", 1.0) + b"s1"),                        # another tag
    _b64(b"E" + struct.pack(">d", 1.0) + b"\xff"),                      # not UTF-8
    _b64(b"E" + struct.pack(">d", 1.0) + b"a\x00b"),                    # no such id
    _b64(b"E" + struct.pack(">d", 1.0) + b"s1", pad=True),              # padded
    _b64(json.dumps({"createdUs": 1, "sessionHash": "0" * 32},          # the live one's
                    separators=(",", ":")).encode()),
    "A" * (ended.MAX_CURSOR_CHARS + 4)])
async def test_a_cursor_the_route_did_not_mint_is_400(tmp_path: Path, cursor: str) -> None:
    async with running_lmsp(tmp_path) as server:
        wid = await _workspace(server.client)
        response = await server.client.get(f"/workspace/{wid}/ended-sessions",
                                           params={"cursor": cursor})
        assert response.status_code == 400, response.text
        assert response.json()["code"] == "invalid_cursor"
        other = await server.client.get("/workspace/0123456789abcdef/ended-sessions")
        assert other.status_code == 404 and other.json()["code"] == "workspace_not_found"


async def test_each_principal_lists_its_own_and_an_admin_every_one(tmp_path: Path) -> None:
    async with running_lmsp(tmp_path, token="boot") as server:
        wid = await _workspace(server.client)
        alpha = bearer(await mint(server.server, "alpha", unlimited=True))
        beta = bearer(await mint(server.server, "beta", unlimited=True))
        ops = bearer(await mint(server.server, "ops", "admin", unlimited=True))
        mine = await _session(server, "fig", alpha)
        theirs = await _session(server, "sloe", beta)
        await _end(server, mine)
        await _end(server, theirs)
        await _ids_when_committed(server, wid, [theirs, mine], ops)
        assert [s["sessionId"] for s in (await _ended(server, wid, alpha))["sessions"]] \
            == [mine]
        assert [s["owner"] for s in (await _ended(server, wid, beta))["sessions"]] == ["beta"]
        refused = await server.client.post(f"/session/{theirs}/load", json={},
                                           headers=alpha)
        assert refused.status_code == 404   # what it cannot list it cannot load


async def test_the_store_down_is_503_and_the_list_comes_back(tmp_path: Path) -> None:
    store = faulty(tmp_path)
    async with running_lmsp(tmp_path, store=store) as server:
        wid = await _workspace(server.client)
        sid = await _session(server, "medlar")
        await _end(server, sid)
        await _ids_when_committed(server, wid, [sid])
        store.faults.on()
        down = await server.client.get(f"/workspace/{wid}/ended-sessions")
        assert down.status_code == 503, down.text
        assert down.headers["retry-after"] == "5"
        assert down.json()["code"] == "store_unavailable" and down.json()["error"]
        store.faults.off()
        await _ids_when_committed(server, wid, [sid])


async def test_delete_removes_an_ended_session_once_committed(tmp_path: Path) -> None:
    """``DELETE /session/{id}`` of a session the journal keeps closed: 204 once its
    removal is committed; not listed after, and a second DELETE is 404; another
    principal's is 404 and stays; the store down is 503 and nothing is removed."""
    store = faulty(tmp_path)
    async with running_lmsp(tmp_path, token="boot", store=store) as server:
        wid = await _workspace(server.client)
        alpha = bearer(await mint(server.server, "alpha", unlimited=True))
        beta = bearer(await mint(server.server, "beta", unlimited=True))
        mine = await _session(server, "walnut", alpha)
        kept = await _session(server, "hazel", alpha)
        for sid in (mine, kept):
            await _end(server, sid)
        await _ids_when_committed(server, wid, [kept, mine], alpha)
        refused = await server.client.delete(f"/session/{mine}", headers=beta)
        assert refused.status_code == 404 and refused.json()["code"] == "session_not_found"
        store.faults.on()
        down = await server.client.delete(f"/session/{mine}", headers=alpha)
        assert down.status_code == 503 and down.json()["code"] == "store_unavailable"
        store.faults.off()
        assert [s["sessionId"] for s in (await _ended(server, wid, alpha))["sessions"]] \
            == [kept, mine]
        gone = await server.client.delete(f"/session/{mine}", headers=alpha)
        assert gone.status_code == 204, gone.text
        assert [s["sessionId"] for s in (await _ended(server, wid, alpha))["sessions"]] \
            == [kept]
        again = await server.client.delete(f"/session/{mine}", headers=alpha)
        assert again.status_code == 404   # (a load now is the agent's own: we keep none)
        assert (await server.client.post(f"/session/{kept}/load", json={},
                                         headers=alpha)).status_code == 200
