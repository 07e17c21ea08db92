"""The docs hold together: README.md stays an entry point, and no Markdown link or image in it or in docs/ is broken.

- Every relative link `[text](target)` and image `![alt](target)` in README.md and docs/**/*.md (docs/benchmarks/
  included) names a file or folder that exists, relative to the page; with `#anchor` on a .md target the anchor
  is a heading of that page by GitHub's slug rule (lowercase; punctuation other than '-' and ' ' dropped; spaces
  become '-'; a repeated heading gets -1, -2, ...). http(s)://, mailto: and pure #anchors are not checked.
  Links inside fenced code blocks and inline code spans are not links.
- README.md has at most 300 lines.
- No user-facing page (README.md, docs/*.md; not the generated docs/benchmarks/**) has a heading that names an
  issue number ("issue 33", "Issue #33").
"""
from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

from tests.conftest import REPO

README_MAX_LINES = 300

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")  # ATX heading, closing #s dropped
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# [text](target) or ![alt](target), target optionally in <...> and optionally followed by a "title"
LINK = re.compile(r"(!?)\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
ISSUE_NUMBER = re.compile(r"issue\s*#?\s*\d+", re.IGNORECASE)
EXTERNAL = ("http://", "https://", "mailto:")


def markdown_files(repo: Path) -> list[Path]:
    """README.md and every docs/**/*.md, docs/benchmarks/ included."""
    files = [repo / "README.md"] if (repo / "README.md").is_file() else []
    return files + sorted((repo / "docs").rglob("*.md"))


def user_facing_files(repo: Path) -> list[Path]:
    """README.md and docs/*.md (not the generated result pages under docs/benchmarks/)."""
    files = [repo / "README.md"] if (repo / "README.md").is_file() else []
    return files + sorted((repo / "docs").glob("*.md"))


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) for the lines outside fenced code blocks."""
    out, fence = [], None
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if match:
            if fence is None:
                fence = match.group(1)
            elif match.group(1) == fence:
                fence = None
            continue
        if fence is None:
            out.append((number, line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: lowercase, punctuation but '-' and ' ' dropped, spaces -> '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()  # inline HTML
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown page, repeated headings numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    found = set()
    for _, line in prose_lines(path.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every Markdown link and image outside code blocks and code spans."""
    found = []
    for number, line in prose_lines(text):
        line = CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)
        for match in LINK.finditer(line):
            target = match.group(3)
            if target.startswith("<") and target.endswith(">"):
                target = target[1:-1]
            found.append((number, target))
    return found


def _shown(repo: Path, path: Path) -> str:
    """A resolved path as the repository names it (absolute where it lies outside)."""
    root = repo.resolve()
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)


def broken_links(repo: Path, files: list[Path]) -> list[str]:
    """'FILE:LINE: TARGET (why)' for every relative link or image that does not resolve."""
    broken = []
    anchor_cache: dict[Path, set[str]] = {}
    for page in files:
        where = page.relative_to(repo).as_posix()
        for number, target in links(page.read_text(encoding="utf-8")):
            if target.startswith(EXTERNAL) or target.startswith("#"):
                continue
            path_part, _, anchor = target.partition("#")
            resolved = (page.parent / unquote(path_part)).resolve()
            if not resolved.exists():
                broken.append(f"{where}:{number}: {target} (no such file: {_shown(repo, resolved)})")
                continue
            if anchor and resolved.suffix == ".md" and resolved.is_file():
                if resolved not in anchor_cache:
                    anchor_cache[resolved] = anchors(resolved)
                if unquote(anchor).lower() not in anchor_cache[resolved]:
                    broken.append(f"{where}:{number}: {target} (no heading with anchor #{anchor} in "
                                  f"{_shown(repo, resolved)})")
    return broken


def issue_headings(repo: Path, files: list[Path]) -> list[str]:
    """'FILE:LINE: heading' for every heading that names an issue number."""
    found = []
    for page in files:
        for number, line in prose_lines(page.read_text(encoding="utf-8")):
            if HEADING.match(line) and ISSUE_NUMBER.search(line):
                found.append(f"{page.relative_to(repo).as_posix()}:{number}: {line.strip()}")
    return found


def test_every_relative_link_and_image_resolves():
    files = markdown_files(REPO)
    assert any(f.name == "README.md" for f in files) and len(files) > 10, files
    broken = broken_links(REPO, files)
    assert not broken, "broken links (file:line: target):\n" + "\n".join(broken)


def test_the_readme_is_an_entry_point_of_at_most_300_lines():
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move sections into docs/ and link them; "
        f"line {README_MAX_LINES + 1} is: {lines[README_MAX_LINES]!r}")


def test_no_user_facing_heading_names_an_issue_number():
    found = issue_headings(REPO, user_facing_files(REPO))
    assert not found, "headings that name an issue number (file:line: heading):\n" + "\n".join(found)


# The checks themselves catch what they are for, on a small tree.

def _tree(root: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def test_the_checks_catch_a_missing_file_a_missing_anchor_and_an_issue_heading(tmp_path):
    repo = _tree(tmp_path, {
        "README.md": ("# Top\n\nSee [the page](docs/page.md#a-section-with-code), [gone](docs/gone.md),\n"
                      "![img](docs/pic.png) and [bad anchor](docs/page.md#nowhere).\n"
                      "[web](https://example.com) [mail](mailto:a@b.c) [here](#top) `[code](docs/nope.md)`\n"
                      "```\n[fenced](docs/nope.md)\n# not a heading\n```\n"),
        "docs/page.md": ("# Page\n\n## A section, with `code`!\n\n## Realistic users (issue 33)\n\n"
                         "## Twice\n\n## Twice\n\n[back](../README.md#top) [twice](#twice-1) "
                         "[second twice](page.md#twice-1)\n"),
        "docs/pic.png": "",
        "docs/benchmarks/result.md": "# Result\n\n![curve](missing.png)\n\n## Issue #7 in a result page\n",
    })
    broken = broken_links(repo, markdown_files(repo))
    assert broken == [
        "README.md:3: docs/gone.md (no such file: docs/gone.md)",
        "README.md:4: docs/page.md#nowhere (no heading with anchor #nowhere in docs/page.md)",
        "docs/benchmarks/result.md:3: missing.png (no such file: docs/benchmarks/missing.png)",
    ], broken
    assert issue_headings(repo, user_facing_files(repo)) == ["docs/page.md:5: ## Realistic users (issue 33)"]
    assert anchors(repo / "docs" / "page.md") == {"page", "a-section-with-code", "realistic-users-issue-33",
                                                   "twice", "twice-1"}


def test_slugs_follow_githubs_rule():
    assert slug("Realistic users and the fair protocol") == "realistic-users-and-the-fair-protocol"
    assert slug("The teacher: what a hint changes") == "the-teacher-what-a-hint-changes"
    assert slug("`clawr1 bench`") == "clawr1-bench"
    assert slug("6a. Weight updates (what clawr1 does)") == "6a-weight-updates-what-clawr1-does"
    assert slug("The benchmark: 3 seeds, two users, a perfect and an imperfect judge") == (
        "the-benchmark-3-seeds-two-users-a-perfect-and-an-imperfect-judge")


def test_a_readme_over_300_lines_is_named(tmp_path, monkeypatch):
    import tests.test_docs_links as this
    repo = _tree(tmp_path, {"README.md": "line\n" * 301})
    monkeypatch.setattr(this, "REPO", repo)
    try:
        this.test_the_readme_is_an_entry_point_of_at_most_300_lines()
    except AssertionError as error:
        assert "README.md has 301 lines" in str(error) and "line 301" in str(error)
    else:
        raise AssertionError("a 301-line README passed")
