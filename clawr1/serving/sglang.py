"""SGLang as the serving backend (serve.backend=sglang): launch command, supervised server, `clawr1 serve` path.

On a GPU, or on CPU in the environment scripts/setup_sglang.sh makes (docs/serving.md, "SGLang on CPU").
tests/sglang/ runs real SGLang; the contract tests (tests/serving/test_sglang_contract.py) pin the exact
argument list. Flags follow docs/sglang_api_notes.md §7.
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

import httpx

from clawr1.config import Config, SGLangConfig
from clawr1.engine_api.lora import HF_MODULES_OF_TARGET
from clawr1.runtime import exit_status, signal_group, start_process, wait_group_gone

log = logging.getLogger("clawr1.serve")

class SGLangStartError(RuntimeError):
    """The SGLang server exited or stayed unhealthy while starting; the message names its log file."""


# ---------------------------------------------------------------- the command


def _validate(model_path: str, port: int, weight_version: int) -> None:
    """Reject what the config tree cannot check: values filled in at run time."""
    if not model_path:
        raise ValueError("model_path is empty: SGLang needs an HF model directory or hub id")
    if not 1 <= port <= 65535:
        raise ValueError(f"port must be in 1..65535, got {port} (serve.port=0 is only filled in by `clawr1 run`)")
    if weight_version < 0:
        raise ValueError(f"weight_version must be >= 0, got {weight_version}")


CPU_KV_TOKENS = 4096  # SGLang's KV pool on CPU when serve.max_total_tokens is 0
# of the memory free at start, when serve.sglang.mem_fraction_static is 0: on CPU a check that the weights fit (the KV
# pool is --max-total-tokens); 0.1 refused SmolLM2 (0.5 GB) on a busy 24 GiB machine
CPU_MEM_FRACTION = 0.8


def on_cpu(s: SGLangConfig) -> bool:
    """serve.sglang.device, with auto resolved: cpu when this machine's torch sees no GPU."""
    if s.device != "auto":
        return s.device == "cpu"
    import torch

    return not torch.cuda.is_available()


def cpu_flags(cfg: Config) -> list[str]:
    """What SGLang 0.5.23 needs to serve on CPU (its torch attention; no overlap thread; an idle scheduler that
    sleeps instead of spinning a core)."""
    flags = ["--device", "cpu", "--attention-backend", "torch_native", "--disable-overlap-schedule", "--sleep-on-idle"]
    if cfg.serve.max_loras:
        flags += ["--lora-backend", "torch_native"]
    return flags


def launch_env(cfg: Config) -> dict[str, str]:
    """The server's environment: never a model hub; on CPU, SGLang's CPU engine with serve.num_threads threads."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    if on_cpu(cfg.serve.sglang):
        env.update(SGLANG_USE_CPU_ENGINE="1", OMP_NUM_THREADS=str(cfg.serve.num_threads))
    return env


def launch_command(cfg: Config, model_path: str, port: int, weight_version: int = 0) -> list[str]:
    """`python -m sglang.launch_server ...` for this config, validated (ValueError names the bad key)."""
    s = cfg.serve.sglang
    _validate(model_path, port, weight_version)
    cpu = on_cpu(s)
    dtype = "float32" if cpu and s.dtype == "auto" else s.dtype
    cmd = [python_of(s), "-m", "sglang.launch_server", "--model-path", model_path,
           "--host", cfg.serve.host, "--port", str(port), "--tp-size", str(s.tp_size), "--dtype", dtype]
    if cpu:
        cmd += cpu_flags(cfg)
    if s.mem_fraction_static or cpu:
        cmd += ["--mem-fraction-static", str(s.mem_fraction_static or CPU_MEM_FRACTION)]
    if cfg.serve.max_total_tokens or cpu:
        cmd += ["--max-total-tokens", str(cfg.serve.max_total_tokens or CPU_KV_TOKENS)]
    if s.context_length:
        cmd += ["--context-length", str(s.context_length)]
    if s.tool_call_parser:
        cmd += ["--tool-call-parser", s.tool_call_parser]
    if s.reasoning_parser:
        cmd += ["--reasoning-parser", s.reasoning_parser]
    if cfg.serve.max_loras:  # LoRA adapters by name (lora.sync=adapter): every target module any adapter may have
        modules = sorted({m for t in cfg.lora.targets for m in HF_MODULES_OF_TARGET[t]})
        cmd += ["--enable-lora", "--max-lora-rank", str(cfg.serve.max_lora_rank), "--lora-target-modules", *modules,
                "--max-loras-per-batch", str(cfg.serve.max_loras), "--max-loaded-loras", str(cfg.serve.max_loras)]
    # versions count publishes; SGLang reports it as meta_info.weight_version until the first update
    cmd += ["--weight-version", str(weight_version), "--skip-server-warmup", "--enable-metrics"]
    return cmd + list(s.extra_args)


# ---------------------------------------------------------------- the process


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log written)"


def _local_host(host: str) -> str:
    """Where this machine reaches a server bound to `host` (a wildcard bind is reached on loopback)."""
    return {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "[::1]"}.get(host, f"[{host}]" if ":" in host else host)


class SGLangServer:
    """One SGLang server: its own process group, output to `log_path`, stopped by its PID's group only.

    `command` replaces the launch_server command (tests use a stand-in script). Start it from a
    thread that lives as long as the server: with `die_with_parent` the kernel kills the server
    when that thread exits. Use as a context manager, or call start() and stop().
    """

    def __init__(self, cfg: Config, model_path: str, port: int, log_path: str | os.PathLike, *,
                 weight_version: int = 0, command: Optional[Sequence[str]] = None, die_with_parent: bool = True):
        self.command = list(command) if command is not None else launch_command(cfg, model_path, port, weight_version)
        self.env = launch_env(cfg)
        self.url = f"http://{_local_host(cfg.serve.host)}:{port}"
        self.log_path = Path(log_path)
        self.die_with_parent = die_with_parent
        self.proc: Optional[subprocess.Popen] = None

    def start(self) -> "SGLangServer":
        if self.proc is not None:
            raise RuntimeError("this SGLangServer was already started")
        self.proc = start_process(self.command, self.log_path, env=self.env, dies_with_parent=self.die_with_parent)
        log.info("started SGLang (pid %d, log %s): %s", self.proc.pid, self.log_path, " ".join(self.command))
        return self

    @property
    def pid(self) -> int:
        return self._started().pid

    @property
    def returncode(self) -> Optional[int]:
        """None while running or before start()."""
        return self.proc.poll() if self.proc is not None else None

    def _started(self) -> subprocess.Popen:
        if self.proc is None:
            raise RuntimeError("the SGLang server was not started")
        return self.proc

    def healthy(self, timeout_s: float = 25.0) -> bool:
        """GET /health_generate answered 200: the server ran a one-token generation (it waits up to 20 s)."""
        try:
            return httpx.get(f"{self.url}/health_generate", timeout=timeout_s).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_healthy(self, timeout_s: float, poll_s: float = 0.5) -> None:
        """Block until healthy; SGLangStartError (naming the log) if the process exits or time runs out."""
        proc = self._started()
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise SGLangStartError(f"SGLang server exited with code {proc.returncode} before it was healthy; "
                                       f"see {self.log_path}; last lines:\n{_tail(self.log_path)}")
            left = deadline - time.monotonic()
            if self.healthy(timeout_s=max(1.0, min(25.0, left))):
                return
            if time.monotonic() >= deadline:
                raise SGLangStartError(f"SGLang server at {self.url} not healthy after {timeout_s:.0f}s; "
                                       f"see {self.log_path}; last lines:\n{_tail(self.log_path)}")
            time.sleep(poll_s)

    def wait(self) -> int:
        """Block until the server process exits; its return code (negative: killed by that signal)."""
        return self._started().wait()

    def stop(self, timeout_s: float = 20.0) -> Optional[int]:
        """SIGTERM this server's process group, SIGKILL it after timeout_s; the leader's return code.

        The group is signalled even if the leader already exited, so workers it left behind go too.
        """
        if self.proc is None:
            return None
        pgid = self.proc.pid  # start_new_session: the group id is the leader's PID
        signal_group(pgid, signal.SIGTERM)
        if not wait_group_gone(self.proc, timeout_s):
            log.warning("SGLang (pid %d) did not stop within %.0fs; killing its process group", pgid, timeout_s)
            signal_group(pgid, signal.SIGKILL)
            wait_group_gone(self.proc, 5.0)
        return self.proc.wait()

    def __enter__(self) -> "SGLangServer":
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.stop()


# ---------------------------------------------------------------- `clawr1 serve` with serve.backend=sglang


def python_of(s: SGLangConfig) -> str:
    return str(Path(s.python).expanduser()) if s.python else sys.executable


def _require_sglang(s: SGLangConfig) -> None:
    """SGLang must import in the environment it runs in (serve.sglang.python), which need not be this one."""
    python = python_of(s)
    probe = subprocess.run([python, "-c", "import sglang; print(getattr(sglang, '__version__', '?'))"], capture_output=True, text=True)
    if probe.returncode != 0:
        error = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"serve.backend=sglang, but SGLang does not import with {python} ({error}); install it in "
                         "its own environment and set serve.sglang.python (docs/trainer.md: 'GPU install')")
    log.info("SGLang %s in %s", probe.stdout.strip(), python)


def _interrupt_once(signum: int, frame) -> None:
    """SIGTERM/SIGINT handler: the first one unwinds into the server's stop(); later ones are ignored."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    raise KeyboardInterrupt


def serve_sglang(cfg: Config, model_path: str) -> int:
    """Run SGLang on cfg.serve.port until it exits or this process gets SIGTERM/SIGINT; its exit status.

    Call from the main thread (it installs signal handlers). The server's output goes to RUN_DIR/logs/sglang-PORT.log
    (a run's policy and teacher engines each have their own); a server that dies or stays unhealthy while starting
    raises SGLangStartError naming that file.
    """
    _require_sglang(cfg.serve.sglang)
    server = SGLangServer(cfg, model_path, cfg.serve.port, cfg.run_dir / "logs" / f"sglang-{cfg.serve.port}.log",
                          weight_version=cfg.serve.weight_version)
    previous = {sig: signal.signal(sig, _interrupt_once) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        with server:
            server.wait_healthy(cfg.serve.sglang.startup_timeout_s)
            log.info("SGLang serving %s on %s", model_path, server.url)
            return exit_status(server.wait())
    except KeyboardInterrupt:
        code = exit_status(server.stop())  # already stopped on leaving `with`, unless the signal came mid-start
        log.info("stop requested; SGLang stopped")
        return code
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
