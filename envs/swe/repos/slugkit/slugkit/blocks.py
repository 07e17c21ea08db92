"""Blocks of lines: shared indentation, prefixes, margins, aligned columns and line numbers."""
from __future__ import annotations

from typing import Sequence


def _leading_whitespace(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


def _common_prefix(strings: list[str]) -> str:
    if not strings:
        return ""
    first, last = min(strings), max(strings)
    size = next((i for i, (a, b) in enumerate(zip(first, last)) if a != b), len(first))
    return first[:size]


def dedent(text: str) -> str:
    """`text` without the leading whitespace that all its non-blank lines share; blank lines become empty."""
    lines = text.split("\n")
    margin = _common_prefix([_leading_whitespace(line) for line in lines if line.strip()])
    return "\n".join(line[len(margin):] if line.strip() else "" for line in lines)


def indent(text: str, prefix: str, blank_lines: bool = False) -> str:
    """`prefix` added to every non-blank line (to blank ones too with `blank_lines`)."""
    return "\n".join(prefix + line if blank_lines or line.strip() else line for line in text.split("\n"))


def strip_margin(text: str, marker: str = "|") -> str:
    """Each line that starts with `marker` after its indentation keeps only what follows the marker."""
    out = []
    for line in text.split("\n"):
        stripped = line.lstrip(" \t")
        out.append(stripped[len(marker):] if stripped.startswith(marker) else line)
    return "\n".join(out)


def align_columns(rows: Sequence[Sequence[str]], separator: str = "  ", right: Sequence[int] = ()) -> list[str]:
    """Rows of cells as lines whose columns line up; columns listed in `right` are right-aligned."""
    count = max((len(row) for row in rows), default=0)
    cells = [list(row) + [""] * (count - len(row)) for row in rows]
    widths = [max(len(row[col]) for row in cells) for col in range(count)]
    lines = []
    for row in cells:
        padded = [cell.rjust(width) if col in right else cell.ljust(width)
                  for col, (cell, width) in enumerate(zip(row, widths))]
        lines.append(separator.join(padded).rstrip())
    return lines


def number_lines(text: str, start: int = 1, separator: str = " | ") -> str:
    """Every line prefixed with its number, the numbers right-aligned to the widest."""
    lines = text.split("\n")
    width = len(str(start + len(lines) - 1))
    return "\n".join(f"{number:>{width}}{separator}{line}" for number, line in enumerate(lines, start=start))
