"""Text helpers. Every function is pure and works on str."""
from __future__ import annotations

import re
import unicodedata

SMALL_WORDS = frozenset({"a", "an", "and", "as", "at", "but", "by", "for", "in", "of", "on", "or", "the", "to"})


def slugify(text: str, separator: str = "-", max_length: int | None = None) -> str:
    """A URL slug: ASCII, lower case, runs of other characters collapsed to one separator."""
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    words = re.split(r"[^a-z0-9]+", ascii_text.lower())
    slug = separator.join(word for word in words if word)
    if max_length is not None and len(slug) > max_length:
        slug = slug[:max_length].rstrip(separator)
    return slug


def truncate(text: str, width: int, suffix: str = "...") -> str:
    """`text` cut to at most `width` characters, ending in `suffix` when something was cut."""
    if width < 0:
        raise ValueError(f"width must be non-negative, got {width}")
    if len(text) <= width:
        return text
    if width <= len(suffix):
        return suffix[:width]
    return text[: width - len(suffix)] + suffix


def camel_to_snake(name: str) -> str:
    """`parseHTTPResponse` -> `parse_http_response`; acronyms stay together."""
    step = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    step = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", step)
    return step.lower()


def snake_to_camel(name: str, upper_first: bool = False) -> str:
    """`parse_http_response` -> `parseHttpResponse` (or `ParseHttpResponse`)."""
    parts = [p for p in name.split("_") if p]
    if not parts:
        return ""
    head = parts[0].capitalize() if upper_first else parts[0].lower()
    return head + "".join(p.capitalize() for p in parts[1:])


def title_case(text: str) -> str:
    """Title case that keeps small words lower case, except the first and the last word."""
    words = text.split()
    out = []
    for i, word in enumerate(words):
        if 0 < i < len(words) - 1 and word.lower() in SMALL_WORDS:
            out.append(word.lower())
        else:
            out.append(word[:1].upper() + word[1:].lower())
    return " ".join(out)


def count_words(text: str) -> dict[str, int]:
    """How often each word (lower case, letters, digits and apostrophes) occurs."""
    counts: dict[str, int] = {}
    for word in re.findall(r"[a-z0-9']+", text.lower()):
        word = word.strip("'")
        if word:
            counts[word] = counts.get(word, 0) + 1
    return counts


def wrap(text: str, width: int) -> list[str]:
    """Greedy word wrap: lines of at most `width` characters (a longer word gets a line of its own)."""
    if width < 1:
        raise ValueError(f"width must be at least 1, got {width}")
    lines: list[str] = []
    current = ""
    for word in text.split():
        if not current:
            current = word
        elif len(current) + 1 + len(word) <= width:
            current += " " + word
        else:
            lines.append(current)
            current = word
    if current:
        lines.append(current)
    return lines
