"""A stage of a device benchmark that must not hide the others: its result, or its error as a result."""
from __future__ import annotations

import time
import traceback
from typing import Callable


def error_result(e: BaseException) -> dict:
    """A failed stage as the JSON line reports it (within an `except` block: the traceback is the current one)."""
    return {"ok": False, "error": f"{type(e).__name__}: {e}"[:2000], "traceback": traceback.format_exc()[-4000:]}


def guarded(fn: Callable[[], dict]) -> tuple[dict, float]:
    """`fn()`'s result, or its error as `error_result`; and the seconds it took."""
    t0 = time.monotonic()
    try:
        res = fn()
    except Exception as e:  # noqa: BLE001 (one failing stage must not hide the others)
        res = error_result(e)
    return res, time.monotonic() - t0
