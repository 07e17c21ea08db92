"""English word forms: plurals, ordinals, lists of words, most frequent words."""
from __future__ import annotations

import re

from slugkit.text import count_words

IRREGULAR_PLURALS = {
    "child": "children", "foot": "feet", "goose": "geese", "man": "men", "mouse": "mice",
    "person": "people", "tooth": "teeth", "woman": "women",
}
UNCOUNTABLE = frozenset({"deer", "equipment", "fish", "information", "news", "series", "sheep", "species"})
F_TO_VES = frozenset({"calf", "half", "knife", "leaf", "life", "loaf", "self", "shelf", "wife", "wolf"})
ORDINAL_SUFFIXES = {1: "st", 2: "nd", 3: "rd"}


def _plural_of(word: str) -> str:
    lower = word.lower()
    if lower in IRREGULAR_PLURALS:
        return word[0] + IRREGULAR_PLURALS[lower][1:]
    if lower in F_TO_VES:
        return re.sub(r"fe?$", "ves", word, flags=re.IGNORECASE)
    if re.search(r"(s|x|z|ch|sh)$", lower):
        return word + "es"
    if re.search(r"[^aeiou]y$", lower):
        return word[:-1] + "ies"
    return word + "s"


def pluralize(word: str, count: int | None = None) -> str:
    """The plural of an English noun, or `word` itself when `count` is 1; an all-caps word stays all caps."""
    if count == 1 or not word or word.lower() in UNCOUNTABLE:
        return word
    plural = _plural_of(word)
    return plural.upper() if len(word) > 1 and word.isupper() else plural


def count_noun(count: int, word: str) -> str:
    """`count_noun(3, "file")` -> `"3 files"`; `count_noun(1, "file")` -> `"1 file"`."""
    return f"{count} {pluralize(word, count)}"


def ordinal(n: int) -> str:
    """`1` -> `1st`, `12` -> `12th`, `22` -> `22nd`, `113` -> `113th`."""
    if abs(n) % 100 in (11, 12, 13):
        return f"{n}th"
    return f"{n}{ORDINAL_SUFFIXES.get(abs(n) % 10, 'th')}"


def join_words(items: list[str], conjunction: str = "and", serial_comma: bool = True) -> str:
    """`["a", "b", "c"]` -> `"a, b, and c"`; two items are joined by the conjunction alone."""
    if len(items) <= 2:
        return f" {conjunction} ".join(items)
    last_separator = f", {conjunction} " if serial_comma else f" {conjunction} "
    return ", ".join(items[:-1]) + last_separator + items[-1]


def top_words(text: str, n: int, ignore: frozenset[str] = frozenset()) -> list[tuple[str, int]]:
    """The `n` most frequent words of `text` with their counts, ties in alphabetical order."""
    counts = count_words(text)
    ranked = sorted((item for item in counts.items() if item[0] not in ignore), key=lambda item: (-item[1], item[0]))
    return ranked[:n]
