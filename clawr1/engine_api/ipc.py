"""Colocated weight handover (trainer.weight_sync=ipc): the trainer's tensors shared in place, never copied
through a socket or a disk, in clawr1's own format (no pickle).

The trainer packs its published tensors into buckets: one flat byte buffer per bucket (at most
trainer.weight_sync_bucket_mb, or one tensor larger than that), each tensor at an offset in it. Each bucket's
storage is shared as a handle (CUDA: a CUDA IPC handle, `kind: "cuda"`; in tests, CPU shared memory stands in:
`kind: "cpu_shm"`). One request carries every bucket:

    {"format": "clawr1-ipc-v1", "weight_version": 7,
     "buckets": [{"kind": "cuda", "nbytes": 536870912,
                  "handle": [0, {"b64": "..."}, 536870912, 0, {"b64": "..."}, 0, {"b64": "..."}, true],
                  "tensors": [{"name": "model.embed_tokens.weight", "dtype": "bfloat16",
                               "shape": [151936, 896], "offset": 0}, ...]}, ...]}

`handle` is the tuple torch's storage sharing returns (`_share_cuda_`, `_share_filename_cpu_`), bytes as
{"b64": ...}; `offset` is in bytes from the bucket's start (a multiple of 256, so every view is aligned).
Contract: the engine opens every bucket, checks every name and shape against its model, and loads all of
them in one step boundary (the in-place pause between forward passes: running requests are retracted and
recomputed, as for every weight change), then takes `weight_version`. The trainer keeps its buffers alive
until the engine has answered. SGLang's own form of the same handover (`update_weights_from_tensor` with
its serialized CUDA IPC tensors) is a pickle; this format is what the embedded engine takes instead.
"""
from __future__ import annotations

import base64
from typing import Any

import torch

FORMAT = "clawr1-ipc-v1"
ALIGN = 256
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
KINDS = ("cuda", "cpu_shm")


class IpcFormatError(ValueError):
    """A payload that is not clawr1-ipc-v1 (the engine answers 400 with this text)."""


def buckets_of(state: dict[str, torch.Tensor], bucket_bytes: int) -> list[list[str]]:
    """Tensor names in order, cut into buckets of at most bucket_bytes (a larger tensor is a bucket alone)."""
    out: list[list[str]] = []
    size = 0
    for name, t in state.items():
        n = _aligned(t.nbytes)
        if not out or (size + n > bucket_bytes and out[-1]):
            out.append([])
            size = 0
        out[-1].append(name)
        size += n
    return out


def pack(state: dict[str, torch.Tensor], names: list[str], device: torch.device) -> tuple[torch.Tensor, list[dict]]:
    """One bucket: a flat byte buffer on `device` holding the named tensors, and their entries."""
    entries, offset = [], 0
    for name in names:
        t = state[name]
        entries.append({"name": name, "dtype": _dtype_name(t.dtype), "shape": list(t.shape), "offset": offset})
        offset += _aligned(t.nbytes)
    flat = torch.empty(max(offset, 1), dtype=torch.uint8, device=device)
    for entry, name in zip(entries, names):
        t = state[name].detach().contiguous()
        flat[entry["offset"]:entry["offset"] + t.nbytes].copy_(t.reshape(-1).view(torch.uint8), non_blocking=True)
    return flat, entries


def share(flat: torch.Tensor) -> dict[str, Any]:
    """The handle of a bucket's storage: CUDA IPC on a GPU, CPU shared memory otherwise."""
    if flat.is_cuda:
        torch.cuda.current_stream(flat.device).synchronize()  # the copies into it are done before anyone reads it
        return {"kind": "cuda", "handle": _encode(flat.untyped_storage()._share_cuda_())}
    flat.share_memory_()
    return {"kind": "cpu_shm", "handle": _encode(flat.untyped_storage()._share_filename_cpu_())}


def payload(buckets: list[tuple[torch.Tensor, list[dict]]], version: int) -> dict[str, Any]:
    return {"format": FORMAT, "weight_version": version,
            "buckets": [{**share(flat), "nbytes": flat.numel(), "tensors": entries} for flat, entries in buckets]}


def open_payload(body: dict[str, Any]) -> tuple[dict[str, torch.Tensor], int | None]:
    """Named tensors viewing the shared buckets (valid while the sender keeps them), and the version."""
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise IpcFormatError(f"format must be {FORMAT!r}")
    buckets = body.get("buckets")
    if not isinstance(buckets, list) or not buckets:
        raise IpcFormatError("buckets must be a non-empty list")
    state: dict[str, torch.Tensor] = {}
    for i, bucket in enumerate(buckets):
        for name, t in _open_bucket(bucket, i).items():
            if name in state:
                raise IpcFormatError(f"{name} is in more than one bucket")
            state[name] = t
    version = body.get("weight_version")
    if version is not None and (not isinstance(version, int) or version < 0):
        raise IpcFormatError("weight_version must be a non-negative integer")
    return state, version


def _open_bucket(bucket: Any, i: int) -> dict[str, torch.Tensor]:
    if not isinstance(bucket, dict) or bucket.get("kind") not in KINDS:
        raise IpcFormatError(f"bucket {i}: kind must be one of {KINDS}")
    nbytes, entries = bucket.get("nbytes"), bucket.get("tensors")
    if not isinstance(nbytes, int) or nbytes <= 0 or not isinstance(entries, list):
        raise IpcFormatError(f"bucket {i}: needs nbytes > 0 and a list of tensors")
    try:
        fields = _decode(bucket.get("handle"))
        storage = (torch.UntypedStorage._new_shared_cuda(*fields) if bucket["kind"] == "cuda"
                   else torch.UntypedStorage._new_shared_filename_cpu(*fields))
    except Exception as e:  # a stale or foreign handle
        raise IpcFormatError(f"bucket {i}: cannot open its handle: {type(e).__name__}: {e}") from None
    if storage.nbytes() < nbytes:
        raise IpcFormatError(f"bucket {i}: its storage holds {storage.nbytes()} bytes, not {nbytes}")
    flat = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)[:nbytes]
    return {e["name"]: _view(flat, e, i) for e in entries}


def _view(flat: torch.Tensor, entry: Any, i: int) -> torch.Tensor:
    try:
        dtype, shape, offset = DTYPES[entry["dtype"]], [int(d) for d in entry["shape"]], int(entry["offset"])
    except (KeyError, TypeError, ValueError):
        raise IpcFormatError(f"bucket {i}: a tensor entry needs name, dtype ({', '.join(DTYPES)}), shape and "
                             f"offset") from None
    n = dtype.itemsize
    for d in shape:
        n *= d
    if offset < 0 or offset % ALIGN or offset + n > flat.numel():
        raise IpcFormatError(f"bucket {i}: {entry['name']} at offset {offset} ({n} bytes) is outside the bucket "
                             f"or not aligned to {ALIGN}")
    return flat[offset:offset + n].view(dtype).view(shape)


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _dtype_name(dtype: torch.dtype) -> str:
    for name, d in DTYPES.items():
        if d == dtype:
            return name
    raise IpcFormatError(f"dtype {dtype} cannot be handed over (only {', '.join(DTYPES)})")


def _encode(fields: tuple) -> list:
    return [{"b64": base64.b64encode(f).decode()} if isinstance(f, bytes) else f for f in fields]


def _decode(fields: Any) -> list:
    if not isinstance(fields, list):
        raise IpcFormatError("handle must be a list")
    return [base64.b64decode(f["b64"]) if isinstance(f, dict) else f for f in fields]
