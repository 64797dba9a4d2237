"""Every relative link in README.md and docs/*.md reaches a file that exists and, for a Markdown target, a heading
that exists (GitHub's anchor rule: lower case, punctuation dropped, spaces to hyphens, -1, -2 for repeats)."""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _slug(heading: str) -> str:
    h = heading.strip().lstrip("#").strip().lower()
    return re.sub(r"[^\w\- ]", "", h).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    found: set[str] = set()
    in_code = False
    for line in page.read_text(encoding="utf-8").split("\n"):
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and re.match(r"#{1,6} ", line):
            base = a = _slug(line)
            k = 0
            while a in found:
                k += 1
                a = f"{base}-{k}"
            found.add(a)
    return found


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_relative_links_reach_a_file_and_a_heading(page: Path) -> None:
    broken = []
    for m in re.finditer(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
        target = m.group(1)
        if re.match(r"[a-z]+:", target):  # http(s), mailto: not checked (no network)
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no such heading")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)
