"""The `clawr1` command: one subcommand per loop, plus `run`, `tinker-serve`, `init-model`, `config-docs`."""
from __future__ import annotations

import argparse
import importlib
import shutil
import sys
import time
from pathlib import Path

from clawr1.config import ConfigError, load_config
from clawr1.model_path import ModelDirError

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
    i = sub.add_parser("ingest", help="train on pre-collected OpenAI-format conversations (one JSON object per line)")
    i.add_argument("file", help="a .jsonl file: {messages, tools?, session_id?, feedback?, reward?} per line")
    i.add_argument("--gateway", help="a running gateway's URL (a live run), e.g. http://127.0.0.1:8000")
    i.add_argument("--api-key-env", default="CLAWR1_API_KEY", help="environment variable holding that gateway's key")
    i.add_argument("--config", help="instead: run this recipe as a live run of its own and ingest into it")
    i.add_argument("overrides", nargs="*", help="with --config: dotted overrides, e.g. run.dir=runs/logs1")
    i.add_argument("--overwrite", action="store_true", help="with --config: empty an existing run directory first")
    i.add_argument("--resume", action="store_true", help="with --config: continue the run in run.dir")
    b = sub.add_parser("bench", help="score an agent on an environment's tasks: pass@1, pass@k, pass^k")
    b.add_argument("env", help="envs/terminal, envs/toolcall, or package.module:Class")
    b.add_argument("--tasks", help="the environment's task set, e.g. learnable, bfcl:simple, or a task directory")
    b.add_argument("--agent", choices=("oracle", "null", "wrong", "policy"), default="policy",
                   help="oracle, null, wrong: the environment's scripted agents (wrong: envs/gui's wrong solutions)")
    b.add_argument("--samples", type=int, default=1, help="attempts per task (k of pass@k)")
    b.add_argument("--limit", type=int, default=0, help="only the first N tasks")
    b.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE", help="an environment argument")
    b.add_argument("--gateway", help="policy: a running gateway's URL")
    b.add_argument("--api-key-env", default="CLAWR1_API_KEY", help="environment variable holding that gateway's key")
    b.add_argument("--config", help="policy: start an engine and a gateway from this recipe")
    b.add_argument("overrides", nargs="*", help="with --config: dotted overrides, e.g. model.path=runs/x/weights/v000150")
    b.add_argument("--run-dir", default=f"runs/bench/serving-{time.strftime('%Y%m%d-%H%M%S')}",
                   help="with --config: where the engine and gateway write their logs")
    b.add_argument("--max-tokens", type=int, default=256)
    b.add_argument("--temperature", type=float, default=1.0)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--out", help="report prefix (writes PREFIX.md, and PREFIX.png when there are categories)")
    e = sub.add_parser("export", help="write a trainer checkpoint as an HF safetensors directory (LoRA: PEFT adapters)")
    e.add_argument("checkpoint", help="RUN_DIR/checkpoints/stepNNNNNN")
    e.add_argument("out_dir")
    rp = sub.add_parser("report", help="plot runs' curves to a PNG and summarize them in a markdown table")
    rp.add_argument("run_dirs", nargs="+")
    rp.add_argument("--out", default="report", help="output prefix (writes PREFIX.png and PREFIX.md)")
    m = sub.add_parser("init-model", help="build (or find cached) the tiny tokenizer + Qwen2 model")
    m.add_argument("out_dir", nargs="?", help="also copy the model here")
    m.add_argument("--config", help="config YAML whose model.tiny section to use")
    m.add_argument("overrides", nargs="*")
    mo = sub.add_parser("model", help="a real model as an HF directory in the model cache (no model hub)")
    mo.add_argument("action", choices=("get", "import"), help="get NAME (a known model) | import FILE.gguf")
    mo.add_argument("what", help="smollm2-135m-instruct, or a .gguf file")
    mo.add_argument("--config", help="config YAML whose model.cache_dir to use")
    t = sub.add_parser("tinker-serve", help="serve Tinker's API from this machine's engine and trainer (LoRA)")
    t.add_argument("recipe", help="a recipe config, e.g. recipes/tinker/serve_cpu.yaml")
    t.add_argument("overrides", nargs="*", help="dotted overrides, e.g. tinker.port=8765 run.dir=runs/tinker1")
    sub.add_parser("config-docs", help="print the config reference, every key with its type, default and "
                   "description (clawr1 config-docs > docs/config.md)")
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
            from clawr1.runtime import record_whereabouts

            record_whereabouts(cfg)
            return importlib.import_module(LOOPS[args.command][0]).main(cfg)
        if args.command == "run":
            return _run(args)
        if args.command == "bench":
            from clawr1.agent_bench import main as bench_main

            return bench_main(args)
        if args.command == "ingest":
            from clawr1.ingest_client import main as ingest_main

            return ingest_main(args)
        if args.command == "init-model":
            return _init_model(args)
        if args.command == "model":
            return _model(args)
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
        if args.command == "tinker-serve":
            from clawr1.trainer.tinker_serve_main import main as tinker_serve_main

            return tinker_serve_main(args.recipe, args.overrides)
        if args.command == "config-docs":
            from clawr1.config_reference import render_config_reference

            sys.stdout.write(render_config_reference())
            return 0
        if args.command == "export":
            from clawr1.trainer.export import export_checkpoint

            print(export_checkpoint(Path(args.checkpoint), Path(args.out_dir)))
            return 0
    except ConfigError as e:
        print(f"clawr1: config error: {e}", file=sys.stderr)
        return 2
    except ModelDirError as e:
        print(f"clawr1: {e}", file=sys.stderr)
        return 2
    return 2


def _run(args) -> int:
    from clawr1.supervisor import make_supervisor, prepare
    from clawr1.model_path import resolve_model_path
    from clawr1.placement import PlacementRefused
    from clawr1.tracking import WandbForwarder

    recipe = Path(args.recipe)
    cfg = prepare(load_config(recipe, args.overrides), recipe, args.overwrite, args.resume, args.dry_run)
    if args.dry_run:
        try:
            print(make_supervisor(cfg).describe())
        except PlacementRefused as e:
            print(f"clawr1: {e}", file=sys.stderr)
            return 2
        return 0
    print(f"[run] {recipe} -> {cfg.run_dir}", flush=True)
    # the tiny model is built once, here; a configured model must be on every node that loads it
    on_ray_with_own_model = cfg.cluster.backend == "ray" and cfg.model.path
    print(f"[run] model: {cfg.model.path if on_ray_with_own_model else resolve_model_path(cfg.model, cfg.serve.backend != 'tinker')}", flush=True)
    tracker = WandbForwarder(cfg)
    tracker.start()
    try:
        return make_supervisor(cfg, echo=lambda line: print(line, flush=True)).run()
    finally:
        tracker.finish()


def _init_model(args) -> int:
    from clawr1.model_path import resolve_model_path

    cfg = load_config(args.config, args.overrides)
    path = resolve_model_path(cfg.model)
    if args.out_dir:
        shutil.copytree(path, args.out_dir, dirs_exist_ok=True)
        path = Path(args.out_dir)
    print(path)
    return 0


def _model(args) -> int:
    from clawr1.model_import import ModelImportError, get_model, import_gguf

    cache = Path(load_config(args.config, args.overrides).model.cache_dir).expanduser()
    try:
        path = get_model(args.what, cache) if args.action == "get" else import_gguf(Path(args.what), cache)
    except ModelImportError as e:
        print(f"clawr1 model: {e}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
