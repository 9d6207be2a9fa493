"""Every relative link in README.md, CHANGELOG.md and docs/ resolves, anchors included;
every ``acp-server`` command the pages show is one the CLI takes, and every ``serve``
flag is in operations.md's table.

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
    assert len(readme.read_text().splitlines()) < 200
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
