"""The docs' pages and their fenced Python blocks (a uniquely named module of tests/docs,
imported by its tests by name).

A ```python block runs in CI unless the line before its fence is ``<!-- norun -->``:
the marker for the few fragments that need what a test cannot give in seconds (a Spark
session, a 3-broker Raft group, an official RocketMQ 5 client) and whose calls the
feature's own tests run."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
NORUN = "<!-- norun -->"
_FENCE = re.compile(r"^```(\S*)[^\n]*$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the block's first code line, 1-based
    code: str
    runs: bool


def pages() -> list[Path]:
    """README.md and every Markdown page under docs/."""
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def python_blocks(page: Path) -> list[Block]:
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        lang, start = fence.group(1), i + 1
        end = start
        while end < len(lines) and lines[end] != "```":
            end += 1
        if end == len(lines):
            raise ValueError(f"{page}:{i + 1}: a fence that is never closed")
        if lang == "python":
            before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            blocks.append(
                Block(page, start + 1, "\n".join(lines[start:end]), before.strip() != NORUN)
            )
        i = end + 1
    return blocks


def program(blocks: list[Block]) -> str:
    """A page's running blocks as one program whose line numbers are the page's, so a
    failure's traceback points at the line of the page."""
    out: list[str] = []
    for b in blocks:
        out.extend([""] * (b.line - 1 - len(out)))
        out.extend(b.code.splitlines())
    return "\n".join(out) + "\n"


def relative(page: Path) -> str:
    return str(page.relative_to(ROOT))
