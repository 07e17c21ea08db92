"""Answer-style preferences a simulated user can hold, and how to check them.

An answer is built from independent parts, each chosen from a small set of
options. A user profile fixes one option per kind; a response satisfies the
profile when every part matches. The tiny model learns every option during its
warm start, so RL only has to shift which option it prefers.

    [opener] [answer in some format, units in some style] [explanation] [closing]
    "Sure! The answer is 7 kilometers, since 3 + 4 = 7. Hope this helps!"
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Callable

from envs.personal.phrases import heldout_phrasings

UNIT_WORDS = {
    "km": "kilometers", "m": "meters", "cm": "centimeters", "kg": "kilograms",
    "g": "grams", "L": "liters", "h": "hours", "min": "minutes",
}

KINDS = ("format", "units", "tone", "length", "closing")

OPTIONS: dict[str, tuple[str, ...]] = {
    "format": ("plain", "tags", "sentence"),
    "units": ("symbol", "word"),
    "tone": ("none", "sure", "certainly"),
    "length": ("short", "explain"),
    "closing": ("none", "thanks"),
}

# What a user says to ask for an option, phrased as a directive (used both in
# corrections and in the warm-start data so the model learns to follow them).
DIRECTIVES: dict[str, dict[str, str]] = {
    "format": {
        "plain": "give just the number with its unit, nothing else around it",
        "tags": "put the answer in <ans> tags",
        "sentence": "answer in a full sentence starting with 'The answer is'",
    },
    "units": {
        "symbol": "write units as symbols like km",
        "word": "spell out the units like kilometers",
    },
    "tone": {
        "none": "skip the pleasantries at the start",
        "sure": "start your reply with 'Sure!'",
        "certainly": "start your reply with 'Certainly.'",
    },
    "length": {
        "short": "do not explain, just answer",
        "explain": "explain the sum after the answer",
    },
    "closing": {
        "none": "no sign-off at the end",
        "thanks": "end with 'Hope this helps!'",
    },
}

# Tool use is a preference only when the user's client offers the calculator tool.
TOOL_OPTIONS = ("none", "calculator")
TOOL_DIRECTIVES = {"none": "answer without using tools", "calculator": "use the calculator tool before answering"}
CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}

OPENERS = {"none": "", "sure": "Sure! ", "certainly": "Certainly. "}
CLOSINGS = {"none": "", "thanks": " Hope this helps!"}


@dataclass(frozen=True)
class Question:
    text: str
    a: int
    b: int
    unit: str

    @property
    def answer(self) -> int:
        return self.a + self.b


Style = dict[str, str]  # kind -> option


def random_style(rng: random.Random) -> Style:
    return {kind: rng.choice(OPTIONS[kind]) for kind in KINDS}


def render_answer(q: Question, style: Style) -> str:
    unit = q.unit if style["units"] == "symbol" else UNIT_WORDS[q.unit]
    value = f"{q.answer} {unit}"
    core = {"plain": value, "tags": f"<ans>{value}</ans>", "sentence": f"The answer is {value}."}[style["format"]]
    if style["length"] == "explain":
        core += f" Because {q.a} + {q.b} = {q.answer}."
    return OPENERS[style["tone"]] + core + CLOSINGS[style["closing"]]


def directive_text(wanted: Style) -> str:
    """'Please put the answer in <ans> tags and end with ...' for the given kinds."""
    parts = [TOOL_DIRECTIVES[option] if kind == "tool" else DIRECTIVES[kind][option] for kind, option in wanted.items()]
    if not parts:
        return ""
    body = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return f"Please {body}."


def free_wish_text(wanted: Style, rng: random.Random) -> str:
    """The wishes as a user speaking freely words them: one held-out phrasing per option, a sentence each
    ("Could you wrap the result in <ans> tags? Spell the units out please.")."""
    sentences = []
    for kind, option in wanted.items():
        text = rng.choice(heldout_phrasings(kind, option))
        sentences.append(text[0].upper() + text[1:] + ("" if text.endswith(("?", "!", ".")) else "."))
    return " ".join(sentences)


# ---------------------------------------------------------------- checking
_OPENER_RE = {"sure": re.compile(r"^Sure! "), "certainly": re.compile(r"^Certainly\. ")}
_NUMBER_UNIT = r"(-?\d+) ([A-Za-z]+)"


def parse_style(text: str) -> Style:
    """Read which option of each kind a response shows ('?' where none fits)."""
    text = text.strip()
    style: Style = {}
    style["tone"] = next((k for k, r in _OPENER_RE.items() if r.search(text)), "none")
    rest = text[len(OPENERS[style["tone"]]):] if style["tone"] != "none" else text
    style["closing"] = "thanks" if rest.endswith("Hope this helps!") else "none"
    if style["closing"] == "thanks":
        rest = rest[: -len("Hope this helps!")].rstrip()
    explained = re.search(r" Because \d+ \+ \d+ = \d+\.$", rest)
    style["length"] = "explain" if explained else "short"
    if explained:
        rest = rest[: explained.start()]
    if m := re.fullmatch(rf"<ans>{_NUMBER_UNIT}</ans>", rest):
        style["format"] = "tags"
    elif m := re.fullmatch(rf"The answer is {_NUMBER_UNIT}\.", rest):
        style["format"] = "sentence"
    elif m := re.fullmatch(_NUMBER_UNIT, rest):
        style["format"] = "plain"
    else:
        style["format"] = "?"
    unit = m.group(2) if m else ""
    style["units"] = "symbol" if unit in UNIT_WORDS else "word" if unit in UNIT_WORDS.values() else "?"
    return style


_SYMBOL_UNIT = re.compile(r"\d\s?(" + "|".join(UNIT_WORDS) + r")\b")
_WORD_UNIT = re.compile(r"\d\s?((kilo|centi)?met(er|re)s?|(kilo)?grams?|lit(er|re)s?|hours?|minutes?)\b", re.IGNORECASE)


def read_free_text(text: str) -> Style:
    """Which option of each kind a free-text answer shows, read leniently ('?' where it shows none or both).

    For pretrained models, which answer in their own words ("3 km + 4 km = 7 km. So, the total is 7
    kilometers."): a part counts wherever it appears. The tiny model's exact shapes read as parse_style reads them.
    """
    exact = parse_style(text)
    if "?" not in exact.values():
        return exact
    text = text.strip()
    lower = text.lower()
    symbol, word = bool(_SYMBOL_UNIT.search(text)), bool(_WORD_UNIT.search(text))
    return {
        "tone": "sure" if lower.startswith("sure") else "certainly" if lower.startswith("certainly") else "none",
        "closing": "thanks" if "hope this helps" in lower else "none",
        "length": "explain" if re.search(r"\d\s?\+\s?\d", text) else "short",
        "format": ("tags" if re.search(r"<ans>.*</ans>", text, re.DOTALL) else
                   "sentence" if "the answer is" in lower else
                   "plain" if re.fullmatch(rf"{_NUMBER_UNIT}\.?", text) else "?"),
        "units": "symbol" if symbol and not word else "word" if word and not symbol else "?",
    }


Reader = Callable[[str], Style]
READERS: dict[str, Reader] = {"exact": parse_style, "free_text": read_free_text}


def violations(text: str, profile: Style, read: Reader = parse_style) -> Style:
    """The profile's options that the response does not show, by kind."""
    shown = read(text)
    return {kind: option for kind, option in profile.items() if shown.get(kind) != option}
