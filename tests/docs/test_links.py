"""Every relative link in the README and docs/ points at a file that exists, and every
#anchor at a heading of that page (as GitHub makes anchors of headings)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_relative_links_resolve() -> None:
    broken = [
        f"{page.relative_to(ROOT)}: {target}"
        for page in PAGES
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text())
        if not target.startswith(("http://", "https://", "mailto:"))
        and not (page.parent / target).exists()
    ]
    assert broken == []


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives ``page``'s headings: lowercased, punctuation dropped,
    spaces as hyphens, a repeat numbered."""
    made: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (heading := re.match(r"#{1,6} (.*)", line)):
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            made.add(slug if count == 0 else f"{slug}-{count}")
    return made


def test_anchors_name_a_heading() -> None:
    broken = [
        f"{page.relative_to(ROOT)}: {target}#{anchor}"
        for page in PAGES
        for target, anchor in re.findall(r"\]\(([^)#\s]*)#([^)\s]+)\)", page.read_text())
        if not target.startswith(("http://", "https://"))
        and (dest := page.parent / target if target else page).suffix == ".md"
        and dest.exists()
        and anchor not in anchors(dest)
    ]
    assert broken == []
