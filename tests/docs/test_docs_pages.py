"""The docs' shape: a short README, every page in the site's navigation, no development
history in the pages (it belongs in CHANGELOG.md and the commits)."""

from __future__ import annotations

import re

import yaml
from raymq_docs_pages import DOCS, ROOT, pages, python_blocks, relative

HISTORY = re.compile(
    r"\bstop \d+|\bstops \d+|this stop\b|\bthis step\b|we used to|\bissue #?\d+|"
    r"until stop|since stop",
    re.IGNORECASE,
)


def test_the_readme_stays_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines: move detail into docs/"


def test_every_page_is_in_the_navigation() -> None:
    config = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=yaml.BaseLoader)

    def walk(item: object) -> list[str]:
        if isinstance(item, str):
            return [item]
        if isinstance(item, dict):
            return [p for v in item.values() for p in walk(v)]
        if isinstance(item, list):
            return [p for v in item for p in walk(v)]
        return []

    in_nav = set(walk(config["nav"]))
    on_disk = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert on_disk - in_nav == set(), "pages missing from mkdocs.yml's nav"
    assert in_nav - on_disk == set(), "nav entries with no page"


def test_no_page_tells_the_history_of_its_making() -> None:
    found = [
        f"{relative(page)}:{n}: {line.strip()}"
        for page in pages()
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        if HISTORY.search(line)
    ]
    assert found == [], "\n".join(found)


def test_blocks_are_read_with_their_markers(tmp_path) -> None:
    page = tmp_path / "p.md"
    page.write_text(
        "# T\n\n```python\nx = 1\n```\n\n<!-- norun -->\n```python\ny = 2\n```\n"
        "```bash\necho\n```\n",
        encoding="utf-8",
    )
    blocks = python_blocks(page)
    assert [(b.line, b.code, b.runs) for b in blocks] == [(4, "x = 1", True), (9, "y = 2", False)]


def test_the_readmes_links_point_at_files_of_the_repository() -> None:
    """The README points only inside the repository, at files that are there (the site's
    strict build checks the links between docs/ pages)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links, "the README links into the docs"
    outside = [link for link in links if "://" in link or link.startswith(("/", ".."))]
    assert outside == [], f"links out of the repository: {outside}"
    missing = [link for link in links if not (ROOT / link.split("#")[0]).exists()]
    assert missing == [], f"links to missing files: {missing}"


def test_the_pages_link_only_inside_the_repository() -> None:
    outside = [
        f"{relative(page)}: {link}"
        for page in pages()
        for link in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8"))
        if "://" in link
    ]
    assert outside == [], "\n".join(outside)
