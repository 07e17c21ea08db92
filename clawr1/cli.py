"""The `clawr1` command: one subcommand per loop, plus `run`, `init-model`."""
from __future__ import annotations

import argparse
import importlib
import shutil
import sys
from pathlib import Path

from clawr1.config import ConfigError, load_config

LOOPS = {
    "serve": ("clawr1.serving.main", "the embedded engine (SGLang native API)"),
    "gateway": ("clawr1.gateway.main", "the OpenAI-compatible gateway"),
    "rollout": ("clawr1.rollout.main", "drive environment episodes through the gateway"),
    "judge": ("clawr1.judge.main", "turn TurnRecords into Samples"),
    "pool": ("clawr1.pool.main", "the durable sample pool"),
    "train": ("clawr1.trainer.main", "the Megatron trainer"),
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="clawr1", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    for name, (_, help_text) in LOOPS.items():
        s = sub.add_parser(name, help=help_text)
        s.add_argument("--config", required=True, help="the run's config YAML")
        s.add_argument("overrides", nargs="*", help="dotted overrides, e.g. trainer.lr=1e-5")
        if name == "train":
            s.add_argument("--resume", action="store_true", help="continue from the newest checkpoint")
    r = sub.add_parser("run", help="run every loop of a recipe as local processes")
    r.add_argument("recipe", help="a recipe config, e.g. recipes/combined/cpu.yaml")
    r.add_argument("overrides", nargs="*", help="dotted overrides, e.g. run.max_steps=4 run.dir=runs/try1")
    r.add_argument("--overwrite", action="store_true", help="empty an existing run directory first")
    r.add_argument("--resume", action="store_true", help="continue the run in run.dir from its newest checkpoint")
    r.add_argument("--dry-run", action="store_true", help="print every process, its GPUs and command; start nothing")
    e = sub.add_parser("export", help="write a trainer checkpoint as an HF safetensors directory")
    e.add_argument("checkpoint", help="RUN_DIR/checkpoints/stepNNNNNN")
    e.add_argument("out_dir")
    rp = sub.add_parser("report", help="plot runs' curves to a PNG and summarize them in a markdown table")
    rp.add_argument("run_dirs", nargs="+")
    rp.add_argument("--out", default="report", help="output prefix (writes PREFIX.png and PREFIX.md)")
    m = sub.add_parser("init-model", help="build (or find cached) the tiny tokenizer + Qwen2 model")
    m.add_argument("out_dir", nargs="?", help="also copy the model here")
    m.add_argument("--config", help="config YAML whose model.tiny section to use")
    m.add_argument("overrides", nargs="*")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)  # overrides may also come after flags
    unknown = [a for a in extra if a.startswith("-") or "=" not in a]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.overrides = [*getattr(args, "overrides", []), *extra]
    try:
        if args.command in LOOPS:
            cfg = load_config(args.config, args.overrides)
            if getattr(args, "resume", False):
                cfg.trainer.resume = True
            return importlib.import_module(LOOPS[args.command][0]).main(cfg)
        if args.command == "run":
            return _run(args)
        if args.command == "init-model":
            return _init_model(args)
        if args.command == "report":
            from clawr1.report import report

            try:
                png, md = report([Path(d) for d in args.run_dirs], Path(args.out))
            except FileNotFoundError as e:
                print(f"clawr1 report: {e}", file=sys.stderr)
                return 2
            print(md.read_text())
            print(f"wrote {png} and {md}")
            return 0
        if args.command == "export":
            from clawr1.trainer.export import export_checkpoint

            print(export_checkpoint(Path(args.checkpoint), Path(args.out_dir)))
            return 0
    except ConfigError as e:
        print(f"clawr1: config error: {e}", file=sys.stderr)
        return 2
    return 2


def _run(args) -> int:
    from clawr1.supervisor import Supervisor, prepare
    from clawr1.tinymodel.build import resolve_model_path
    from clawr1.tracking import WandbForwarder

    recipe = Path(args.recipe)
    cfg = prepare(load_config(recipe, args.overrides), recipe, args.overwrite, args.resume, args.dry_run)
    if args.dry_run:
        print(Supervisor(cfg).describe())
        return 0
    print(f"[run] {recipe} -> {cfg.run_dir}", flush=True)
    print(f"[run] model: {resolve_model_path(cfg.model)}", flush=True)  # builds the tiny model once, here
    tracker = WandbForwarder(cfg)
    tracker.start()
    try:
        return Supervisor(cfg, echo=lambda line: print(line, flush=True)).run()
    finally:
        tracker.finish()


def _init_model(args) -> int:
    from clawr1.tinymodel.build import ensure_tiny_model

    cfg = load_config(args.config, args.overrides)
    path = ensure_tiny_model(cfg.model)
    if args.out_dir:
        shutil.copytree(path, args.out_dir, dirs_exist_ok=True)
        path = Path(args.out_dir)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
