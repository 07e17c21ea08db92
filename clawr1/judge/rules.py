"""The `rules` judge: scores and hints from the next state, with no model.

- explicit feedback score -> its sign;
- an environment outcome -> its reward, and its text as the hint when negative;
- a user reply that corrects ("No. Please put the answer in <ans> tags.") -> -1,
  the directive sentences as the hint (or, with `judge.rules_hint: directive`, the configured option
  directives the reply asks for: clawr1/judge/directives.py; none when it names no option);
- a user reply that re-asks the same question -> -1, no hint;
- a tool reply whose structured status says the call failed (`{"ok": false, "error": ...}`, a non-zero
  `exit_code`, `timed_out`: the format of envs/agentic's tool messages, one JSON object per tool
  message) -> -1, the error as the hint; a tool reply that is not structured gives no score: the
  words in free text ("error" in a file the agent printed) are never read as a verdict;
- a user reply that moves on -> +1.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Callable, Optional

from clawr1.protocol import TurnRecord
# A sentence runs to . ! ? or a line end, but a quoted span ('Certainly.', "Hope this helps!") is one piece:
# a quote opens after a non-letter (so the apostrophe in "don't" opens nothing) and closes before one.
_QUOTED = r"""(?<![A-Za-z])'[^'\n]*'(?![A-Za-z])|(?<![A-Za-z])"[^"\n]*"(?![A-Za-z])"""
_SENTENCE = re.compile(rf"(?:{_QUOTED}|[^.!?\n])+[.!?]?")


@dataclass
class Verdict:
    score: Optional[float]  # None: no evaluative signal
    hint: str = ""
    votes: list[int] = field(default_factory=list)
    reason: str = ""


def sentences(text: str) -> list[str]:
    """The sentences of `text`, stripped (a quoted span stays inside its sentence)."""
    return [s.strip() for s in _SENTENCE.findall(text) if s.strip()]


def directive_sentences(text: str, patterns: list[re.Pattern], min_words: int = 3) -> str:
    """The sentences of `text` that match a correction pattern and say something (>= min_words words)."""
    picked = [s for s in sentences(text) if any(p.search(s) for p in patterns) and len(s.split()) >= min_words]
    return " ".join(picked)


def _last_user_text(record: TurnRecord) -> str:
    return next((str(m.get("content") or "") for m in reversed(record.messages) if m.get("role") == "user"), "")


def _is_reask(next_text: str, previous_question: str) -> bool:
    q = previous_question.strip()
    return len(q) > 8 and q in next_text


def tool_failure(text: str) -> Optional[str]:
    """What went wrong, if any structured tool result (one JSON object per line) says its call failed."""
    for line in text.splitlines():
        try:
            status = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(status, dict) or "ok" not in status:
            continue
        exit_code = status.get("exit_code")
        if status["ok"] is False or status.get("timed_out") or (isinstance(exit_code, int) and exit_code != 0):
            why = status.get("error") or ("timed out" if status.get("timed_out") else f"exit code {exit_code}")
            return f"The tool call failed: {why}"
    return None


@dataclass
class RulePatterns:
    corrections: list[re.Pattern]
    directives: list[re.Pattern]

    @classmethod
    def compile(cls, corrections: list[str], directives: list[str]) -> "RulePatterns":
        return cls([re.compile(p, re.I) for p in corrections], [re.compile(p, re.I) for p in directives])


DirectiveHint = Callable[[str], str]  # a user reply -> the option directives it asks for ("" for none)


def judge_rules(record: TurnRecord, patterns: RulePatterns, max_hint_chars: int = 400,
                directive_hint: Optional[DirectiveHint] = None) -> Verdict:
    """The verdict on a turn from its next state; with `directive_hint`, a correcting user reply's hint is the
    directives it maps to (the score is the same as without)."""
    ns = record.next_state
    if ns is None or ns.kind == "none":
        return Verdict(None, reason="no next state")
    if ns.score is not None:
        return Verdict(float((ns.score > 0) - (ns.score < 0)), hint=ns.text[:max_hint_chars] if ns.score < 0 else "",
                       reason="explicit feedback")
    if ns.kind == "outcome":
        hint = ns.text[:max_hint_chars] if (ns.reward is not None and ns.reward < 0) else ""
        return Verdict(ns.reward, hint=hint, reason="outcome")
    if ns.kind == "tool":
        failure = tool_failure(ns.text)
        if failure is not None:
            return Verdict(-1.0, hint=failure[:max_hint_chars], reason="tool call failed")
        return Verdict(None, reason="tool output without a verdict")
    directive = directive_sentences(ns.text, patterns.directives)
    complaint = any(p.search(ns.text) for p in patterns.corrections)
    if directive_hint is not None and (directive or complaint):
        hint = directive_hint(ns.text)
        reason = "correction" if hint else "correction, unmapped" if directive else "complaint"
        return Verdict(-1.0, hint=hint[:max_hint_chars], reason=reason)
    if directive:
        return Verdict(-1.0, hint=directive[:max_hint_chars], reason="correction")
    if complaint:
        return Verdict(-1.0, reason="complaint")
    if _is_reask(ns.text, _last_user_text(record)):
        return Verdict(-1.0, reason="re-ask")
    return Verdict(1.0, reason="moved on")
