"""Publishing weights: a strategy gets them into every engine, then a PUB note tells every loop.

Five strategies behind one small interface (`WeightSink.push`):

- `DiskSink` (trainer.weight_sync=disk): HF safetensors in RUN_DIR/weights/vNNNNNN, then each
  engine, one at a time so the others keep serving, loads them with /update_weights_from_disk.
- `HttpSink` (trainer.weight_sync=http): the same safetensors, serialized once in memory and
  streamed as raw bytes into each embedded engine's /update_weights_from_tensor, one engine at a
  time; the engines may be on other nodes and share no disk with the trainer.
- `NcclSink` (trainer.weight_sync=nccl): a bucketed NCCL broadcast from trainer rank 0 into
  SGLang engines (clawr1/engine_api/weight_push.py; GPU clusters only).
- `IpcSink` (trainer.weight_sync=ipc): trainer and embedded engines on the same device; the tensors shared
  in place as CUDA IPC handles, in buckets (clawr1/engine_api/ipc.py).
- `TinkerSamplerSink` (trainer.backend=tinker): no tensors here; the engines switch to a Tinker sampler path.

A weight version counts the trainer steps published, so it always equals the step.
"""
from __future__ import annotations

import ipaddress
import logging
import shutil
import socket
import time
from pathlib import Path
from typing import Callable, Protocol
from urllib.parse import urlsplit

import httpx
import torch
import torch.distributed as dist
from torch import Tensor

from clawr1 import bus, protocol
from clawr1.engine_api import ipc
from clawr1.config import Config
from clawr1.engine_api.client import EngineError, SyncEngineClient
from clawr1.protocol import WeightsPublished
from clawr1.trainer.convert import megatron_to_hf
from clawr1.trainer.hf_io import write_weights_dir
from clawr1.engine_api.lora import adapter_name, adapter_version, read_current, write_current
from clawr1.trainer.lora import merge_into, peft_tensors, write_peft_adapter
from clawr1.trainer.model import Policy, megatron_state

log = logging.getLogger("clawr1.trainer")


def gather_hf_state(policy: Policy) -> dict | None:
    """The full HF state dict on global rank 0 (TP shards gathered); None elsewhere.

    Only weights that reach rank 0 are copied to the host: rank 0's, and under tensor parallelism the
    other shards of data-parallel replica 0, which its TP ranks send (a collective all of them join).
    The other replicas hold the same weights and copy nothing.
    """
    lead = dist.get_rank() == 0
    if policy.tp == 1:
        return megatron_to_hf([_host_copy(policy)], policy.arch) if lead else None
    from megatron.core import parallel_state

    if parallel_state.get_data_parallel_rank() != 0:
        return None
    group = parallel_state.get_tensor_model_parallel_group()
    shards = [None] * policy.tp if lead else None
    dist.gather_object(_host_copy(policy), shards, dst=dist.get_global_rank(group, 0), group=group)
    return megatron_to_hf(shards, policy.arch) if lead else None


def _host_copy(policy: Policy) -> dict[str, Tensor]:
    """This rank's weights on the host; with LoRA, slot 0's adapter merged into them."""
    state = megatron_state(policy.model)
    if policy.lora is not None:
        state = merge_into(state, policy.lora, slot=0)
    return {k: v.cpu() for k, v in state.items()}


def gather_adapters(policy: Policy) -> dict[int, dict[str, Tensor]] | None:
    """Every slot's adapter as PEFT tensors (HF names, TP shards joined) on global rank 0; None elsewhere."""
    lead = dist.get_rank() == 0
    mine = {slot: policy.lora.host_state(slot) for slot in range(policy.lora.shape.slots)}
    if policy.tp == 1:
        shards = [mine]
    else:
        from megatron.core import parallel_state

        if parallel_state.get_data_parallel_rank() != 0:
            return None
        group = parallel_state.get_tensor_model_parallel_group()
        shards = [None] * policy.tp if lead else None
        dist.gather_object(mine, shards, dst=dist.get_global_rank(group, 0), group=group)
    if not lead:
        return None
    return {slot: peft_tensors([s[slot] for s in shards], policy.arch, policy.lora.shape.targets) for slot in mine}


def to_each_engine(engines: list[SyncEngineClient], update: Callable[[SyncEngineClient], object]) -> None:
    """`update` every engine, one at a time so the others keep serving. An engine that cannot be reached is down
    (a live run restarts it on the newest published weights): it is skipped, and the next publish reaches it."""
    for engine in engines:
        try:
            update(engine)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError, httpx.ReadError) as e:
            log.warning("engine %s is unreachable (%s): skipped for this version", engine.url, e)


class WeightSink(Protocol):
    """Gets a full HF state into every engine as weight version `version`; returns where it went."""

    def push(self, hf_state: dict[str, Tensor], version: int) -> str: ...

    def close(self) -> None: ...


class DiskSink:
    def __init__(self, cfg: Config, engines: list[SyncEngineClient], base_model_path: Path):
        self.engines, self.base = engines, Path(base_model_path)
        self.dir = cfg.run_dir / "weights"
        self.keep = cfg.trainer.keep_weight_versions

    def push(self, hf_state: dict[str, Tensor], version: int) -> str:
        path = write_weights_dir(hf_state, self.dir / f"v{version:06d}", copy_from=self.base)
        to_each_engine(self.engines, lambda engine: engine.update_weights_from_disk(str(path.resolve()), version))
        self._prune(version)
        return str(path)

    def _prune(self, newest: int) -> None:
        for d in sorted(self.dir.glob("v[0-9]*")):
            version = d.name[1:]
            # "v000004.tmp": a write that a killed trainer left half done (this trainer is the only writer)
            if d.is_dir() and (not version.isdigit() or int(version) <= newest - self.keep):
                shutil.rmtree(d, ignore_errors=True)

    def close(self) -> None:
        pass


class HttpSink:
    def __init__(self, engines: list[SyncEngineClient]):
        self.engines = engines

    def push(self, hf_state: dict[str, Tensor], version: int) -> str:
        from safetensors.torch import save

        payload = save({k: v.detach().to("cpu").contiguous() for k, v in hf_state.items()}, metadata={"format": "pt"})
        to_each_engine(self.engines, lambda engine: engine.update_weights_from_tensor_bytes(payload, version))
        return "http"

    def close(self) -> None:
        pass


class IpcSink:
    """trainer.weight_sync=ipc: the published tensors copied into buckets on the trainer's device and shared in
    place (CUDA IPC handles; CPU shared memory on a CPU trainer), one request per engine; the buckets live until
    every engine has answered (clawr1/engine_api/ipc.py)."""

    def __init__(self, engines: list[SyncEngineClient], bucket_bytes: int):
        self.engines = engines
        self.bucket_bytes = bucket_bytes
        self.device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")

    def push(self, hf_state: dict[str, Tensor], version: int) -> str:
        buckets = [ipc.pack(hf_state, names, self.device) for names in ipc.buckets_of(hf_state, self.bucket_bytes)]
        body = ipc.payload(buckets, version)
        to_each_engine(self.engines, lambda engine: engine.update_weights_from_ipc(body))
        del buckets
        return "ipc"

    def close(self) -> None:
        pass


def master_address(cfg: Config) -> str:
    """Where the engines reach trainer rank 0's weight-update rendezvous (trainer.master_address, see its comment)."""
    t = cfg.trainer
    if t.master_address:
        return t.master_address
    if _routable(t.host):
        return t.host
    remote = [h for h in (urlsplit(u).hostname for u in cfg.engine_urls) if h and _routable(h)]
    return address_toward(remote[0]) if remote else "127.0.0.1"


def _routable(host: str) -> bool:
    """Whether another machine could reach `host`: not loopback, not the any-address (0.0.0.0)."""
    try:
        ip = ipaddress.ip_address(socket.gethostbyname(host))
    except (OSError, ValueError):
        return True  # a name this machine cannot resolve is some other machine's
    return not (ip.is_loopback or ip.is_unspecified)


def address_toward(host: str) -> str:
    """This machine's address on its route to `host` (a UDP connect sends nothing; it only picks the route)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((host, 9))
        except OSError as e:
            raise ValueError(f"cannot tell which address the engines on {host} reach this machine at ({e}): "
                             f"set trainer.master_address") from None
        return s.getsockname()[0]


class NcclSink:
    """Bucketed NCCL broadcast into SGLang engines. The HF state stays on the host: each tensor is copied to
    the GPU when its bucket is filled and released once the engines confirmed the bucket, so at most one
    bucket (trainer.weight_sync_bucket_mb, or one tensor larger than that) is on the GPU at a time."""

    def __init__(self, cfg: Config):
        from clawr1.engine_api.weight_push import DistributedWeightSync

        self.sync = DistributedWeightSync(cfg.engine_urls, bucket_bytes=cfg.trainer.weight_sync_bucket_mb << 20)
        self.sync.connect(master_address(cfg), 0, [cfg.serve.sglang.tp_size] * len(cfg.engine_urls))

    def push(self, hf_state: dict[str, Tensor], version: int) -> str:
        import torch

        self.sync.push(hf_state, version)  # read once per group of engines, staged bucket by bucket
        torch.cuda.synchronize()
        return "nccl"

    def close(self) -> None:
        self.sync.close()


class AdapterSink:
    """LoRA adapters only (lora.sync=adapter): each publish loads `slotK@vN` into every engine, from the tensors
    themselves (/load_lora_adapter_from_tensors) or, where an engine cannot take those (SGLang on CPU) or refuses
    them (SGLang on another machine: its tensors are pickled with shared memory), from a PEFT directory
    (/load_lora_adapter). Then it unloads every other version the engine holds but the one before: the gateway
    routes to the newest version the moment it hears of it, and an engine finishes an unloading adapter's
    in-flight requests first. After a restart that also clears what the previous trainer left (versions of steps
    lost with a crash).

    RUN_DIR/adapters/vNNNNNN/slotK holds each published adapter, and RUN_DIR/adapters/current.json the newest
    version: a restarted gateway routes to it, and a restarted engine loads it."""

    def __init__(self, cfg: Config, engines: list[SyncEngineClient]):
        self.engines = engines
        self.dir = cfg.run_dir / "adapters"
        self.tp_size = cfg.serve.sglang.tp_size
        self.previous: int | None = None  # the version this sink published before the current one

    def push_adapters(self, adapters: dict[int, dict[str, Tensor]], config: dict, version: int) -> str:
        # A resumed trainer's first publish is its checkpoint's version; where current.json already names it, the
        # engines hold exactly these adapters (the checkpoint and that publish are the same step): they are kept,
        # not replaced, since an unload waits for every request in flight on them (a whole evaluation).
        republish = self.previous is None and (read_current(self.dir) or {}).get("version") == version
        where = self.dir / f"v{version:06d}"
        for slot, tensors in adapters.items():
            write_peft_adapter(where / f"slot{slot}", tensors, config)
        keep = {version} | ({self.previous} if self.previous is not None and self.previous != version else set())
        to_each_engine(self.engines, lambda engine: self._update(engine, adapters, config, where, version, keep,
                                                                 republish))
        write_current(self.dir, version, sorted(adapters))
        for old in self.dir.glob("v[0-9]*"):
            if old.name[1:].isdigit() and int(old.name[1:]) not in keep:
                shutil.rmtree(old, ignore_errors=True)
        self.previous = version
        return str(where)

    def _update(self, engine: SyncEngineClient, adapters: dict, config: dict, where: Path, version: int,
                keep: set[int], republish: bool = False) -> None:
        loaded: dict = {}
        for slot, tensors in adapters.items():
            loaded = self._load(engine, adapter_name(slot, version), tensors, config, where / f"slot{slot}",
                                keep_held=republish) or loaded
        for name in loaded or {}:
            held = adapter_version(name)
            if held is not None and held not in keep:
                _unload(engine, name)

    def _load(self, engine: SyncEngineClient, name: str, tensors: dict, config: dict, directory: Path,
              replace: bool = True, keep_held: bool = False) -> dict:
        """Load one adapter; returns the names the engine holds after it (its reply's loaded_adapters; {} when it
        kept its own). A name the engine holds already (left by a trainer that crashed after publishing this
        version) is replaced, once; with `keep_held` (a resumed trainer's republish) it is kept as it is."""
        try:
            return self._send(engine, name, tensors, config, directory)
        except EngineError as e:
            if "already loaded" not in str(e) or not replace:
                raise
            if keep_held:
                log.info("engine %s holds %s already (the checkpoint's version): kept", engine.url, name)
                return {}
        _unload(engine, name)
        return self._load(engine, name, tensors, config, directory, replace=False)

    def _send(self, engine: SyncEngineClient, name: str, tensors: dict, config: dict, directory: Path) -> dict:
        """The tensors themselves where the engine takes them; otherwise (SGLang on CPU), or where it refuses them
        (SGLang on another machine), the PEFT directory."""
        if engine.update_protocol().adapter_tensors:
            try:
                return engine.load_lora_adapter_from_tensors(name, config, tensors, self.tp_size).get("loaded_adapters")
            except EngineError as e:
                if "already loaded" in str(e):
                    raise
                log.warning("engine %s refused the adapter's tensors (%s); loading %s from disk", engine.url, e,
                            directory)
        return engine.load_lora_adapter(name, str(directory.resolve())).get("loaded_adapters")

    def push(self, hf_state: dict[str, Tensor], version: int) -> str:
        raise TypeError("lora.sync=adapter publishes adapters (push_adapters), not full weights")

    def close(self) -> None:
        pass


def _unload(engine: SyncEngineClient, name: str) -> None:
    """Best effort: an adapter left loaded is unloaded by the next publish (it unloads every stale version)."""
    try:
        engine.unload_lora_adapter(name)
    except EngineError as e:  # a restarted engine never had it
        log.info("engine %s: %s", engine.url, e)
    except httpx.HTTPError as e:  # e.g. its in-flight requests outlasted the client's timeout
        log.warning("engine %s did not unload %s (%s); the next publish tries again", engine.url, name, e)


class TinkerSamplerSink:
    """trainer.backend=tinker: the weights stay in Tinker. What is handed over is the tinker:// path of a
    sampler save, which each engine (serve.backend=tinker) switches its sampling client to."""

    def __init__(self, engines: list[SyncEngineClient]):
        self.engines = engines

    def push(self, reference: str, version: int) -> str:
        to_each_engine(self.engines, lambda engine: engine.update_weights_from_disk(reference, version))
        return reference

    def close(self) -> None:
        pass


def _sink(cfg: Config, engines: list[SyncEngineClient], base_model_path: Path) -> WeightSink:
    if cfg.trainer.backend == "tinker":
        return TinkerSamplerSink(engines)
    if cfg.lora.serves_adapters:
        return AdapterSink(cfg, engines)
    if cfg.trainer.weight_sync == "nccl":
        return NcclSink(cfg)
    if cfg.trainer.weight_sync == "http":
        return HttpSink(engines)
    if cfg.trainer.weight_sync == "ipc":
        return IpcSink(engines, cfg.trainer.weight_sync_bucket_mb << 20)
    return DiskSink(cfg, engines, base_model_path)


class WeightPublisher:
    """The trainer's one door to the engines: push through the configured sink, then announce it."""

    def __init__(self, cfg: Config, base_model_path: Path):
        self.engines = [SyncEngineClient(u) for u in cfg.engine_urls]
        self.sink: WeightSink = _sink(cfg, self.engines, base_model_path)
        self.pub = bus.pub_socket(cfg.publish_addr)
        # judge.teacher=lagged: a teacher engine that gets the policy's weights only every teacher_lag versions
        self.lagged_teacher = SyncEngineClient(cfg.teacher_engine_url) if cfg.judge.teacher == "lagged" else None
        self.teacher_lag = cfg.judge.teacher_lag

    def publish(self, hf_state: dict, version: int, step: int) -> str:
        return self._announce(lambda: self.sink.push(hf_state, version), version, step)

    def publish_sampler(self, reference: str, version: int, step: int) -> str:
        """trainer.backend=tinker: the engines switch to Tinker's sampler weights at `reference`."""
        return self._announce(lambda: self.sink.push(reference, version), version, step)

    def publish_adapters(self, adapters: dict[int, dict[str, Tensor]], config: dict, version: int, step: int) -> str:
        return self._announce(lambda: self.sink.push_adapters(adapters, config, version), version, step)

    def _announce(self, push: Callable[[], str], version: int, step: int) -> str:
        t0 = time.monotonic()
        where = push()
        if self.lagged_teacher is not None and version and version % self.teacher_lag == 0:
            self.lagged_teacher.update_weights_from_disk(str(Path(where).resolve()), version)
        self.pub.send_multipart(protocol.encode(WeightsPublished(version=version, step=step, path=where,
                                                                 timestamp=time.time())))
        log.debug("published v%d in %.2fs", version, time.monotonic() - t0)
        return where

    def engine_versions(self) -> list[int]:
        return [e.weight_version() for e in self.engines]

    def close(self) -> None:
        self.sink.close()
        for e in self.engines + ([self.lagged_teacher] if self.lagged_teacher else []):
            e.close()
        self.pub.close(0)
