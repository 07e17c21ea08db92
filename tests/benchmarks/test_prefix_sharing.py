"""benchmarks/prefix_sharing.py: its committed counts recompute from the committed batch, and it prints one JSON line
without the model."""
from __future__ import annotations

import json
import subprocess
import sys

from benchmarks.prefix_sharing import DATA, load_batch, packed_tokens, tree_tokens
from clawr1.devtools import REPO


def test_the_timed_batchs_committed_counts_are_what_the_trainer_cuts_now():
    """The timed batch is one of the committed batches; its counts, made at extraction, are recomputed from its
    samples (a change to how micro-batches are cut needs a new `extract` from a run's pool)."""
    data = json.loads((DATA / "batches.json").read_text())
    batch = load_batch()
    row = next(r for r in data["batches"] if r["lengths"] == [len(s.tokens) for s in batch])
    assert row["slots"] == [s.adapter_slot for s in batch]
    assert (row["flat_tokens"], row["flat_micro_batches"]) == packed_tokens(batch, data["budget"], False)
    assert (row["tree_tokens"], row["tree_micro_batches"]) == packed_tokens(batch, data["budget"], True)
    assert row["tree_tokens_whole_batch"] == tree_tokens(batch) < row["tree_tokens"] < row["flat_tokens"]


def test_the_counts_alone_print_one_json_line():
    done = subprocess.run([sys.executable, "benchmarks/prefix_sharing.py", "--no-timing"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    rows = json.loads((DATA / "batches.json").read_text())["batches"]
    flat, tree = sum(r["flat_tokens"] for r in rows), sum(r["tree_tokens"] for r in rows)
    assert result["batches"] == len(rows) and result["flat_over_tree"] == round(flat / tree, 3)
    assert "timing" not in result
