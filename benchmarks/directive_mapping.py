"""How well the rules judge's directive map (`judge.rules_hint: directive`, recipes/personal_directives.yaml)
reads the personal environment's wishes: per option, each wording mapped alone, and corrections as a freely
speaking user says them (one to three wishes, an opener, sometimes a vague complaint).

    python benchmarks/directive_mapping.py [--corrections 2000]

A wording is right when it maps to its own option and nothing else; wrong when it maps to another option (or
to more); unmapped when it maps to nothing. Prints a table to stderr and one JSON line.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from clawr1.config import load_config  # noqa: E402
from clawr1.judge.directives import DirectiveMap  # noqa: E402
from envs.personal.phrases import PHRASINGS, TRAINING_PHRASINGS  # noqa: E402
from envs.personal.preferences import DIRECTIVES, KINDS, OPTIONS, free_wish_text  # noqa: E402


def directive_map(recipe: str = "recipes/combined/cpu.yaml") -> DirectiveMap:
    return DirectiveMap(load_config(REPO / recipe).judge.directives)


def outcome(mapping: DirectiveMap, text: str, wanted: dict[str, str]) -> str:
    """right | wrong | unmapped: whether `text` maps to exactly the options `wanted` names."""
    got = {w.kind: w.option for w in mapping.wishes(text)}
    if not got:
        return "unmapped"
    return "right" if got == wanted else "wrong"


def wordings(part: str) -> list[tuple[str, str, str]]:
    """(kind, option, wording) of the bank's `part`: training (the canonical directive and the training
    phrasings) or heldout."""
    out = []
    for kind in KINDS:
        for option in OPTIONS[kind]:
            bank = PHRASINGS[kind][option]
            texts = [DIRECTIVES[kind][option], *bank[:TRAINING_PHRASINGS]] if part == "training" else bank[TRAINING_PHRASINGS:]
            out += [(kind, option, t) for t in texts]
    return out


def tally(results: list[str]) -> dict[str, float]:
    n = len(results)
    return {"n": n, **{k: round(results.count(k) / n, 4) for k in ("right", "wrong", "unmapped")}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corrections", type=int, default=2000, help="free corrections drawn (1-3 wishes each)")
    args = p.parse_args()
    mapping = directive_map()
    report: dict[str, dict] = {}
    for part in ("training", "heldout"):
        rows = wordings(part)
        report[part] = tally([outcome(mapping, t, {k: o}) for k, o, t in rows])
        report[part]["by_kind"] = {kind: tally([outcome(mapping, t, {k: o}) for k, o, t in rows if k == kind])["right"]
                                   for kind in KINDS}
        report[part]["misread"] = [f"{k}={o}: {t!r} -> {[f'{w.kind}={w.option}' for w in mapping.wishes(t)]}"
                                   for k, o, t in rows if outcome(mapping, t, {k: o}) != "right"]
    rng = random.Random(0)
    drawn = []
    for _ in range(args.corrections):
        kinds = rng.sample(KINDS, rng.randint(1, 3))
        wanted = {k: rng.choice(OPTIONS[k]) for k in kinds}
        drawn.append(outcome(mapping, free_wish_text(wanted, rng), wanted))
    report["free_corrections"] = tally(drawn)
    for part in ("training", "heldout"):
        r = report[part]
        print(f"{part}: {r['n']} wordings, right {r['right']:.2f}, wrong {r['wrong']:.2f}, unmapped {r['unmapped']:.2f}; "
              f"right by kind {r['by_kind']}", file=sys.stderr)
        for line in r["misread"]:
            print(f"  {line}", file=sys.stderr)
    f = report["free_corrections"]
    print(f"free corrections of 1-3 held-out wishes: {f['n']}, right {f['right']:.2f}, wrong {f['wrong']:.2f}, "
          f"unmapped {f['unmapped']:.2f}", file=sys.stderr)
    print(json.dumps({"benchmark": "directive_mapping", **report}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
