"""benchmarks/judge_truth.py on a run directory built by hand: the real pool store, the tiny model's real
tokenizer, two users with their own adapter slots; every agreement counted is known in advance."""
from __future__ import annotations

import asyncio
import json

from benchmarks.judge_truth import hint_uptake, judge_agreement
from clawr1.chat import ChatRenderer
from clawr1.config import save_config
from clawr1.devtools import local_config
from clawr1.model_path import load_tokenizer
from clawr1.pool.store import SamplePool
from clawr1.protocol import Sample
from envs.personal.phrases import SYSTEM_PROMPT
from tests.conftest import engine_metric


def sample(tokenizer, i: int, slot: int, answer: str, reward: float, hint: str = "") -> Sample:
    chat = ChatRenderer(tokenizer)
    prompt = chat.encode_messages([{"role": "system", "content": SYSTEM_PROMPT},
                                   {"role": "user", "content": "What is 3 km + 4 km?"}])
    response = chat.encode(answer)
    n = len(response)
    return Sample(sample_id=f"s{i}", group_id="", tokens=prompt + response, prompt_len=len(prompt),
                  loss_mask=[1] * n, rollout_logprobs=[-1.0] * n, versions=[0] * n, reward=reward, hint=hint,
                  adapter_slot=slot)


def hand_built_run(tiny_model, tmp_path):
    """A per-user run's directory: its config, its users' slots, a pool of five judged turns."""
    cfg = local_config(tmp_path, f"model.path={tiny_model}", "lora.enabled=true", "lora.per_user=true",
                       "lora.slots=2", "rollout.env_args.users=[4, 2001]", "rollout.env_args.reader=free_text",
                       "rollout.env_args.user_kinds={4: [tone], 2001: [tone]}")
    save_config(cfg, tmp_path / "config.yaml")
    (tmp_path / "gateway").mkdir()
    (tmp_path / "gateway" / "adapter_slots.json").write_text(json.dumps({"u2001": 0, "u4": 1}))
    tok = load_tokenizer(cfg.model, tiny_model)
    # u4 wants "Sure!", u2001 "Certainly.": the same answer is right for one and wrong for the other
    samples = [sample(tok, 0, 1, "Sure! 7 km", 1.0),                              # u4, right, +1: agrees
               sample(tok, 1, 0, "Sure! 7 km", 1.0),                              # u2001, wrong, +1: disagrees
               sample(tok, 2, 0, "Sure! 7 km", -1.0, "Start with Certainly."),    # u2001, wrong, -1: agrees
               sample(tok, 3, 0, "Certainly. 7 km", 0.0),                         # abstained: not scored
               sample(tok, 4, 1, "Certainly. 7 km", -1.0, "Say Sure!")]           # u4, wrong, -1: agrees
    pool = SamplePool(tmp_path / "pool", max_staleness=4)
    assert all(ack.ok for ack in pool.add(samples))


def test_agreement_is_the_judges_sign_against_each_users_own_wishes(tiny_model, tmp_path):
    hand_built_run(tiny_model, tmp_path)
    got = judge_agreement(tmp_path)
    assert got == {"turns": 5, "scored": 4, "agree": 3, "wrong_answers": 3, "hints_on_wrong": 2,
                   "hints_on_right": 0, "agreement": 0.75}


def test_the_hints_uptake_answers_each_hinted_turn_again_without_and_with_its_hint(tiny_model, tmp_path, engine):
    hand_built_run(tiny_model, tmp_path)
    before = engine_metric(engine, "requests_total")
    got = asyncio.run(hint_uptake(tmp_path, engine))
    assert engine_metric(engine, "requests_total") - before == 4  # 2 hinted turns, each answered twice
    assert got["hinted_turns"] == 2
    # rates of 2 answers each: 0, 1/2 or 1; the uptake is their difference
    assert {got["satisfied_without"], got["satisfied_with"]} <= {0.0, 0.5, 1.0}
    assert got["uptake"] == got["satisfied_with"] - got["satisfied_without"]
