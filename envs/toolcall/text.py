"""Matching required outputs in free text: case, whitespace and number formatting do not matter.

`normalize("Refunded $1,299.50 ")` is `"refunded $1299.5"`: lower case, runs of whitespace
collapsed, thousands separators dropped and trailing decimal zeros removed (12.50 -> 12.5,
64.00 -> 64). `contains(text, needle)` then looks for the normalized needle with edges that
cannot cut through a word or a number, so "12.5" is not found in "112.5" or "12.55".
"""
from __future__ import annotations

import re

# a number may end a sentence ("12.50.") or a clause ("1,299, and"): only a digit next to it extends it
_THOUSANDS = re.compile(r"(?<![\d.,])\d{1,3}(?:,\d{3})+(?!\d)(?!,\d)")
_DECIMAL = re.compile(r"(?<!\d)(?<!\d\.)(\d+)\.(\d+)(?!\d)(?!\.\d)")
_SPACE = re.compile(r"\s+")


def _trim_zeros(m: re.Match) -> str:
    frac = m.group(2).rstrip("0")
    return f"{m.group(1)}.{frac}" if frac else m.group(1)


def normalize(text: str) -> str:
    text = text.lower().replace("\u2019", "'")  # curly apostrophe: "can’t" is "can't"
    text = _THOUSANDS.sub(lambda m: m.group(0).replace(",", ""), text)
    text = _DECIMAL.sub(_trim_zeros, text)
    return _SPACE.sub(" ", text).strip()


def _pattern(needle: str) -> re.Pattern:
    start = end = ""
    if needle[0].isalnum():
        start = r"(?<![0-9a-z])" + (r"(?<![0-9]\.)" if needle[0].isdigit() else "")
    if needle[-1].isalnum():
        end = r"(?![0-9a-z])" + (r"(?!\.[0-9])" if needle[-1].isdigit() else "")
    return re.compile(start + re.escape(needle) + end)


def contains(text: str, needle: str) -> bool:
    """Whether `needle` appears in `text`, both normalized, on word/number boundaries."""
    needle = normalize(needle)
    return bool(needle) and _pattern(needle).search(normalize(text)) is not None
