"""How often a finished run's judge agreed with its simulated users (envs/personal), from the run directory alone.

Every trained turn is in the run's pool with the judge's score and hint. Its truth is whether the answer satisfied
every wish its user holds (the user of its adapter slot, RUN_DIR/gateway/adapter_slots.json), read as the
environment reads answers. So the rules judge at accuracy 1.0 should agree on every scored turn, at 0.7 on about
70%, and an `llm` judge measures itself against the simulator's truth.

    python benchmarks/judge_truth.py RUN_DIR                      # prints one JSON line
    python benchmarks/judge_truth.py RUN_DIR --engine http://...  # also the uptake of the judge's hints

The uptake of a judge's hints: for each hinted turn (up to --most), the base model on that engine answers the
turn's own prompt without and with the hint as the teacher sees it (spliced into the last user message), and
uptake is the rate at which the hinted answers satisfy the user minus the unhinted ones'.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from clawr1.chat import ChatRenderer  # noqa: E402
from clawr1.config import load_config  # noqa: E402
from clawr1.engine_api.client import EngineClient  # noqa: E402
from clawr1.model_path import load_tokenizer, resolve_model_path  # noqa: E402
from clawr1.pool.store import read_samples  # noqa: E402
from clawr1.protocol import Sample  # noqa: E402
from envs.personal.env import PersonalEnv  # noqa: E402
from envs.personal.preferences import violations  # noqa: E402


class RunUsers:
    """A finished run's users: their wishes, whose adapter slot is whose, and the tokenizer."""

    def __init__(self, run_dir: Path):
        self.cfg = load_config(run_dir / "config.yaml")
        self.env = PersonalEnv(self.cfg.rollout.env_args, self.cfg.run.seed)
        per_user = self.cfg.lora.per_user
        slots = json.loads((run_dir / "gateway" / "adapter_slots.json").read_text()) if per_user else {}
        self.user_of = {slot: user for user, slot in slots.items()}
        self.tokenizer = load_tokenizer(self.cfg.model, resolve_model_path(self.cfg.model))
        self.samples = read_samples(run_dir / "pool")

    def satisfied(self, sample: Sample, ids: list[int]) -> bool:
        """Whether the answer `ids` satisfies every wish of the user `sample` was trained for."""
        user = self.user_of.get(sample.adapter_slot, next(iter(self.env.profiles)))
        answer = self.tokenizer.decode(ids, skip_special_tokens=True)
        return not violations(answer, self.env.profiles[user], self.env.read)


def judge_agreement(run_dir: Path) -> dict:
    """Counts of scored turns, the judge's agreement with the truth, and where its hints went."""
    run = RunUsers(run_dir)
    counts = dict.fromkeys(("turns", "scored", "agree", "wrong_answers", "hints_on_wrong", "hints_on_right"), 0)
    for sample in run.samples:
        right = run.satisfied(sample, sample.tokens[sample.prompt_len:])
        counts["turns"] += 1
        counts["wrong_answers"] += not right
        counts["hints_on_wrong" if not right else "hints_on_right"] += bool(sample.hint)
        if sample.reward:  # 0 or None: the judge abstained
            counts["scored"] += 1
            counts["agree"] += (sample.reward > 0) == right
    return {**counts, "agreement": round(counts["agree"] / counts["scored"], 4) if counts["scored"] else None}


async def hint_uptake(run_dir: Path, engine_url: str, most: int = 64) -> dict:
    """The uptake of the judge's hints by the model on `engine_url` (the base: no adapter is asked for)."""
    run = RunUsers(run_dir)
    renderer = ChatRenderer(run.tokenizer, run.cfg.model.chat_template_kwargs)
    engine = EngineClient(engine_url)
    hinted = [s for s in run.samples if s.hint][:most]
    params = {"max_new_tokens": run.cfg.rollout.max_tokens, "temperature": run.cfg.rollout.temperature}

    async def answer(i: int, ids: list[int]) -> list[int]:
        return (await engine.generate(ids, {**params, "sampling_seed": i})).output_ids

    try:
        plain = await asyncio.gather(*(answer(i, s.tokens[:s.prompt_len]) for i, s in enumerate(hinted)))
        with_hint = await asyncio.gather(*(answer(i, renderer.with_hint(s.tokens[:s.prompt_len], s.hint))
                                           for i, s in enumerate(hinted)))
    finally:
        await engine.close()
    n = len(hinted)
    without = sum(run.satisfied(s, a) for s, a in zip(hinted, plain)) / n if n else None
    with_ = sum(run.satisfied(s, a) for s, a in zip(hinted, with_hint)) / n if n else None
    return {"hinted_turns": n, "satisfied_without": without, "satisfied_with": with_,
            "uptake": None if n == 0 else round(with_ - without, 4)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", type=Path)
    p.add_argument("--engine", default="", help="an engine serving the run's base model, for the hints' uptake")
    p.add_argument("--most", type=int, default=64, help="hinted turns to answer again")
    args = p.parse_args()
    result = judge_agreement(args.run_dir)
    if args.engine:
        result["hints"] = asyncio.run(hint_uptake(args.run_dir, args.engine, args.most))
    print(json.dumps({"benchmark": "judge_truth", **result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
