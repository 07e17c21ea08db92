"""How often a finished run's judge agreed with its simulated users (envs/personal), from the run directory alone.

Every trained turn is in the run's pool with the judge's score and hint. Its truth is whether the answer satisfied
every wish its user holds (the user of its adapter slot, RUN_DIR/gateway/adapter_slots.json), read as the
environment reads answers. So the rules judge at accuracy 1.0 should agree on every scored turn, at 0.7 on about
70%, and an `llm` judge measures itself against the simulator's truth.

    python benchmarks/judge_truth.py RUN_DIR    # prints one JSON line
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from clawr1.config import load_config  # noqa: E402
from clawr1.model_path import load_tokenizer, resolve_model_path  # noqa: E402
from clawr1.pool.store import read_samples  # noqa: E402
from envs.personal.env import PersonalEnv  # noqa: E402
from envs.personal.preferences import violations  # noqa: E402


def judge_agreement(run_dir: Path) -> dict:
    """Counts of scored turns, the judge's agreement with the truth, and where its hints went."""
    cfg = load_config(run_dir / "config.yaml")
    env = PersonalEnv(cfg.rollout.env_args, cfg.run.seed)
    slots = json.loads((run_dir / "gateway" / "adapter_slots.json").read_text()) if cfg.lora.per_user else {}
    user_of = {slot: user for user, slot in slots.items()}
    tokenizer = load_tokenizer(cfg.model, resolve_model_path(cfg.model))
    counts = dict.fromkeys(("turns", "scored", "agree", "wrong_answers", "hints_on_wrong", "hints_on_right"), 0)
    for sample in read_samples(run_dir / "pool"):
        user = user_of.get(sample.adapter_slot, next(iter(env.profiles)))
        answer = tokenizer.decode(sample.tokens[sample.prompt_len:], skip_special_tokens=True)
        right = not violations(answer, env.profiles[user], env.read)
        counts["turns"] += 1
        counts["wrong_answers"] += not right
        counts["hints_on_wrong" if not right else "hints_on_right"] += bool(sample.hint)
        if sample.reward:  # 0 or None: the judge abstained
            counts["scored"] += 1
            counts["agree"] += (sample.reward > 0) == right
    return {**counts, "agreement": round(counts["agree"] / counts["scored"], 4) if counts["scored"] else None}


def main() -> int:
    print(json.dumps({"benchmark": "judge_truth", **judge_agreement(Path(sys.argv[1]))}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
