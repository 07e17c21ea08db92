"""Learning IV (issue 58): binary RL, OPD and combined on Qwen2.5-Coder-0.5B-Instruct, one LoRA adapter per user,
every chosen user in every run, compared user by user. docs/real_model.md, "The learning table", reads its output.

    python benchmarks/learning_iv.py probe    # the teacher probe of every drawn user (resumes user by user)
    python benchmarks/learning_iv.py select   # the rule, fixed before any learning run: which users, which kinds
    python benchmarks/learning_iv.py run      # every row, in the issue's order (resumes run by run)
    python benchmarks/learning_iv.py run --runs 1   # only the next run that has no results yet
    python benchmarks/learning_iv.py table    # every table and interval again, from the committed JSON only

Everything it measures is written to docs/benchmarks/learning-iv/ as it finishes (probe.json, users.json,
runs/<row>.json), so the table fills over several sittings; `table` reads nothing else
(benchmarks/learning_iv_table.py). A run lives in runs/learning_iv/<row>/<recipe>-<settings hash> and resumes
from its newest checkpoint.
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.learning_iv_rows import (DATA, ROWS, RULE, SERVING, USERS, choose, read_json,  # noqa: E402
                                         run_row, write_json)
from benchmarks.learning_iv_table import write_tables  # noqa: E402

PROBE = DATA / "probe.json"
PROBE_SETTINGS = {"n": 16, "reader": "free_text", "max_tokens": 64, "phrasing": "free", "hint": "user"}


def probe_users() -> None:
    """The probe of every drawn user on the base model, each saved as it finishes."""
    from benchmarks.teacher_probe import measure
    from clawr1.agent_bench import serving_stack

    done = read_json(PROBE)
    todo = [u for group in USERS.values() for u in group if str(u) not in done.get("users", {})]
    if not todo:
        print("[learning_iv] probe: every drawn user is probed", flush=True)
        return
    done["settings"] = PROBE_SETTINGS
    with tempfile.TemporaryDirectory() as tmp, \
            serving_stack(str(REPO / "recipes/combined/cpu_qwen05_lora.yaml"), SERVING, Path(tmp)) as url:
        for user in todo:
            s = PROBE_SETTINGS
            result = asyncio.run(measure(url, user, s["n"], s["reader"], s["max_tokens"], s["phrasing"], s["hint"],
                                         signal=False))
            done.setdefault("users", {})[str(user)] = result
            write_json(PROBE, done)
            print(f"[learning_iv] probe: user {user} {result['profile']}: "
                  + ", ".join(f"{k} {result[f'uptake_{k}']:+.2f}" for k in result["profile"]), flush=True)


def select_users() -> None:
    """users.json: per group, each drawn user's counted kinds (the rule in RULE), from probe.json only."""
    probed = read_json(PROBE).get("users", {})
    missing = [u for group in USERS.values() for u in group if str(u) not in probed]
    if missing:
        raise SystemExit(f"users {missing} are not probed yet: run `python benchmarks/learning_iv.py probe`")
    chosen = {group: choose({u: probed[str(u)] for u in users}) for group, users in USERS.items()}
    write_json(DATA / "users.json", {"rule": RULE, **chosen})
    for group, users in chosen.items():
        print(f"[learning_iv] {group}: {len(users)} users: {users}", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=("probe", "select", "run", "table"))
    p.add_argument("--rows", default=",".join(ROWS), help=f"rows to run, in this order (default: all: {list(ROWS)})")
    p.add_argument("--runs", type=int, default=None,
                   help="stop after this many runs have trained (a 16-step run is 80-110 minutes on 2 cores, a "
                   "48-step one about 3 hours; default: all)")
    args = p.parse_args()
    if args.command == "probe":
        probe_users()
    elif args.command == "select":
        select_users()
    elif args.command == "run":
        left = args.runs
        for row in args.rows.split(","):
            left = None if left is None else left - run_row(row, left)
            write_tables()
            if left == 0:
                print("[learning_iv] stopping: --runs reached; the rest run at a later sitting", flush=True)
                break
    else:
        print(write_tables(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
