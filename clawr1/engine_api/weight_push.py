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

What each engine sees, per update (docs/sglang_api_notes.md §6a): /pause_generation in the
mode its release supports (retract from SGLang 0.5.21 on: running requests are recomputed on
the new weights; abort before: they end), /begin_weight_update where the release requires a
weight-update session (0.5.21 on; detected once per engine from its /server_info, or from a
404), /flush_cache retried until accepted (no cache entry of the old weights survives), one
/update_weights_from_distributed per bucket while rank 0 broadcasts the bucket's tensors,
/end_weight_update, /continue_generation. An engine that refuses a bucket never joins its
broadcast: the refusal is raised within `refusal_grace_s` and the pending broadcast is
abandoned (the group is then unusable until connect() runs again). With NCCL a broadcast returns
once queued on the GPU, not once received, so a finished sender says nothing: after a refusal an
NCCL group is always aborted, or the orphaned broadcast would hold the trainer's CUDA stream until
NCCL's watchdog ends the process.

One NCCL on both ends: NCCL refuses peers of another release, so for backend nccl connect() compares
the trainer's NCCL version with each engine's (reported in /model_info) before any engine joins a
group, and refuses a mismatch naming both (clawr1/engine_api/nccl.py).
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import FIRST_COMPLETED, FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from datetime import timedelta
from typing import Any, Callable, Iterable, Optional, Sequence, Union

import httpx
import torch
import torch.distributed as dist
from torch import Tensor

from clawr1.engine_api.client import EngineError, SyncEngineClient, UpdateProtocol
from clawr1.engine_api.nccl import local_nccl_version, release_nccl, reported_nccl_version

log = logging.getLogger("clawr1.weight_sync")

PAUSE_MODES = ("abort", "retract", "in_place")
REFUSAL_GRACE_S = 3.0  # after an engine refused (or a broadcast failed), how long the other side may take to finish
FLUSH_TIMEOUT_S = 120.0  # how long /flush_cache may keep refusing (requests still running) before the push fails
BROADCAST_THREAD = "weight-sync-broadcast"  # the thread that runs one bucket's broadcasts
_ABANDONED: list = []  # gloo groups with a broadcast no peer will finish (see RankZeroGroup.abort)
Broadcast = Callable[[Tensor], None]
NamedTensors = Union[Mapping[str, Tensor], Iterable[tuple[str, Tensor]], Callable[[], Iterable[tuple[str, Tensor]]]]


class WeightSyncError(RuntimeError):
    """An engine refused or failed a step of the weight update; the message names the engine."""


class NcclVersionMismatch(WeightSyncError):
    """The trainer and an engine run different NCCL releases, which NCCL's init rejects; raised before any broadcast."""


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


def pause_payload(mode: str = "retract") -> dict[str, Any]:
    """POST /pause_generation. retract: running requests go back to the queue and are recomputed after
    /continue_generation; abort: they end now (finish_reason abort); in_place: they keep their KV cache,
    which then holds old-weight entries and makes SGLang refuse /flush_cache (never used for updates)."""
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


def iter_buckets(named_tensors: Iterable[tuple[str, Tensor]], bucket_bytes: int) -> Iterator[list[tuple[str, Tensor]]]:
    """Consecutive groups of at most bucket_bytes each, in order; a larger tensor is a bucket of its own.

    Lazy: tensors are drawn one at a time, and a bucket is yielded as soon as the next tensor does
    not fit, so a caller that stages each bucket on a device holds one bucket there at a time.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    bucket: list[tuple[str, Tensor]] = []
    size = 0
    for name, t in named_tensors:
        nbytes = t.numel() * t.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, t))
        size += nbytes
    if bucket:
        yield bucket


def buckets(named_tensors: Iterable[tuple[str, Tensor]], bucket_bytes: int) -> list[list[tuple[str, Tensor]]]:
    """All of iter_buckets at once."""
    return list(iter_buckets(named_tensors, bucket_bytes))


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
        self.name, self.backend, self.device = group_name, backend, device
        self.pg = _backend(backend, scoped, world_size, timedelta(seconds=timeout_s))
        self.pg._set_sequence_number_for_group()  # as torch's helper does, so both ends start alike
        self.broken: Optional[str] = None  # why the group can no longer be used (see abort)
        self._cancel = threading.Event()

    @property
    def queues_broadcasts(self) -> bool:
        """broadcast() returns once the broadcast is queued (NCCL), not once every member received it (gloo)."""
        return self.backend == "nccl"

    def broadcast(self, tensor: Tensor) -> None:
        """Send `tensor` from rank 0 to every other member.

        gloo: returns once every member received it, or raises once abort() gave up on it.
        NCCL: returns once the broadcast is queued on the GPU; the engines' replies to
        /update_weights_from_distributed say when it arrived (as slime waits on them).
        """
        if self.broken is not None:
            raise WeightSyncError(f"weight-update group {self.name} is unusable: {self.broken}")
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = 0, 0
        if self.device == "cuda":
            tensor = tensor if tensor.is_cuda else tensor.cuda()
            with torch.cuda.device(tensor.device):  # this may run in a thread of its own, whose device is 0
                self.pg.broadcast([tensor.contiguous()], opts).wait()  # orders the stream; does not block the host
            return
        work = self.pg.broadcast([tensor.contiguous()], opts)
        done = threading.Event()
        work.get_future().add_done_callback(lambda _: done.set())
        while not done.wait(0.05):  # a member that never joins holds gloo until its timeout: do not wait for that
            if self._cancel.is_set():
                raise WeightSyncError(f"broadcast on weight-update group {self.name} abandoned: {self.broken}")
        work.wait()  # raises the collective's error, if any

    def abort(self, reason: str) -> None:
        """Give up on pending broadcasts (a member will never join them); the group is unusable afterwards."""
        self.broken = reason
        self._cancel.set()
        if self.backend == "nccl":
            try:
                self.pg.abort()  # tears the communicator down, so the queued broadcast does not hang the GPU
            except Exception as e:  # noqa: BLE001 (best effort: the group is given up either way)
                log.warning("aborting weight-update group %s: %s", self.name, e)
        else:  # gloo cannot cancel it: destroying the group would wait for its timeout, so it is kept
            _ABANDONED.append(self.pg)

    def close(self) -> None:
        shutdown = getattr(self.pg, "shutdown", None)
        if shutdown is not None and self.broken is None:
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


class _Sender:
    """Runs one bucket's broadcasts in a thread of its own, so the engines' replies can be watched meanwhile."""

    def __init__(self, send: Broadcast, tensors: list[Tensor]):
        self.future: Future = Future()
        self.thread = threading.Thread(target=self._run, args=(send, tensors), name=BROADCAST_THREAD, daemon=True)
        self.thread.start()

    def _run(self, send: Broadcast, tensors: list[Tensor]) -> None:
        try:
            for t in tensors:
                send(t)
        except BaseException as e:  # handed to the waiting pusher
            self.future.set_exception(e)
        else:
            self.future.set_result(None)


def _replayable(named_tensors: NamedTensors, times: int) -> Callable[[], Iterable[tuple[str, Tensor]]]:
    """A source of (name, tensor) pairs that can be read once per group of engines."""
    if callable(named_tensors):
        return named_tensors
    if isinstance(named_tensors, Mapping):
        return lambda: named_tensors.items()
    if isinstance(named_tensors, (list, tuple)) or times == 1:
        return lambda: named_tensors
    pairs = list(named_tensors)  # a one-shot iterator read by several groups
    return lambda: pairs


class DistributedWeightSync:
    """Trainer rank 0 pushes named tensors to SGLang engines: pause, flush, receive by broadcast, continue.

    What each engine supports (its pause mode, whether it needs a weight-update session) is
    detected once per engine, from its /server_info (see clawr1.engine_api.client.update_protocol);
    nothing is configured. `broadcast`, if given, replaces the NCCL groups (connect() then only
    talks HTTP): tests use it. `stage` moves each tensor to the group's device as its bucket is
    filled (default: to CUDA for nccl, as is for gloo), so one bucket at a time is on the device.
    `nccl_version` is the trainer's (default: this process's torch's); `group_class` builds rank 0's
    end of each group (tests stand in for NCCL's queueing with a subclass).
    """

    def __init__(self, engine_urls: Sequence[str], *, group_name: str = "clawr1_weights",
                 bucket_bytes: int = 512 << 20, rolling: bool = True, backend: str = "nccl",
                 broadcast: Optional[Broadcast] = None, timeout_s: float = 600.0,
                 refusal_grace_s: float = REFUSAL_GRACE_S, flush_timeout_s: float = FLUSH_TIMEOUT_S,
                 retry_interval_s: float = 0.5, stage: Optional[Callable[[Tensor], Tensor]] = None,
                 nccl_version: Optional[str] = None, group_class: type[RankZeroGroup] = RankZeroGroup):
        if not engine_urls:
            raise ValueError("no engine URLs to sync weights to")
        self.urls = [u.rstrip("/") for u in engine_urls]
        self.group_name, self.bucket_bytes, self.rolling = group_name, bucket_bytes, rolling
        self.backend, self.timeout_s, self.refusal_grace_s = backend, timeout_s, refusal_grace_s
        self._broadcast, self._group_class = broadcast, group_class
        self.nccl_version = nccl_version or local_nccl_version()  # the trainer's, checked against each engine's
        self._stage = stage or ((lambda t: t.to("cuda", non_blocking=True)) if backend == "nccl" and broadcast is None
                                else (lambda t: t))
        self._engines = {u: SyncEngineClient(u, timeout_s, flush_timeout_s=flush_timeout_s,
                                             retry_interval_s=retry_interval_s) for u in self.urls}
        self._http = {u: e.http for u, e in self._engines.items()}
        self._pool = ThreadPoolExecutor(max_workers=2 * len(self.urls) + 2, thread_name_prefix="weight-sync")
        self.protocols: dict[str, UpdateProtocol] = {}  # per engine, detected once
        self._session: dict[str, Optional[bool]] = {}  # per engine: needs /begin_weight_update (None: not known yet)
        self._units: list[list[int]] = []  # engine indices sharing a group, updated together
        self._names: list[str] = []  # each unit's group name
        self._groups: list[RankZeroGroup] = []
        self._store: Optional[dist.TCPStore] = None

    # ---- HTTP
    def _post(self, url: str, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        """POST and check: HTTP 200 and no success=false, else WeightSyncError naming the engine and the body."""
        return self._check(url, path, self._send(url, path, payload))

    def _send(self, url: str, path: str, payload: dict[str, Any]) -> httpx.Response:
        try:
            return self._http[url].post(path, json=payload)
        except httpx.HTTPError as e:
            raise WeightSyncError(f"engine {url}: {path} failed: {e!r}") from e

    @staticmethod
    def _check(url: str, path: str, resp: httpx.Response) -> dict[str, Any]:
        try:
            body = resp.json()
        except ValueError:
            body = None
        if resp.status_code != 200 or not isinstance(body, dict) or body.get("success") is False:
            raise WeightSyncError(f"engine {url}: {path} answered HTTP {resp.status_code}: {resp.text[:1000]}")
        return body

    def _post_each(self, urls: list[str], path: str, payloads: list[dict[str, Any]]) -> list[Future]:
        return [self._pool.submit(self._post, u, path, p) for u, p in zip(urls, payloads)]

    def _each(self, urls: list[str], fn: Callable[[str], Any]) -> None:
        """fn(url) for every engine at once; raises the first engine's failure (in `urls` order)."""
        self._results([self._pool.submit(fn, u) for u in urls])

    @staticmethod
    def _results(futures: list[Future]) -> None:
        wait(futures)
        for f in futures:
            f.result()  # re-raises the engine's WeightSyncError

    # ---- what each engine supports
    def protocol(self, url: str) -> UpdateProtocol:
        """The engine's update protocol, asked once (GET /server_info, see client.update_protocol)."""
        if url not in self.protocols:
            try:
                proto = self._engines[url].update_protocol()
            except (EngineError, httpx.HTTPError) as e:
                raise WeightSyncError(f"engine {url}: cannot tell what it supports: {e}") from e
            self.protocols[url] = proto
            self._session.setdefault(url, proto.session)
        return self.protocols[url]

    def _begin_session(self, url: str) -> None:
        """POST /begin_weight_update where the engine needs it; an unknown engine's 404 says it does not."""
        if self._session[url] is False:
            return
        resp = self._send(url, "/begin_weight_update", begin_weight_update_payload())
        if self._session[url] is None and resp.status_code in (404, 405):
            log.info("engine %s has no /begin_weight_update (HTTP %d): updates go without a session",
                     url, resp.status_code)
            self._session[url] = False
            return
        if resp.status_code == 400 and "already open" in resp.text:  # an earlier push failed inside its session
            log.warning("engine %s still had a weight-update session open: closing it first", url)
            self._post(url, "/end_weight_update", end_weight_update_payload())
            resp = self._send(url, "/begin_weight_update", begin_weight_update_payload())
        self._check(url, "/begin_weight_update", resp)
        self._session[url] = True

    def _flush(self, url: str) -> None:
        try:
            refusals = self._engines[url].flush_cache()
        except (EngineError, httpx.HTTPError) as e:
            raise WeightSyncError(f"engine {url}: {e}") from e
        if refusals:
            log.info("engine %s accepted /flush_cache after %d refusal(s)", url, refusals)

    def _release(self, urls: list[str]) -> None:
        """After a failure before any weight moved: close the sessions we opened and let the engines serve again."""
        for url in urls:
            for path, payload, needed in (("/end_weight_update", end_weight_update_payload(), self._session.get(url)),
                                          ("/continue_generation", continue_payload(), True)):
                if needed:
                    try:
                        self._post(url, path, payload)
                    except WeightSyncError as e:
                        log.warning("releasing engine %s after a failed update: %s", url, e)

    # ---- connect
    def connect(self, master_address: str, master_port: int, gpus_per_engine: list[int]) -> None:
        """Form the weight-update group(s): every engine joins concurrently while rank 0 joins here.

        master_address must be reachable from the engines; master_port 0 picks a free port. Each
        engine is first asked what it supports (once: a reconnect asks no more).
        """
        if len(gpus_per_engine) != len(self.urls):
            raise ValueError(f"gpus_per_engine has {len(gpus_per_engine)} entries for {len(self.urls)} engines")
        self._each(self.urls, self.protocol)
        if self.backend == "nccl":
            self.check_nccl_versions()
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
                self._groups = [self._group_class(self._store, name, world, self.backend, self.timeout_s)
                                for name, world in zip(self._names, worlds)]
            except Exception as err:
                self._raise_refusal(futures, err)
                raise
        self._results(futures)
        log.info("weight-update groups %s formed with %d engine(s)", ", ".join(self._names), n)

    def check_nccl_versions(self) -> None:
        """Refuse engines whose NCCL release differs from the trainer's; warn about those that do not report one.

        Runs before any engine is asked to join a group, so a mismatch never reaches NCCL's init.
        """
        if self.nccl_version is None:
            log.warning("this trainer's torch reports no NCCL version: the engines' NCCL versions are not checked")
            return
        reported = dict(zip(self.urls, self._pool.map(self._engine_nccl_version, self.urls)))
        wrong = [f"engine {url} has NCCL {v}" for url, v in reported.items() if v is not None and v != self.nccl_version]
        if wrong:
            raise NcclVersionMismatch(
                f"NCCL versions differ: this trainer has NCCL {self.nccl_version}, but {'; '.join(wrong)}. NCCL refuses "
                f"peers of another release, so no weights could be published: give the trainer and the engines the "
                f"same torch (docs/trainer.md, 'GPU install')")
        for url in (u for u, v in reported.items() if v is None):
            self._warn_unchecked(url)

    def _engine_nccl_version(self, url: str) -> Optional[str]:
        try:
            return reported_nccl_version(self._engines[url].model_info())
        except (EngineError, httpx.HTTPError, ValueError) as e:
            raise WeightSyncError(f"engine {url}: cannot read its NCCL version from /model_info: {e}") from e

    def _warn_unchecked(self, url: str) -> None:
        proto = self.protocols[url]
        pinned = release_nccl(proto.release)
        hint = ""
        if pinned is not None:
            hint = f"; its release pins torch {pinned[0]}, which brings NCCL {pinned[1]}"
            if pinned[1] != self.nccl_version:
                hint += ": unless that engine runs another torch, NCCL will refuse the group"
        log.warning("engine %s (%s) does not report its NCCL version, so it is not checked (this trainer has NCCL "
                    "%s)%s", url, proto.engine, self.nccl_version, hint)

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
    def push(self, named_tensors: NamedTensors, version: int) -> None:
        """Load these tensors into every engine as weight version `version`, one group of engines at a time.

        `named_tensors`: a mapping or a sequence of (name, tensor) pairs (or a function returning an
        iterator over them, called once per group). Tensors go in the order given, bucket by bucket,
        each moved to the device only when its bucket is filled (cast them to the engines' dtype
        first to send less; SGLang casts on load). If an engine fails before any weight moved,
        its session is closed and it serves again on its old weights; after, push raises
        WeightSyncError and leaves the engines of that group paused: their weights may be partly
        updated, and serving them under the old version would poison the samples.
        """
        if not self._units:
            raise WeightSyncError("push() before connect(): no weight-update group")
        source = _replayable(named_tensors, len(self._units))
        for k, (unit, name) in enumerate(zip(self._units, self._names)):
            group = self._groups[k] if self._groups else None
            if group is not None and group.broken is not None:
                raise WeightSyncError(f"weight-update group {name} was abandoned ({group.broken}); connect() again")
            send = self._broadcast or group.broadcast
            self._update_unit(k, [self.urls[i] for i in unit], name, source(), version, send)

    def _update_unit(self, k: int, urls: list[str], group_name: str, named: Iterable[tuple[str, Tensor]],
                     version: int, send: Broadcast) -> None:
        """pause -> [begin] -> flush -> (update + broadcast) per bucket -> [end] -> continue, for one group."""
        for url in urls:
            self.protocol(url)
        moved = False
        try:
            self._each(urls, lambda u: self._post(u, "/pause_generation", pause_payload(self.protocols[u].pause_mode)))
            self._each(urls, self._begin_session)
            self._each(urls, self._flush)
            for bucket in iter_buckets(named, self.bucket_bytes):
                names = [n for n, _ in bucket]
                tensors = [self._stage(t) for _, t in bucket]  # one bucket on the device at a time
                del bucket
                payload = update_from_distributed_payload(names, [dtype_name(t.dtype) for t in tensors],
                                                          [list(t.shape) for t in tensors], group_name, version)
                moved = True
                self._send_bucket(k, urls, payload, tensors, send)
                del tensors
            self._each([u for u in urls if self._session[u]],
                       lambda u: self._post(u, "/end_weight_update", end_weight_update_payload()))
            self._each(urls, lambda u: self._post(u, "/continue_generation", continue_payload()))
        except BaseException:
            if not moved:
                self._release(urls)
            raise
        log.debug("engines %s now at weight version %d", ", ".join(urls), version)

    def _send_bucket(self, k: int, urls: list[str], payload: dict[str, Any], tensors: list[Tensor],
                     send: Broadcast) -> None:
        """Announce a bucket to the engines (their calls return once received) and broadcast it meanwhile.

        Whichever comes first decides: every engine's 200 plus the finished broadcast (done), an
        engine's refusal (it will never join the broadcast: give the broadcast refusal_grace_s,
        then abandon it and raise the refusal), a failed broadcast (give the engines
        refusal_grace_s to explain it), or timeout_s without either.
        """
        replies = self._post_each(urls, "/update_weights_from_distributed", [payload] * len(urls))
        sender = _Sender(send, tensors)
        deadline = time.monotonic() + self.timeout_s
        while True:
            refused = next((f for f in replies if f.done() and f.exception() is not None), None)
            if refused is not None:
                self._abandon(k, sender, f"an engine refused the update: {refused.exception()}")
                raise refused.exception()
            if sender.future.done() and sender.future.exception() is not None:
                err = sender.future.exception()
                self._raise_refusal(replies, err, self.refusal_grace_s)
                self._abandon(k, sender, f"a broadcast failed: {err!r}")
                raise WeightSyncError(f"broadcast to engines {', '.join(urls)} failed and no engine said why: "
                                      f"{err!r}") from err
            if sender.future.done() and all(f.done() for f in replies):
                sender.thread.join()  # it is finishing: let go of the bucket before the next one is staged
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                silent = [u for u, f in zip(urls, replies) if not f.done()]
                state = "done" if sender.future.done() else "pending"
                self._abandon(k, sender, f"no reply within {self.timeout_s:g}s")
                raise WeightSyncError(f"engines {', '.join(silent) or '-'} did not confirm a bucket within "
                                      f"{self.timeout_s:g}s (broadcast {state})")
            wait([f for f in (sender.future, *replies) if not f.done()], timeout=remaining, return_when=FIRST_COMPLETED)

    def _abandon(self, k: int, sender: _Sender, reason: str) -> None:
        """Let a pending broadcast finish within refusal_grace_s, else abort the group so it stops waiting.

        A group whose broadcasts return once queued (NCCL) is always aborted: its sender finishing says
        only that the broadcasts were queued, and a peer that refused will never receive them.
        """
        if not sender.future.done():
            wait([sender.future], timeout=self.refusal_grace_s)
        group = self._groups[k] if self._groups else None  # an injected broadcast (tests) has nothing to abort
        if group is not None and (group.queues_broadcasts or not sender.future.done()):
            group.abort(reason)
            sender.thread.join(self.refusal_grace_s)

    @staticmethod
    def _raise_refusal(futures: list[Future], err: Exception, grace_s: float = REFUSAL_GRACE_S) -> None:
        """A collective failed (or timed out) because a peer never joined: raise that engine's refusal, if any."""
        wait(futures, timeout=grace_s, return_when=FIRST_EXCEPTION)
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
        for engine in self._engines.values():
            engine.close()

    def __enter__(self) -> "DistributedWeightSync":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
