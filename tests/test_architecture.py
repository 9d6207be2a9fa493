"""The import rules of ``docs/architecture.md``, checked on the source with ``ast``.

Every ``import`` and ``from ... import`` counts, wherever it stands (inside a function,
under ``TYPE_CHECKING``); relative imports are resolved against their package.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SERVING = ROOT / "acp_server" / "http" / "serving.py"
DOORS = ("acp_server.rest", "acp_server.acp_http", "acp_server.lmsp", "acp_server.web")
SERVER_ONLY = ("acp_server.settings", "acp_server.app", "acp_server.server", "acp_server.cli",
               "acp_server.serve_cli", "acp_server.ops")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> Iterator[str]:
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def _modules(*packages: str) -> list[Path]:
    return sorted(p for package in packages for p in (ROOT / package.replace(".", "/")).rglob("*.py"))


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _violations(paths: list[Path], forbidden: tuple[str, ...]) -> list[str]:
    found = []
    for path in paths:
        for name in set(_imports(path)):
            if any(_within(name, bad) for bad in forbidden):
                found.append(f"{_module_name(path)} imports {name}")
    return sorted(found)


@pytest.mark.parametrize("door", DOORS)
def test_no_door_imports_another_door_or_the_settings(door: str) -> None:
    others = tuple(d for d in DOORS if d != door)
    assert _violations(_modules(door), others + SERVER_ONLY) == []


def test_the_store_imports_no_door_and_serves_no_http() -> None:
    """``acp_server/store`` (the durable store every door may use) knows no door, no
    settings, no HTTP; the doors may import it. Of the bridge it knows only the
    session journal's seam (``store/sessions.py`` implements ``bridge.journal``, its
    reads in ``store/session_reads.py`` and ``store/open_reads.py``, its writes in
    ``store/session_writes.py``, what a commit trims in ``store/session_trims.py``,
    the records the store refuses in ``store/session_refusals.py``, its leases in
    ``store/session_leasing.py``: its records, the error
    it raises, the terminals and the event envelopes it reads); and, anywhere, the one
    rule of log lines (``bridge.loggable``, a leaf that imports nothing)."""
    seam = ("bridge.journal", "bridge.errors", "bridge.status", "bridge.wire")
    found = _violations(_modules("acp_server.store"), DOORS + SERVER_ONLY + (
        "acp_server.http", "starlette", "uvicorn", "bridge"))
    journal = ("acp_server.store.sessions imports ", "acp_server.store.session_reads imports ",
               "acp_server.store.session_writes imports ",
               "acp_server.store.session_trims imports ",
               "acp_server.store.session_refusals imports ",
               "acp_server.store.session_leasing imports ",
               "acp_server.store.open_reads imports ")
    assert [v for v in found if not (v.startswith(journal)
                                     and any(_within(v.rsplit(" ", 1)[1], m) for m in seam))
            and not _within(v.rsplit(" ", 1)[1], "bridge.loggable")] == []


def test_the_shared_http_folder_imports_no_door() -> None:
    """``http/serving.py`` runs the HTTP server for the composition (it may know the
    ``Server`` and the settings); the rest of the folder is what the doors share."""
    shared = [p for p in _modules("acp_server.http") if p != SERVING]
    assert _violations(shared, DOORS + SERVER_ONLY + ("acp_server.http.serving",)) == []
    assert _violations([SERVING], DOORS + ("acp_server.cli", "acp_server.serve_cli", "acp_server.app")) == []


@pytest.mark.parametrize("door", [*DOORS, "acp_server.ops"])
def test_no_door_imports_the_http_server(door: str) -> None:
    assert _violations(_modules(door), ("acp_server.http.serving", "uvicorn", "hypercorn")) == []


def _state_reads(path: Path) -> Iterator[str]:
    """``x.app.state``, ``app.state`` and ``scope["app"].state`` in ``path``."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not (isinstance(node, ast.Attribute) and node.attr == "state"):
            continue
        owner = node.value
        if (isinstance(owner, ast.Attribute) and owner.attr == "app") \
                or (isinstance(owner, ast.Name) and owner.id == "app") \
                or (isinstance(owner, ast.Subscript) and isinstance(owner.slice, ast.Constant)
                    and owner.slice.value == "app"):
            name = _module_name(path) if path.is_relative_to(ROOT) else path.name
            yield f"{name}:{node.lineno} reads {ast.unparse(node)}"


def test_no_module_reads_app_state() -> None:
    """Every door gets its dependencies from its route factory (``rest.routes(bridge,
    config)``, ``acp_http.routes(registry, config)``, ``lmsp.routes(service)``), composed
    by ``acp_server.server``; nothing is looked up on an untyped ``app.state``."""
    found = [read for path in _modules("acp_server") for read in _state_reads(path)]
    assert found == []


def test_the_state_rule_sees_a_read(tmp_path: Path) -> None:
    module = tmp_path / "door.py"
    module.write_text("def f(request):\n    return request.app.state.bridge\n")
    assert len(list(_state_reads(module))) == 1


def test_the_bridge_serves_no_http_and_knows_no_door() -> None:
    """Outbound clients (``httpx`` for the model agent) are allowed; serving is not."""
    assert _violations(_modules("bridge"), ("starlette", "uvicorn", "hypercorn",
                                            "acp_server")) == []


@pytest.mark.parametrize("package", ["acp_server.client", "acp_server.conformance",
                                     "acp_server.connect"])
def test_the_client_and_the_conformance_import_nothing_of_the_server(package: str) -> None:
    # ``acp_server.bearer``: the one token check every client shares (no imports)
    allowed = ("acp_server.client", "acp_server.conformance", "acp_server.__version__",
               "acp_server.bearer")
    if package == "acp_server.connect":   # the stdio adapter: itself only
        allowed = ("acp_server.connect", "acp_server.bearer")
    paths = _modules(package)
    found = [v for v in _violations(paths, ("acp_server", "bridge", "starlette", "uvicorn"))
             if not any(_within(v.split(" imports ")[1], ok) for ok in allowed)
             and v.split(" imports ")[1] != "acp_server"]
    assert found == []


def test_the_shared_token_check_imports_nothing_of_ours() -> None:
    assert _violations([ROOT / "acp_server" / "bearer.py"], ("acp_server", "bridge")) == []


def test_the_rules_see_the_imports() -> None:
    """The checker itself: it finds a known cross-room import (the composer's)."""
    imports = set(_imports(ROOT / "acp_server" / "app.py"))
    assert "acp_server.rest.errors" in imports and "bridge" in imports


# -- the bridge speaks no door's wire -------------------------------------------------------
# camelCase names the bridge may spell outside bridge/wire.py: the ACP protocol's own (the
# bridge speaks ACP to its agents and passes their payloads through), an ACP ``_meta``
# key of ours (``acp-server/requestedSessionId``), and the logging module's.
ACP_NAMES = frozenset({
    "agentCapabilities", "agentInfo", "authMethods", "availableModels", "availableModes",
    "configId", "configOptions", "currentModeId", "currentModelId", "currentValue",
    "modeId", "modelId", "clientCapabilities", "clientInfo",
    "elicitationId", "embeddedContext", "inputTokens", "loadSession", "mcpServers", "optionId",
    "outputTokens", "promptCapabilities", "protocolVersion", "rawInput", "readTextFile",
    "requestId", "requestedSessionId", "sessionCapabilities", "sessionId", "sessionUpdate",
    "stopReason",
    "toolCall", "toolCallId", "totalTokens", "writeTextFile",
})
PYTHON_NAMES = frozenset({"getLogger", "basicConfig"})
_CAMEL = re.compile(r"^_?[a-z][a-z0-9]*(?:[A-Z][a-z0-9]*)+$")
# A status the bridge would answer with (reading an outbound response's
# ``status_code``, as the model agent's HTTP client does, is not one).
_HTTP_NAMES = re.compile(r"http_?status", re.IGNORECASE)


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)}


def _names(path: Path) -> Iterator[str]:
    """Every name a module spells in code: identifiers, attributes, keyword arguments,
    field annotations, and the words of its string literals (docstrings aside)."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in docstrings:
            yield from re.split(r"[^A-Za-z0-9_]+", node.value)
        elif isinstance(node, ast.keyword) and node.arg:
            yield node.arg
        elif isinstance(node, ast.Attribute):
            yield node.attr
        elif isinstance(node, ast.Name):
            yield node.id
        elif isinstance(node, ast.arg):
            yield node.arg


def test_the_bridge_speaks_no_doors_wire() -> None:
    """No HTTP status and no camelCase wire name in ``bridge/`` outside ``bridge/wire.py``
    (the ACP payloads it passes through aside)."""
    found = []
    for path in _modules("bridge"):
        if path.name == "wire.py" and path.parent.name == "bridge":
            continue
        for name in set(_names(path)):
            if _HTTP_NAMES.search(name):
                found.append(f"{_module_name(path)}: {name} (an HTTP status)")
            elif _CAMEL.match(name) and name not in ACP_NAMES | PYTHON_NAMES:
                found.append(f"{_module_name(path)}: {name}")
    assert sorted(found) == []


def test_the_wire_check_sees_wire_names() -> None:
    """The checker itself: ``bridge/wire.py`` is full of what it looks for."""
    names = set(_names(ROOT / "bridge" / "wire.py"))
    assert {"serverTimestamp", "pendingCount", "promptId"} <= names


def test_the_fleet_imports_no_door_and_no_settings() -> None:
    """``acp_server/fleet`` (sessions across instances) sits beside the doors: it may use
    the bridge and the store, never a door or the composition."""
    assert _violations(_modules("acp_server.fleet"), DOORS + SERVER_ONLY) == []
