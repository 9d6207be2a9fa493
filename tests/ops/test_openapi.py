"""``GET /openapi.json``: valid OpenAPI 3.1, current (the checked-in copy), complete
(every mounted route), and true: schemathesis against a live server in a child process.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator, Iterator
from typing import Any
from pathlib import Path

import httpx
import hypothesis
import pytest
import schemathesis
from schemathesis import GenerationMode
from openapi_spec_validator import validate
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from starlette.routing import Route

from acp_server.ops import openapi
from acp_server.server import open_server
from acp_server.settings import Settings
from tests.harness import ServeProcess

ROOT = Path(__file__).resolve().parents[2]
CHECKED_IN = ROOT / "openapi.json"
NOT_DOCUMENTED = {"/acp", "/workspaces/{workspace}/acp"}   # JSON-RPC, out by design
EVERY_METHOD = {"GET", "POST", "PUT", "PATCH", "DELETE"}   # LMSP routes answer 405 themselves


def test_the_document_is_valid_openapi_3_1() -> None:
    document = openapi.document()
    assert document["openapi"] == "3.1.0"
    validate(document)


def test_the_checked_in_copy_is_current() -> None:
    assert CHECKED_IN.read_text(encoding="utf-8") == openapi.render(), \
        "openapi.json is stale: run `make schemas`"
    assert openapi.main(["--check", str(CHECKED_IN)]) == 0


def test_check_mode_reports_a_stale_copy(tmp_path: Path) -> None:
    stale = tmp_path / "openapi.json"
    stale.write_text("{}\n", encoding="utf-8")
    assert openapi.main(["--check", str(stale)]) == 1
    assert openapi.main([str(stale)]) == 0 and openapi.main(["--check", str(stale)]) == 0


def undocumented(routes: list[Any]) -> list[str]:
    """Mounted routes (``/acp`` aside) that ``openapi.OPERATIONS`` does not describe."""
    paths = openapi.document()["paths"]
    missing = []
    for route in routes:
        if not isinstance(route, Route) or route.path in NOT_DOCUMENTED:
            continue
        methods = set(route.methods or ()) - {"HEAD"}
        documented = {m.upper() for m in paths.get(route.path, {})}
        if methods == EVERY_METHOD:   # one endpoint dispatching by method: at least one
            if not documented:
                missing.append(f"{route.path} (any method)")
            continue
        missing += [f"{m} {route.path}" for m in sorted(methods - documented)]
    return missing


@contextlib.asynccontextmanager
async def full_app(workspace: Path) -> AsyncIterator[Any]:
    """The app as the CLI composes it (``open_server``: REST, /acp, LMSP, ops, web)."""
    settings = Settings(workspace=str(workspace), port=0, state_dir=str(workspace / "state"),
                        max_running_tasks=0)
    async with open_server(settings) as server:
        yield server.app


@pytest.mark.anyio
async def test_every_mounted_route_is_documented(tmp_path: Path) -> None:
    """Routes added later (any door but /acp) fail here until they are in OPERATIONS."""
    async with full_app(tmp_path) as app:
        routes = list(app.routes)
    assert any(getattr(r, "path", "").startswith("/lmsp/") for r in routes)
    assert not undocumented(routes), \
        f"routes missing from acp_server/ops/openapi.py OPERATIONS: {undocumented(routes)}"
    mounted = {getattr(r, "path", None) for r in routes}
    assert set(openapi.document()["paths"]) <= mounted, "documented routes that are not mounted"


@pytest.mark.anyio
async def test_a_route_added_without_its_document_is_reported(tmp_path: Path) -> None:
    async def endpoint(request: Any) -> Any:
        raise AssertionError("never called")

    async with full_app(tmp_path) as app:
        app.router.routes.append(Route("/session/{session_id}/todo", endpoint,
                                       methods=["GET", "POST"]))
        app.router.routes.append(Route("/lmsp/v1/things", endpoint,
                                       methods=sorted(EVERY_METHOD)))
        app.router.routes.append(Route("/session", endpoint, methods=["PUT"]))
        missing = undocumented(list(app.routes))
    assert missing == ["GET /session/{session_id}/todo", "POST /session/{session_id}/todo",
                       "/lmsp/v1/things (any method)", "PUT /session"]


def test_lmsp_errors_are_problems_and_rest_errors_are_rest_bodies() -> None:
    paths = openapi.document()["paths"]
    lmsp = paths["/lmsp/v1/tasks/{task_id}"]["get"]["responses"]["404"]["content"]
    rest = paths["/session/{session_id}/status"]["get"]["responses"]["404"]["content"]
    assert list(lmsp) == ["application/problem+json"]
    assert lmsp["application/problem+json"]["schema"] == {"$ref": "#/components/schemas/Problem"}
    assert rest["application/json"]["schema"] == {"$ref": "#/components/schemas/RestError"}
    prompt = paths["/session/{session_id}/prompt"]["post"]
    assert prompt["responses"]["503"]["headers"]["Retry-After"]
    assert prompt["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/PromptRequest"}
    events = paths["/session/{session_id}/events"]["get"]
    assert "text/event-stream" in events["responses"]["200"]["content"]
    assert {p["name"] for p in events["parameters"]} >= {"Last-Event-ID", "session_id",
                                                         "maxQueued"}
    create = paths["/lmsp/v1/tasks"]["post"]
    assert "Idempotency-Key" in {p["name"] for p in create["parameters"]}


# -- schemathesis against a live server ----------------------------------------------------
@pytest.fixture(scope="module")
def live_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``acp-server serve`` in a child process, session cap off (no legitimate 5xx)."""
    with ServeProcess(tmp_path_factory.mktemp("fuzz"), "--max-sessions", "0") as child:
        yield child.base_url


def test_the_live_server_serves_the_document(live_url: str) -> None:
    served = httpx.get(f"{live_url}/openapi.json", timeout=10)
    assert served.status_code == 200
    assert served.json() == json.loads(CHECKED_IN.read_text(encoding="utf-8"))


SCHEMA = schemathesis.openapi.from_dict(openapi.document())
OPERATIONS = [result.ok() for result in SCHEMA.get_all_operations()]
# operations with a query parameter narrower than any string (an integer, a pattern, an enum)
TYPED_QUERY = {f"{method.upper()} {path}" for path, item in SCHEMA.raw_schema["paths"].items()
               for method, op in item.items()
               if any(p["in"] == "query" and p["schema"] != {"type": "string"}
                      for p in op.get("parameters", ()))}
# (operation, mode): the documented examples (e.g. model `reference`), positive cases,
# and negative cases where there is a body or a typed query parameter to break (path and
# header parameters are strings, which every wire value is)
CASES = [pytest.param(op, mode, id=f"{op.label} {mode}") for op in OPERATIONS
         for mode in ("examples", "positive", "negative")
         if mode == "positive" or (mode == "negative" and (op.body or op.label in TYPED_QUERY))
         or (mode == "examples" and op.get_strategies_from_examples())]
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance]
# per operation and mode; 20: about 1,000 requests in all, some 20 s on a busy machine
EXAMPLES = int(os.environ.get("OPENAPI_FUZZ_EXAMPLES", "20"))


@pytest.mark.parametrize(("operation", "mode"), CASES)
def test_the_live_server_conforms(operation: Any, mode: str, live_url: str) -> None:
    if mode == "examples":
        strategy = hypothesis.strategies.one_of(operation.get_strategies_from_examples())
    else:
        strategy = operation.as_strategy(generation_mode=GenerationMode(mode))

    @hypothesis.given(case=strategy)
    @hypothesis.settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                         database=None, suppress_health_check=list(hypothesis.HealthCheck))
    def conforms(case: schemathesis.Case) -> None:
        case.call_and_validate(base_url=live_url, checks=CHECKS, timeout=20)

    conforms()


@pytest.mark.slow
@pytest.mark.parametrize("door", ["^/(session|permission)", "^/lmsp/"], ids=["rest", "lmsp"])
def test_the_live_server_conforms_through_links(live_url: str, door: str) -> None:
    """Stateful, one door at a time: sessions (tasks) created, then the routes their
    links lead to (status, prompts, events, branch, delete, …), so that the success
    answers are checked too."""
    linked = schemathesis.openapi.from_dict(openapi.document()).include(path_regex=door)
    linked.config.update(base_url=live_url)

    class Machine(linked.as_state_machine()):  # type: ignore[misc]
        def validate_response(self, response: Any, case: schemathesis.Case,
                              additional_checks: Any = None, **kwargs: Any) -> None:
            case.validate_response(response, checks=CHECKS)

        def get_call_kwargs(self, case: schemathesis.Case) -> dict[str, Any]:
            # An event stream never ends by itself: schemathesis reads it until its
            # (connect, read) timeout's read half passes in total or the stream goes that
            # long silent, then checks what came (the replay and the headers arrive at
            # once). With 20 s each stream held the run 30 s (to the second heartbeat).
            events = case.operation.path.endswith("/events")
            return {**super().get_call_kwargs(case),
                    "timeout": (20, STREAM_READ_S) if events else 20}

    Machine.run(settings=hypothesis.settings(
        max_examples=STATEFUL_EXAMPLES, deadline=None, derandomize=True, database=None,
        stateful_step_count=8, suppress_health_check=list(hypothesis.HealthCheck)))


STATEFUL_EXAMPLES = int(os.environ.get("OPENAPI_FUZZ_STATEFUL", "30"))
STREAM_READ_S = 5.0   # how long the stateful run reads an event stream


def _caller(live_url: str) -> Any:
    """``call(label, expected status, **case fields)``: one request through schemathesis,
    its answer checked against the document with every check."""
    by_label = {op.label: op for op in OPERATIONS}

    def call(label: str, status: int, **kwargs: Any) -> Any:
        case = by_label[label].Case(**kwargs)
        response = case.call(base_url=live_url, timeout=20)
        case.validate_response(response, checks=CHECKS)
        assert response.status_code == status, (label, response.status_code, response.text)
        return response

    return call


def test_the_live_server_conforms_on_real_responses_and_tasks(live_url: str) -> None:
    """The answers that need an existing response or task, on real ones. (The stateful
    run does not start from the creating POSTs: schemathesis reads their optional
    ``previous_response_id`` as a reference nothing produces, so it never takes them as
    entry points.)"""
    call = _caller(live_url)
    create = "POST /lmsp/v1/responses"
    done = call(create, 200, body={"model": "reference", "input": "hello"}).json()
    assert done["status"] == "completed"
    one = {"response_id": done["id"]}
    held = call(create, 200, body={"model": "reference", "input": "/sleep 30s hold",
                                   "background": True}).json()
    assert held["status"] in ("queued", "in_progress") and held["background"] is True
    running = {"response_id": held["id"]}
    call(create, 409, body={"model": "reference", "input": "next",
                            "previous_response_id": held["id"]})
    call(create, 404, body={"model": "reference", "input": "next",
                            "previous_response_id": "resp_unknown"})
    call(create, 400, body={"model": "reference", "input": "x", "background": True,
                            "store": False})
    call("GET /lmsp/v1/responses/{response_id}", 200, path_parameters=running)
    call("DELETE /lmsp/v1/responses/{response_id}", 409, path_parameters=running)
    cancelled = call("POST /lmsp/v1/responses/{response_id}/cancel", 200,
                     path_parameters=running).json()
    assert cancelled["status"] == "cancelled"
    streamed = call(create, 200, body={"model": "reference", "input": "more", "stream": True,
                                       "previous_response_id": done["id"]})
    assert "event: response.completed" in streamed.text

    get = "GET /lmsp/v1/responses/{response_id}"
    events = call(get, 200, path_parameters=one, query={"stream": "true"}).text
    last = events.rstrip().rsplit("\nid: ", 1)[-1].split("\n", 1)[0]
    call(get, 200, path_parameters=one, query={"stream": "1", "starting_after": "0"})
    call(get, 204, path_parameters=one, query={"stream": "true", "starting_after": last})
    call(get, 400, path_parameters=one, query={"stream": "true", "starting_after": "99999"})
    call(get, 400, path_parameters=one, query={"stream": "maybe"})
    call("POST /lmsp/v1/responses/{response_id}/cancel", 400, path_parameters=one)

    task = call("POST /lmsp/v1/tasks", 202, body={
        "type": "response", "input": {"model": "reference", "input": "a task"}}).json()
    listed = call("GET /lmsp/v1/tasks", 200, query={"limit": "2"}).json()
    assert listed["data"] and listed["has_more"] is True
    call("GET /lmsp/v1/tasks", 200, query={"after": listed["last_id"], "status": "succeeded"})
    call("GET /lmsp/v1/tasks", 400, query={"after": "task_unknown"})
    call("GET /lmsp/v1/tasks/{task_id}/events", 200, path_parameters={"task_id": task["id"]})
    call("GET /lmsp/v1/tasks/{task_id}", 200, path_parameters={"task_id": task["id"]})

    deleted = call("DELETE /lmsp/v1/responses/{response_id}", 200, path_parameters=one).json()
    assert deleted == {"id": done["id"], "object": "response.deleted", "deleted": True}
    call(get, 404, path_parameters=one)
    call("DELETE /lmsp/v1/responses/{response_id}", 404, path_parameters=one)


def test_the_live_server_conforms_on_a_real_workspace(live_url: str) -> None:
    """``/workspace/{id}/sessions`` with the id of ``/capabilities`` and live sessions,
    and the web console's files."""
    call = _caller(live_url)
    workspace = call("GET /capabilities", 200).json()["workspaces"][0]["id"]
    for _ in range(2):
        call("POST /session", 200, body={"sessionScope": "thread"})
    page = "GET /workspace/{workspace}/sessions"
    first = call(page, 200, path_parameters={"workspace": workspace}, query={"size": "1"})
    cursor = first.json()["nextCursor"]
    call(page, 200, path_parameters={"workspace": workspace},
         query={"size": "100", "cursor": cursor})
    call(page, 400, path_parameters={"workspace": workspace}, query={"cursor": "x"})
    call(page, 400, path_parameters={"workspace": "0" * 16})   # as the peer
    agents = call("GET /daemon/status", 200).json()["agents"]
    assert any(a["name"] == "reference" and a["default"] for a in agents)
    assert call("GET /", 200).headers["content-type"][0].startswith("text/html")
    for name in ("app.js", "style.css", "index.html"):
        call("GET /web/{name}", 200, path_parameters={"name": name})
    call("GET /web/{name}", 404, path_parameters={"name": "missing.js"})


@pytest.mark.anyio
async def test_the_prompt_answers_match_their_schemas(tmp_path: Path) -> None:
    """The 202 and the 503 of a full queue (which the fuzzing, on random sessions, never
    reaches), checked against the document."""
    import jsonschema

    from bridge import BridgeOptions
    from tests.rest.server import running_server

    document = openapi.document()
    responses = document["paths"]["/session/{session_id}/prompt"]["post"]["responses"]

    def check(status: int, body: Any) -> None:
        schema = {**responses[str(status)]["content"]["application/json"]["schema"],
                  "components": document["components"]}
        jsonschema.validate(body, schema)

    async with running_server(tmp_path,
                              options=BridgeOptions(max_pending_prompts_per_session=1)) as srv:
        sid = (await srv.create_session())["sessionId"]
        accepted = await srv.prompt(sid, "/sleep 30s hold")
        refused = await srv.prompt(sid, "more")
    assert (accepted.status_code, refused.status_code) == (202, 503)
    check(202, accepted.json())
    check(503, refused.json())
    assert refused.headers["retry-after"] == "5"
    with pytest.raises(jsonschema.ValidationError):
        check(503, {**refused.json(), "limit": "1"})
