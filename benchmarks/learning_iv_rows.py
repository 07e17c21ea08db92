"""Learning IV's design, fixed before any learning run: the users drawn, the rule that gives each their kinds,
the rows (a judge setting and a horizon), what every recipe shares, and one row's runs.

Only the objective differs between a row's runs: recipes/{binary_rl,opd,combined}/cpu_qwen05_lora.yaml with the
same users, seed, lr, teacher (the base with the hint, adapter off), steps, batch and sampling.
"""
from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.judge_truth import hint_uptake, judge_agreement  # noqa: E402
from benchmarks.runs import Run, final_and_area  # noqa: E402
from clawr1.report import load_run  # noqa: E402

DATA = REPO / "docs/benchmarks/learning-iv"
OUT = REPO / "runs/learning_iv"
# the base model served alone: for the probe, and for the uptake of the llm judge's hints
SERVING = ["model.name=qwen2.5-coder-0.5b-instruct", "lora.enabled=false", "serve.max_running_requests=16",
           "serve.context_length=2048"]

# profile seeds no earlier benchmark or test used (tests and sweeps: 0-4; benchmarks/fair.py: 1000-1005). Nothing
# is tuned (one lr for all, LR), so there are no tuning users; any later tuning draws its own
USERS = {"evaluation": list(range(2001, 2015))}
MOST_USERS = 8  # adapters one run trains at once (lora.slots): the first 8 chosen users by seed
UPTAKE_MIN, BASE_MAX = 0.3, 0.5
RULE = (f"a kind counts when the probe's uptake (16 held-out questions, the user's own held-out words as the hint) "
        f"is >= {UPTAKE_MIN} and the base satisfies it without the hint in fewer than {BASE_MAX:.0%} of the answers; "
        f"a user holds only the kinds that count and needs at least one; a user who would hold the same wishes as "
        f"an earlier one is skipped; the first {MOST_USERS} users so chosen, by seed")

# each run's name: (recipe folder, what it adds). CONTRASTIVE: OPD and combined with the contrastive teacher
# baseline (the teacher's log-prob without the hint subtracted instead of the student's: algo.opd_baseline=teacher)
RECIPES = {"binary_rl": ("binary_rl", ()), "opd": ("opd", ()), "combined": ("combined", ())}
CONTRASTIVE = {"opd contrastive": ("opd", ("algo.opd_baseline=teacher",)),
               "combined contrastive": ("combined", ("algo.opd_baseline=teacher",))}
SEED = 58
LR = 5e-4  # one lr for all recipes, not tuned: Tinker's LoRA rule for a Qwen of hidden size 896 (the recipes')
SAMPLES_PER_USER = 4  # a step: each user's GRPO group of 4 sessions asking the same questions
JUDGE = {
    # 1. the rules judge with no error injected (accuracy 1.0; it still misreads some follow-ups: judge_truth.py),
    # its hints the directives it maps the user's words to
    "directive": ["judge.rules_hint=directive"],
    # 2. the rules judge wrong 30% of the time: flipped scores, and hints that contradict the user's wish
    "noisy": ["judge.rules_hint=directive", "judge.score_noise=0.3", "judge.hint_noise=0.3",
              "judge.hint_noise_kind=contradict"],
    # 3. OpenClaw-RL's own: the base model (the serving engine without an adapter) as the llm judge, m = 3 votes
    # and 3 hint votes a turn from the user's free-worded follow-up
    "llm": ["judge.backend=llm", "judge.prm=policy", "judge.llm_api=generate"],
}
# row: (judge setting, steps, its runs), in the order they run; the contrastive baseline in the first row only (a
# 16-step run is about 100 minutes on 2 cores). directive-48 runs before llm-16, and its OPD and combined first:
# the llm judge's first run filled its pool 5x slower than the rules judge's (about 9 hours a run) with a judge
# that on this base decides 1 turn in 9 and writes no hint (docs/real_model.md, "The llm judge on this base"),
# while the 48-step row answers the open question, whether combined catches OPD up given more steps
ROWS = {"directive-16": ("directive", 16, {**RECIPES, **CONTRASTIVE}), "noisy-16": ("noisy", 16, RECIPES),
        "directive-48": ("directive", 48, {name: RECIPES[name] for name in ("opd", "combined", "binary_rl")}),
        "llm-16": ("llm", 16, RECIPES)}
# what a row adds for every recipe of it: the rows not yet started when trainer.share_prefixes came train on prefix
# trees (the same loss and gradients from about half the tokens: benchmarks/prefix_sharing.py); the first two
# rows' runs all trained flat, so within every row the recipes train alike
ROW_SETTINGS = {"llm-16": ("trainer.share_prefixes=true",), "directive-48": ("trainer.share_prefixes=true",)}


def read_json(path: Path) -> dict:
    """A JSON file of docs/benchmarks/learning-iv/ ({} while it does not exist)."""
    return json.loads(path.read_text()) if path.exists() else {}


def write_json(path: Path, data: dict) -> None:
    """A JSON file of docs/benchmarks/learning-iv/, in the committed layout (sorted keys, one-space indent)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def counted_kinds(probe: dict) -> list[str]:
    """The kinds of a probed user that count under RULE."""
    return [k for k in probe["profile"]
            if probe[f"uptake_{k}"] >= UPTAKE_MIN and probe[f"hinted_{k}"] - probe[f"uptake_{k}"] < BASE_MAX]


def choose(probed: dict[int, dict]) -> dict[str, list[str]]:
    """Each chosen user's kinds, by profile seed: users with at least one counted kind and wishes no earlier
    user holds (profiles repeat: 5 kinds of 2-3 options give 72), the first MOST_USERS."""
    chosen: dict[str, list[str]] = {}
    held = set()
    for user in sorted(probed):
        kinds = counted_kinds(probed[user])
        wishes = tuple((k, probed[user]["profile"][k]) for k in kinds)
        if kinds and wishes not in held and len(chosen) < MOST_USERS:
            held.add(wishes)
            chosen[str(user)] = kinds
    return chosen


def shared_settings(users: dict[str, list[str]], steps: int) -> list[str]:
    """What every recipe's run of a row shares: the users with their kinds, one adapter each, the seed, the lr,
    the batch (SAMPLES_PER_USER a user), the answers in flight, the users' free wording, 5 evaluations,
    checkpoints to resume from."""
    seeds = [int(u) for u in users]
    kinds = "{" + ", ".join(f"{u}: [{', '.join(k)}]" for u, k in users.items()) + "}"
    return [f"run.seed={SEED}", f"run.max_steps={steps}", f"trainer.lr={LR:g}",
            f"rollout.env_args.users={seeds}", f"rollout.env_args.user_kinds={kinds}",
            "rollout.env_args.phrasing=free", f"rollout.env_args.group_size={SAMPLES_PER_USER}",
            f"pool.group_size={SAMPLES_PER_USER}", f"pool.batch_size={SAMPLES_PER_USER * len(users)}",
            f"rollout.max_pool_backlog={2 * SAMPLES_PER_USER * len(users)}",
            # 2 episodes of 4 sessions: the recipe's 8 answers at a time. 8 episodes (32 sessions) on its 16-request
            # engine made requests wait past 120 s: episodes failed and an evaluation never ended. A request may
            # wait 15 minutes behind the evaluations' 128 questions on 2 cores
            "rollout.concurrency=2", "rollout.request_timeout_s=900",
            # the trainer's wait for its first batch includes the base's evaluation (7 minutes for 8 users)
            "trainer.batch_wait_timeout_s=1800",
            "lora.per_user=true", f"lora.slots={len(users)}", f"rollout.eval_every={steps // 4}",
            "rollout.eval_size=16", "trainer.checkpoint_every=4"]


def row_runs(row: str) -> dict[str, Run]:
    """Each recipe's run of `row`, by name, with the row's users and settings."""
    if row not in ROWS:
        raise SystemExit(f"unknown row {row!r}: one of {list(ROWS)}")
    setting, steps, runs = ROWS[row]
    users_file = DATA / "users.json"
    if not users_file.exists():
        raise SystemExit("no users chosen yet: run `python benchmarks/learning_iv.py probe`, then `select`")
    users = read_json(users_file)["evaluation"]
    return {name: Run(OUT / row, name.replace(" ", "_"), REPO / "recipes" / recipe / "cpu_qwen05_lora.yaml",
                      tuple(shared_settings(users, steps) + JUDGE[setting] + list(ROW_SETTINGS.get(row, ())) +
                            list(extra)))
            for name, (recipe, extra) in runs.items()}


def run_row(row: str, limit: int | None = None) -> int:
    """Every recipe's run of `row`, each one's per-user results saved as it ends; returns how many ran. A run
    whose results are committed under its name is skipped: its run directory may be on another machine. With
    `limit`, at most that many run (a sitting that has time for one run ends after it)."""
    saved = read_json(DATA / "runs" / f"{row}.json").get("recipes", {})
    ran = 0
    for name, run in row_runs(row).items():
        if saved.get(name, {}).get("run") == run.path.name:
            continue
        if limit is not None and ran >= limit:
            return ran
        ran += 1
        if not run.finished:
            print(f"[learning_iv] {row} {name}: {run.path.relative_to(REPO)}", flush=True)
        minutes = run.start()
        save_result(row, name, run, minutes)
    if ROWS[row][0] == "llm":
        add_hint_uptake(row)
    return ran


def add_hint_uptake(row: str) -> None:
    """Each run's entry in runs/<row>.json gains the uptake of its judge's hints by the base model, on an engine
    started for it (benchmarks/judge_truth.py), once."""
    from clawr1.agent_bench import serving_stack
    from clawr1.config import load_config

    out = DATA / "runs" / f"{row}.json"
    data = read_json(out)
    todo = [name for name, r in data["recipes"].items() if "hints" not in r]
    if not todo:
        return
    with tempfile.TemporaryDirectory() as tmp, \
            serving_stack(str(REPO / "recipes/combined/cpu_qwen05_lora.yaml"), SERVING, Path(tmp)):
        engine_url = load_config(Path(tmp) / "config.yaml").engine_url
        for name in todo:
            run_dir = OUT / row / data["recipes"][name]["run"]
            data["recipes"][name]["hints"] = asyncio.run(hint_uptake(run_dir, engine_url))
            write_json(out, data)


def per_user_curves(path: Path) -> dict[str, list[tuple[int, float]]]:
    """Each user's held-out score at every evaluated version of the run in `path`."""
    return load_run(path).per_user["score"]


def per_user_result(curve: list[tuple[int, float]]) -> dict:
    final, area = final_and_area(curve)
    return {"final": final, "area": round(area, 6), "curve": curve}


def save_result(row: str, recipe: str, run: Run, minutes: float) -> None:
    """runs/<row>.json gains the recipe's per-user final score, area (mean over evaluations) and curve, and how
    often its judge agreed with the users' truth (minutes: this sitting's; 0 for a run that finished before)."""
    out = DATA / "runs" / f"{row}.json"
    data = read_json(out) or {"row": row, "recipes": {}}
    curves = per_user_curves(run.path)
    data["recipes"][recipe] = {
        "run": run.path.name, "overrides": list(run.overrides), "minutes": round(minutes, 1),
        "judge": judge_agreement(run.path),
        "users": {u.removeprefix("u"): per_user_result(c) for u, c in sorted(curves.items())}}
    write_json(out, data)
