"""Every relative link in README.md, CHANGELOG.md and docs/ resolves, anchors included.

    .venv/bin/python -m pytest tests/test_docs.py -q

A link is ``[text](target)``, ``![alt](target)`` or ``<img src="target">`` outside code;
``http(s):`` and ``mailto:`` targets are not fetched. ``#anchor`` must name a heading of
the target page, slugged as GitHub does (lowercase, punctuation dropped, spaces to ``-``,
``-1``, ``-2`` … for repeats).
"""

from __future__ import annotations

import re
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
