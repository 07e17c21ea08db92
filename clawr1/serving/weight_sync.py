"""Pushing new weights from trainer rank 0 into SGLang engines over NCCL, without disk.

The HTTP side follows docs/sglang_api_notes.md §6 and §8; the payload builders are plain
functions so the contract tests pin the exact JSON. The NCCL side is `RankZeroGroup`, the
only part that needs GPUs.

How a weight-update group comes about. An engine joins on POST /init_weights_update_group:
each of its TP ranks connects to a TCPStore at master_address:master_port as rank
rank_offset + tp_rank, scopes the store by the group name, and builds its group with torch's
own process-group helper. Trainer rank 0 is rank 0 of that group, but it cannot use
`torch.distributed.init_process_group` (it already has a default group: Megatron's) nor
`new_group` (the engines are not in its world). So, like slime and verl, it builds a second,
independent group by hand. Unlike them, it does not call torch's private group helper,
which registers the group in torch.distributed's global state and, when the trainer's
default group is bound to a device, tries to split the new communicator off the trainer's
own. Instead `RankZeroGroup` hosts the TCPStore itself and constructs the backend object
(ProcessGroupNCCL, or ProcessGroupGloo for CPU tests) on the same store scope the engines
end up with: `<group>/` from the engine's PrefixStore, then `<group>/` and `<device>/` that
torch's helper adds; it calls the backend's broadcast directly. Nothing is registered
globally, so it cannot collide with Megatron's groups. The price: trainer and engines must
run the same torch release, since the store layout and the NCCL id exchange are torch's
(tests/serving/test_sglang_contract.py checks the layout against torch's helper over gloo).

Which engines share a group decides how updates roll out. A broadcast is collective: every
member of a group must take part. With one group per engine (`rolling=True`, the default)
engines are updated one after another, so the others keep serving, at the cost of sending
the weights once per engine. With one group for all engines (`rolling=False`, slime's
layout: engine i's ranks start at 1 + the GPUs of engines before it) the weights cross the
wire once, but every engine is paused for the whole update.
"""
from __future__ import annotations

import logging
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from datetime import timedelta
from typing import Any, Callable, Iterable, Optional, Sequence

import httpx
import torch
import torch.distributed as dist
from torch import Tensor

log = logging.getLogger("clawr1.weight_sync")

PAUSE_MODES = ("abort", "retract", "in_place")
REFUSAL_GRACE_S = 10.0  # after a failed broadcast, how long to wait for an engine's refusal to explain it
Broadcast = Callable[[Tensor], None]


class WeightSyncError(RuntimeError):
    """An engine refused or failed a step of the weight update; the message names the engine."""


# ---------------------------------------------------------------- payloads (docs/sglang_api_notes.md §6)


def init_group_payload(master_address: str, master_port: int, rank_offset: int, world_size: int,
                       group_name: str, backend: str = "nccl") -> dict[str, Any]:
    """POST /init_weights_update_group: the engine's TP rank r joins as rank rank_offset + r."""
    return {"master_address": master_address, "master_port": master_port, "rank_offset": rank_offset,
            "world_size": world_size, "group_name": group_name, "backend": backend}


def update_from_distributed_payload(names: list[str], dtypes: list[str], shapes: list[list[int]], group_name: str,
                                    weight_version: int, flush_cache: bool = False) -> dict[str, Any]:
    """POST /update_weights_from_distributed: the engine then receives one broadcast per name, in order.

    flush_cache defaults to False: with in_place pauses requests stay in flight, and a flush
    that SGLang refuses because of them would fail the update.
    """
    return {"names": list(names), "dtypes": list(dtypes), "shapes": [list(s) for s in shapes],
            "group_name": group_name, "weight_version": str(weight_version), "flush_cache": flush_cache}


def update_from_tensor_payload(serialized_named_tensors: list[str], weight_version: int,
                               load_format: Optional[str] = None, flush_cache: bool = False) -> dict[str, Any]:
    """POST /update_weights_from_tensor (colocated engines): one base64 payload per engine TP rank."""
    payload: dict[str, Any] = {"serialized_named_tensors": list(serialized_named_tensors),
                               "weight_version": str(weight_version), "flush_cache": flush_cache}
    if load_format is not None:
        payload["load_format"] = load_format
    return payload


def pause_payload(mode: str = "in_place") -> dict[str, Any]:
    """POST /pause_generation. in_place keeps running requests and their KV cache; they resume on the new weights."""
    if mode not in PAUSE_MODES:
        raise ValueError(f"pause mode must be one of {', '.join(PAUSE_MODES)}, got {mode!r}")
    return {"mode": mode}


def continue_payload() -> dict[str, Any]:
    """POST /continue_generation (SGLang's defaults)."""
    return {}


def destroy_group_payload(group_name: str) -> dict[str, Any]:
    """POST /destroy_weights_update_group."""
    return {"group_name": group_name}


def begin_weight_update_payload(selector: str = "all") -> dict[str, Any]:
    """POST /begin_weight_update (SGLang >= 0.5.23 refuses weight updates outside such a session)."""
    return {"selector": selector}


def end_weight_update_payload() -> dict[str, Any]:
    """POST /end_weight_update."""
    return {}


# ---------------------------------------------------------------- layout


def dtype_name(dtype: torch.dtype) -> str:
    """torch.bfloat16 -> "bfloat16", the name SGLang resolves with getattr(torch, name)."""
    return str(dtype).removeprefix("torch.")


def buckets(named_tensors: list[tuple[str, Tensor]], bucket_bytes: int) -> list[list[tuple[str, Tensor]]]:
    """Consecutive groups of at most bucket_bytes each, in order; a larger tensor is a bucket of its own."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    out: list[list[tuple[str, Tensor]]] = []
    size = 0
    for name, t in named_tensors:
        nbytes = t.numel() * t.element_size()
        if not out or size + nbytes > bucket_bytes:
            out.append([])
            size = 0
        out[-1].append((name, t))
        size += nbytes
    return out


def rank_offsets(gpus_per_engine: list[int]) -> tuple[list[int], int]:
    """Each engine's first rank in one shared group, and the group's size (trainer rank 0 + every engine GPU)."""
    offsets, nxt = [], 1
    for i, gpus in enumerate(gpus_per_engine):
        if gpus < 1:
            raise ValueError(f"engine {i} has {gpus} GPUs; every engine needs at least 1")
        offsets.append(nxt)
        nxt += gpus
    return offsets, nxt


# ---------------------------------------------------------------- the NCCL part


def host_store(address: str, port: int, timeout_s: float) -> dist.TCPStore:
    """The rendezvous store the engines connect to, served here (port 0: a free one, see .port).

    One store serves every group: the engines scope their keys by group name. It does not wait
    for the engines, so it can be up before they are asked to join.
    """
    return dist.TCPStore(address, port, None, True, timedelta(seconds=timeout_s), wait_for_workers=False)


class RankZeroGroup:
    """Trainer rank 0's end of a group that engines join via /init_weights_update_group (see the module doc).

    Creating it is lazy for NCCL (the communicator forms on the first broadcast, as on the
    engines) and blocks until every member joined for gloo.
    """

    def __init__(self, store: dist.Store, group_name: str, world_size: int, backend: str = "nccl",
                 timeout_s: float = 600.0):
        device = "cuda" if backend == "nccl" else "cpu"
        # the engine's scope (PrefixStore(group_name)), then the two torch's helper adds
        scoped = dist.PrefixStore(f"{device}/", dist.PrefixStore(f"{group_name}/", dist.PrefixStore(group_name, store)))
        self.backend, self.device = backend, device
        self.pg = _backend(backend, scoped, world_size, timedelta(seconds=timeout_s))
        self.pg._set_sequence_number_for_group()  # as torch's helper does, so both ends start alike

    def broadcast(self, tensor: Tensor) -> None:
        """Send `tensor` from rank 0 to every other member; returns once it is sent."""
        if self.device == "cuda" and not tensor.is_cuda:
            tensor = tensor.cuda()
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = 0, 0
        self.pg.broadcast([tensor.contiguous()], opts).wait()

    def close(self) -> None:
        shutdown = getattr(self.pg, "shutdown", None)
        if shutdown is not None:
            try:
                shutdown()
            except RuntimeError as e:  # an engine already gone: nothing left to release
                log.debug("closing group: %s", e)


def _backend(backend: str, store: dist.Store, world_size: int, timeout: timedelta):
    if backend == "gloo":
        return dist.ProcessGroupGloo(store, 0, world_size, timeout)
    if backend != "nccl":
        raise ValueError(f"backend must be nccl or gloo, got {backend!r}")
    if not dist.is_nccl_available():
        raise RuntimeError("this torch build has no NCCL; weight sync over nccl needs a CUDA build")
    opts = dist.ProcessGroupNCCL.Options()
    opts.is_high_priority_stream = False
    opts._timeout = timeout
    return dist.ProcessGroupNCCL(store, 0, world_size, opts)


# ---------------------------------------------------------------- the HTTP part


class DistributedWeightSync:
    """Trainer rank 0 pushes named tensors to SGLang engines: pause, receive by broadcast, continue.

    `broadcast`, if given, replaces the NCCL groups (connect() then only talks HTTP): tests use it.
    `weight_update_session` wraps each engine's update in /begin_weight_update and
    /end_weight_update, which SGLang >= 0.5.23 requires and 0.5.15 does not have.
    """

    def __init__(self, engine_urls: Sequence[str], *, group_name: str = "clawr1_weights",
                 bucket_bytes: int = 512 << 20, weight_update_session: bool = False, rolling: bool = True,
                 pause_mode: str = "in_place", backend: str = "nccl", broadcast: Optional[Broadcast] = None,
                 timeout_s: float = 600.0):
        if not engine_urls:
            raise ValueError("no engine URLs to sync weights to")
        pause_payload(pause_mode)  # validates
        self.urls = [u.rstrip("/") for u in engine_urls]
        self.group_name, self.bucket_bytes, self.rolling = group_name, bucket_bytes, rolling
        self.weight_update_session, self.pause_mode, self.backend = weight_update_session, pause_mode, backend
        self.timeout_s = timeout_s
        self._broadcast = broadcast
        self._http = {u: httpx.Client(base_url=u, timeout=timeout_s) for u in self.urls}
        self._pool = ThreadPoolExecutor(max_workers=len(self.urls), thread_name_prefix="weight-sync")
        self._units: list[list[int]] = []  # engine indices sharing a group, updated together
        self._names: list[str] = []  # each unit's group name
        self._groups: list[RankZeroGroup] = []
        self._store: Optional[dist.TCPStore] = None

    # ---- HTTP
    def _post(self, url: str, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        """POST and check: HTTP 200 and no success=false, else WeightSyncError naming the engine and the body."""
        try:
            resp = self._http[url].post(path, json=payload)
        except httpx.HTTPError as e:
            raise WeightSyncError(f"engine {url}: {path} failed: {e!r}") from e
        try:
            body = resp.json()
        except ValueError:
            body = None
        if resp.status_code != 200 or not isinstance(body, dict) or body.get("success") is False:
            raise WeightSyncError(f"engine {url}: {path} answered HTTP {resp.status_code}: {resp.text[:1000]}")
        return body

    def _post_each(self, urls: list[str], path: str, payloads: list[dict[str, Any]]) -> list[Future]:
        return [self._pool.submit(self._post, u, path, p) for u, p in zip(urls, payloads)]

    @staticmethod
    def _results(futures: list[Future]) -> None:
        for f in futures:
            f.result()  # re-raises the engine's WeightSyncError

    # ---- connect
    def connect(self, master_address: str, master_port: int, gpus_per_engine: list[int]) -> None:
        """Form the weight-update group(s): every engine joins concurrently while rank 0 joins here.

        master_address must be reachable from the engines; master_port 0 picks a free port.
        """
        if len(gpus_per_engine) != len(self.urls):
            raise ValueError(f"gpus_per_engine has {len(gpus_per_engine)} entries for {len(self.urls)} engines")
        if self._units:
            self.disconnect()
        n = len(self.urls)
        self._units = [[i] for i in range(n)] if self.rolling else [list(range(n))]
        self._names = [f"{self.group_name}-{i}" for i in range(n)] if self.rolling else [self.group_name]
        if self._broadcast is None:
            self._store = host_store(master_address, master_port, self.timeout_s)
            master_port = self._store.port
        futures, worlds = [], []
        for unit, name in zip(self._units, self._names):
            offsets, world = rank_offsets([gpus_per_engine[i] for i in unit])
            worlds.append(world)
            futures += self._post_each([self.urls[i] for i in unit], "/init_weights_update_group",
                                       [init_group_payload(master_address, master_port, off, world, name, self.backend)
                                        for off in offsets])
        if self._broadcast is None:
            try:
                self._groups = [RankZeroGroup(self._store, name, world, self.backend, self.timeout_s)
                                for name, world in zip(self._names, worlds)]
            except Exception as err:
                self._raise_refusal(futures, err)
                raise
        self._results(futures)
        log.info("weight-update groups %s formed with %d engine(s)", ", ".join(self._names), n)

    def disconnect(self) -> None:
        """Ask every engine to leave its group, and release ours."""
        futures = []
        for unit, name in zip(self._units, self._names):
            futures += self._post_each([self.urls[i] for i in unit], "/destroy_weights_update_group",
                                       [destroy_group_payload(name)] * len(unit))
        for group in self._groups:
            group.close()
        self._units, self._names, self._groups, self._store = [], [], [], None
        self._results(futures)

    # ---- push
    def push(self, named_tensors: Iterable[tuple[str, Tensor]], version: int) -> None:
        """Load these tensors into every engine as weight version `version`, one group of engines at a time.

        Tensors go in the order given, bucket by bucket (cast them to the engines' dtype first to
        send less; SGLang casts on load). If an engine fails, push raises WeightSyncError and
        leaves the engines of that group paused: their weights may be partly updated, and
        serving them under the old version would poison the samples.
        """
        if not self._units:
            raise WeightSyncError("push() before connect(): no weight-update group")
        bucketed = buckets(list(named_tensors), self.bucket_bytes)
        for k, (unit, name) in enumerate(zip(self._units, self._names)):
            send = self._broadcast or self._groups[k].broadcast
            self._update_unit([self.urls[i] for i in unit], name, bucketed, version, send)

    def _update_unit(self, urls: list[str], group_name: str, bucketed: list[list[tuple[str, Tensor]]],
                     version: int, send: Broadcast) -> None:
        self._results(self._post_each(urls, "/pause_generation", [pause_payload(self.pause_mode)] * len(urls)))
        if self.weight_update_session:
            self._results(self._post_each(urls, "/begin_weight_update", [begin_weight_update_payload()] * len(urls)))
        for bucket in bucketed:
            names, tensors = [n for n, _ in bucket], [t for _, t in bucket]
            payload = update_from_distributed_payload(names, [dtype_name(t.dtype) for t in tensors],
                                                      [list(t.shape) for t in tensors], group_name, version)
            self._send_bucket(urls, payload, tensors, send)
        if self.weight_update_session:
            self._results(self._post_each(urls, "/end_weight_update", [end_weight_update_payload()] * len(urls)))
        self._results(self._post_each(urls, "/continue_generation", [continue_payload()] * len(urls)))
        log.debug("engines %s now at weight version %d", ", ".join(urls), version)

    def _send_bucket(self, urls: list[str], payload: dict[str, Any], tensors: list[Tensor], send: Broadcast) -> None:
        """Announce a bucket to the engines (their calls return once received), then broadcast its tensors."""
        futures = self._post_each(urls, "/update_weights_from_distributed", [payload] * len(urls))
        try:
            for t in tensors:
                send(t)
        except Exception as err:
            self._raise_refusal(futures, err)
            raise
        self._results(futures)

    @staticmethod
    def _raise_refusal(futures: list[Future], err: Exception) -> None:
        """A collective failed (or timed out) because a peer never joined: raise that engine's refusal, if any."""
        wait(futures, timeout=REFUSAL_GRACE_S, return_when=FIRST_EXCEPTION)
        for f in futures:
            if f.done() and f.exception() is not None:
                raise f.exception() from err

    # ---- lifetime
    def close(self) -> None:
        """Release the groups (without asking the engines) and the HTTP clients."""
        for group in self._groups:
            group.close()
        self._groups, self._store = [], None
        self._pool.shutdown(wait=False)
        for client in self._http.values():
            client.close()

    def __enter__(self) -> "DistributedWeightSync":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
