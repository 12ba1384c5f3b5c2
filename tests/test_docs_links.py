"""The README and docs/ hold together: the README fits a newcomer's first read (at most 12,000 bytes), and
every relative link of the README and of every page under docs/ names a file that exists (anchors are
not checked: a heading may move within its page)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "benchmarks/results").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
README_LIMIT = 12_000


def relative_links(page: Path) -> list[str]:
    """The link targets of a Markdown page that point into the repository (no URL, no bare anchor)."""
    targets = [m.group(1) for m in LINK.finditer(page.read_text())]
    return [t for t in targets if not re.match(r"^[a-z]+:", t) and not t.startswith("#")]


def test_the_readme_is_at_most_12000_bytes():
    assert len((ROOT / "README.md").read_bytes()) <= README_LIMIT


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_of_a_page_names_a_file_that_exists(page):
    missing = [t for t in relative_links(page) if not (page.parent / t.split("#", 1)[0]).exists()]
    assert missing == []


def test_docs_index_lists_every_page_of_docs():
    index = (ROOT / "docs" / "index.md").read_text()
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"index.md"}
    assert sorted(p for p in pages if f"]({p})" not in index) == []


def test_a_link_to_a_missing_file_is_seen(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[here](nowhere.md) and [there](https://example.com) and [up](#top)")
    assert relative_links(page) == ["nowhere.md"]
