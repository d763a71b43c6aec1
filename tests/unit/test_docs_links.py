"""Every relative link and image in README.md and docs/*.md points at a file that exists, that git
does not ignore (an ignored file exists here but never reaches a clone) and, with an anchor, at a
heading of that file (GitHub's anchor rules)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _prose(path: Path, inline_code: bool = False) -> list[str]:
    """The page's lines with code blocks blanked and, unless `inline_code`, inline code too
    (links there are examples; headings keep theirs, it is part of the anchor)."""
    lines, in_code = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
            lines.append("")
        elif in_code:
            lines.append("")
        else:
            lines.append(line if inline_code else re.sub(r"`[^`]*`", "", line))
    return lines


def _slug(heading: str) -> str:
    text = re.sub(r"<[^>]+>", "", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text).strip().lower()
    return "".join(c for c in text if c in " -_" or c.isalnum()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for line in _prose(path, inline_code=True):
        m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if m:
            slug = _slug(m.group(2))
            n = seen.get(slug, 0)
            found.add(slug if n == 0 else f"{slug}-{n}")
            seen[slug] = n + 1
    return found


def _ignored_by_git(path: Path) -> bool:
    """True when this checkout's git ignores `path`; False outside a git checkout."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        return False
    done = subprocess.run(
        ["git", "-C", str(ROOT), "check-ignore", "-q", str(path)], capture_output=True, check=False
    )
    return done.returncode == 0


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page: Path) -> None:
    text = "\n".join(_prose(page))
    broken = []
    for m in LINK.finditer(text):
        target = m.group(1)
        if re.match(r"^[a-z]+://|^mailto:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        line = text.count("\n", 0, m.start()) + 1
        if not dest.exists():
            broken.append(f"line {line}: {target}: no such file")
        elif _ignored_by_git(dest):
            broken.append(f"line {line}: {target}: ignored by git, so missing from every clone")
        elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
            broken.append(f"line {line}: {target}: no heading #{anchor} in {dest.name}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)
