"""Every relative link in README.md, CHANGELOG.md and docs/ resolves, anchors included;
every ``acp-server`` command the pages show is one the CLI takes, every ``serve``
flag is in operations.md's table, and the flag tables (``serve`` in operations.md and
deployment.md, ``connect``, ``conformance``) state the defaults the commands have.

    .venv/bin/python -m pytest tests/test_docs.py -q

A link is ``[text](target)``, ``![alt](target)`` or ``<img src="target">`` outside code;
``http(s):`` and ``mailto:`` targets are not fetched. ``#anchor`` must name a heading of
the target page, slugged as GitHub does (lowercase, punctuation dropped, spaces to ``-``,
``-1``, ``-2`` … for repeats).
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").rglob("*.md")])

_FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", re.M | re.S)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_SRC = re.compile(r"<img\b[^>]*\bsrc=\"([^\"]+)\"", re.I)
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def _prose(text: str) -> str:
    return _INLINE_CODE.sub("", _FENCE.sub("", text))


def slug(heading: str) -> str:
    text = re.sub(r"<[^>]+>", "", heading).strip().lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)      # a link keeps its text
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    found: set[str] = set()
    for heading in _HEADING.findall(_FENCE.sub("", page.read_text())):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(page: Path) -> list[str]:
    text = _prose(page.read_text())
    return _LINK.findall(text) + _SRC.findall(text)


def broken(page: Path) -> list[str]:
    problems = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
            continue                                           # http:, https:, mailto:
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            problems.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{target}: no heading #{anchor}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken(page) == []


def test_the_readme_is_a_front_door_that_links_every_page() -> None:
    readme = ROOT / "README.md"
    assert len(readme.read_text().splitlines()) <= 155   # a front door, not a manual
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in links(readme)}
    for page in PAGES:
        if page != readme:
            assert page in linked, f"README.md does not link {page.relative_to(ROOT)}"


def test_the_checker_sees_a_broken_link_and_a_broken_anchor(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# Top\n\n## Two words (x)\n\n[ok](#two-words-x) [ok](b.md)\n"
                                   "[bad](missing.md) [bad](#nowhere) `[code](nope.md)`\n")
    (tmp_path / "b.md").write_text("# B\n")
    assert broken(tmp_path / "a.md") == ["missing.md: no such file", "#nowhere: no heading #nowhere"]


# -- the commands the pages show ----------------------------------------------------------
_SHELL_BLOCK = re.compile(r"^```(?:sh|bash|shell|console)?\n(.*?)^```", re.M | re.S)


def command_lines(page: Path) -> list[str]:
    """Each ``acp-server …`` command of the page's shell blocks, as typed (continuations
    joined; a comment, a pipe, a redirection or ``&&`` ends it)."""
    found = []
    for block in _SHELL_BLOCK.findall(page.read_text()):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip().removeprefix("$ ")
            match = re.match(r"^(?:[A-Z_]+=\S+ )*(?:\S*/)?acp-server (.*)", line)
            if match:
                found.append(re.split(r" #|\s[|>]|&&", match.group(1))[0].strip())
    return found


def _usage_error(line: str) -> str | None:
    from acp_server.cli import build_parser

    line = re.sub(r"\[[^\]]*\](\.\.\.|…)?", " ", line)   # [--flag X]...: optional, unchecked
    argv = [a.split("|")[0] for a in shlex.split(line)]   # get|cancel|watch: the first
    parser, _ = build_parser()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(argv)
    except SystemExit as exc:
        return err.getvalue().strip().splitlines()[-1] if exc.code else None
    return None


@pytest.mark.parametrize("page", [p for p in PAGES if p.name != "CHANGELOG.md"],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_a_page_shows_is_one_the_cli_takes(page: Path) -> None:
    """A subcommand renamed or a flag dropped leaves no page showing it (a usage line's
    ``[--flag X]`` parts are skipped, of ``a|b`` the first is taken)."""
    refused = {line: _usage_error(line) for line in command_lines(page)}
    assert {line: why for line, why in refused.items() if why} == {}


def test_every_serve_flag_is_in_the_operations_table() -> None:
    """The README sends a reader to operations.md for "all flags"."""
    from acp_server.cli import build_parser

    _, serve = build_parser()
    table = (ROOT / "docs" / "operations.md").read_text()
    flags = [o for a in serve._actions for o in a.option_strings if o.startswith("--")]
    assert [f for f in flags if f != "--help" and f"`{f}" not in table] == []


def test_the_command_checker_sees_a_wrong_flag_and_a_wrong_command(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("```sh\nacp-server serve --port 0   # fine\n$ acp-server tasks list "
                    "[--limit N]\nacp-server serve --no-such-flag\nacp-server serv\n```\n")
    assert command_lines(page) == ["serve --port 0", "tasks list [--limit N]",
                                   "serve --no-such-flag", "serv"]
    assert [_usage_error(line) is None for line in command_lines(page)] == [True, True,
                                                                           False, False]


# -- the flag tables' defaults ------------------------------------------------------------
_FLAG_TABLES = {"operations.md": "serve", "deployment.md": "serve", "editors.md": "connect",
                "conformance.md": "conformance"}
_UNITS = {"KiB": 1024, "MiB": 1024 ** 2, "GiB": 1024 ** 3,
          "ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def subcommand(name: str):  # type: ignore[no-untyped-def]
    from acp_server.cli import build_parser

    parser, _ = build_parser()
    [commands] = [a for a in parser._actions if a.choices and name in a.choices]
    return commands.choices[name]


def effective_defaults(command: str) -> dict[str, object]:
    """Each ``--flag`` of the subcommand and the value it has when not given: argparse's
    default, or for a bridge option left ``None`` the ``BridgeOptions`` field's."""
    from acp_server.settings import OPTION_FLAGS
    from bridge.options import BridgeOptions

    bridge = BridgeOptions()
    found: dict[str, object] = {}
    for action in subcommand(command)._actions:
        for flag in action.option_strings:
            if not flag.startswith("--") or flag == "--help":
                continue
            value = action.default
            if value is None and action.dest in OPTION_FLAGS:
                value = getattr(bridge, OPTION_FLAGS[action.dest])
            found[flag] = value
    return found


def flag_table(page: Path) -> list[tuple[str, str]]:
    """``(flag, default cell)`` for each flag of the page's ``| flag | default |`` table;
    a row of several flags (``--a`` / ``--b``) with as many ``/``-separated defaults
    gives each its own."""
    text = page.read_text()
    table = re.split(r"\| flag \| default \|", text, maxsplit=1, flags=re.I)[1].split("\n\n", 1)[0]
    rows = []
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        flags = re.findall(r"`(--[a-z0-9-]+)", cells[0])
        defaults = [d.strip() for d in cells[1].split(" / ")]
        if len(defaults) != len(flags):
            defaults = [cells[1]] * len(flags)
        rows += zip(flags, defaults, strict=True)
    return rows


def quantity(text: str) -> float | None:
    """The first number a default cell states, its unit applied (``32 MiB``, ``10m``,
    ``67108864``, ``2,560``); None when it states none."""
    match = re.search(r"(?<![\w.$-])(\d[\d,]*(?:\.\d+)?)\s?(KiB|MiB|GiB|ms|s|m|h|d)?(?![\w.])",
                      text.replace("`", ""))
    if not match:
        return None
    return float(match.group(1).replace(",", "")) * _UNITS.get(match.group(2) or "", 1)


def default_drift(page: Path, command: str) -> list[str]:
    actual = effective_defaults(command)
    problems = []
    for flag, cell in flag_table(page):
        if flag not in actual:
            problems.append(f"{flag}: no such flag of `acp-server {command}`")
            continue
        value = actual[flag]
        if isinstance(value, bool) or value in (None, []):
            if value is True or (value is False and cell != "off"):
                problems.append(f"{flag}: documented {cell!r}, the flag is {value}")
            continue
        number = value if isinstance(value, int | float) else _number(str(value))
        if number is not None:
            if command == "connect" and flag == "--give-up-after":
                number = float(number)             # seconds, documented as a duration
            if quantity(cell) != float(number):
                problems.append(f"{flag}: documented {cell!r}, the default is {value!r}")
        elif f"`{value}`" not in cell and cell != str(value):
            problems.append(f"{flag}: documented {cell!r}, the default is {value!r}")
    return problems


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


@pytest.mark.parametrize("page", sorted(_FLAG_TABLES))
def test_every_flag_table_states_the_defaults_the_cli_has(page: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A default changed in the code (or the table) without the other, or a table row
    naming a flag the command no longer takes, fails here."""
    monkeypatch.delenv("ACP_SERVER_GRANIAN_INTERFACE", raising=False)
    assert default_drift(ROOT / "docs" / page, _FLAG_TABLES[page]) == []
    if page != "deployment.md":   # the fleet's flags only; the others: the whole command
        listed = {flag for flag, _ in flag_table(ROOT / "docs" / page)}
        assert set(effective_defaults(_FLAG_TABLES[page])) - listed == set()


def test_every_serve_help_default_is_the_one_in_force() -> None:
    """``--help`` says ``(default N)`` in words for the bridge options (their argparse
    default is None): each such N must be the default the server runs with."""
    actual = effective_defaults("serve")
    wrong = {}
    for action in subcommand("serve")._actions:
        said = re.search(r"\(default (\d+)\)", action.help or "")
        flag = action.option_strings[-1]
        if said and _number(str(actual[flag])) != float(said.group(1)):
            wrong[flag] = (said.group(1), actual[flag])
    assert wrong == {}


def test_the_default_checker_sees_a_wrong_default_and_an_unknown_flag(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("| flag | default | meaning |\n|---|---|---|\n"
                    "| `--port` | 4170 | fine |\n| `--max-sessions` | 64 | wrong |\n"
                    "| `--store-lease-ms` / `--store-renew-ms` | 30000 / 1000 | one wrong |\n"
                    "| `--log-format` | `json` | wrong |\n| `--no-web` | off | fine |\n"
                    "| `--no-such-flag` | 1 | gone |\n\nprose\n")
    assert default_drift(page, "serve") == [
        "--max-sessions: documented '64', the default is 32",
        "--store-renew-ms: documented '1000', the default is '10000'",
        "--log-format: documented '`json`', the default is 'text'",
        "--no-such-flag: no such flag of `acp-server serve`"]


# -- the answers rest.md's route table spells out -----------------------------------------
def route_answer_keys(page: Path, route: str) -> list[str]:
    """The keys of the first ``{…}`` the answer cell of ``route``'s row spells out."""
    [row] = [line for line in page.read_text().splitlines()
             if line.startswith(f"| `{route}`")]
    answer = re.split(r"(?<!\\)\|", row)[2]
    braces = re.search(r"`(?:\d{3} )?\{([^{}`]*)\}`", answer)
    assert braces, row
    return [key.strip() for key in braces.group(1).split(",")]


@pytest.mark.parametrize(("route", "struct"), [
    ("GET /capabilities", "RestCapabilities"), ("POST /session", "SessionCreated"),
    ("POST /session/{id}/prompt", "PromptAccepted")])
def test_the_rest_table_names_every_field_of_the_answer(route: str, struct: str) -> None:
    """A field added to (or dropped from) a wire answer is added to (dropped from) the
    list rest.md gives of it."""
    import msgspec

    from acp_server.rest import wire

    fields = list(msgspec.structs.fields(getattr(wire, struct)))
    assert route_answer_keys(ROOT / "docs" / "rest.md", route) == [f.name for f in fields]


def test_every_route_of_the_openapi_document_is_in_the_manual() -> None:
    """Each operation of ``openapi.json`` is named (``METHOD /path``, any parameter
    spelling; LMSP's under ``/lmsp/v1`` or relative to it) by a page of the manual."""
    import json

    manual = "".join((ROOT / "docs" / page).read_text()
                     for page in ("rest.md", "lmsp.md", "security.md", "console.md",
                                  "operations.md"))
    missing = []
    for path, operations in json.loads((ROOT / "openapi.json").read_text())["paths"].items():
        pattern = re.sub(r"\\\{[^}]*\\\}", r"(?:\\{[^}]*\\}|[A-Z]+)",
                         re.escape(path.removeprefix("/lmsp/v1")))
        for method in operations:
            if method in ("get", "post", "put", "patch", "delete") and not re.search(
                    rf"`{method.upper()} (?:/lmsp/v1)?{pattern}(?![\w/])", manual):
                missing.append(f"{method.upper()} {path}")
    assert missing == []


_REPO_PATH = re.compile(r"`((?:acp_server|bridge|tests|bench|docs|schemas|\.ci)/[\w./-]*)")


def missing_paths(page: Path) -> list[str]:
    """The repository paths a page names in code spans (``acp_server/…``, ``tests/…``,
    …) that do not exist; ``bridge/fifo.BoundedFifo`` names ``bridge/fifo.py``."""
    missing = []
    for path in dict.fromkeys(_REPO_PATH.findall(page.read_text())):
        path = path.rstrip(".")
        module = re.sub(r"\.[A-Za-z_]\w*$", ".py", path)
        if not (ROOT / path).exists() and not (ROOT / module).exists():
            missing.append(path)
    return missing


@pytest.mark.parametrize("page", [p for p in PAGES if p.name != "CHANGELOG.md"],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_repository_path_a_page_names_exists(page: Path) -> None:
    """A module, test or script moved or renamed leaves no page pointing at its old
    place (the CHANGELOG names the past, so it is not checked)."""
    assert missing_paths(page) == []


def test_every_page_the_code_cites_exists() -> None:
    """``docs/NAME.md`` in a module's text (a docstring's "see …") names a page there is."""
    cited = {f"{source.relative_to(ROOT)}: {page}"
             for folder in ("acp_server", "bridge", "bench", "tests")
             for source in (ROOT / folder).rglob("*.py")
             for page in re.findall(r"docs/[a-z0-9_/-]+\.md", source.read_text())
             if not (ROOT / page).exists()}
    assert cited == set()


def test_the_sdk_page_gives_the_client_signature_the_sdk_has() -> None:
    """sdk-and-cli.md's ``DaemonClient(…)`` line: every parameter, with its default."""
    import inspect

    from acp_server.client import DaemonClient

    text = (ROOT / "docs" / "sdk-and-cli.md").read_text()
    [said] = re.findall(r"`DaemonClient\((base_url, \*, [^`]*)\)`", text.replace("\n  ", " "))
    wanted = ["base_url", "*"]
    for parameter in list(inspect.signature(DaemonClient).parameters.values())[1:]:
        wanted.append(f"{parameter.name}={parameter.default!r}")
    assert [part.strip() for part in said.split(",")] == wanted
