"""bench(): time a callable honestly and return samples, not one number.

The module is not called `bench` so that `perfkit.bench` stays the function whatever was imported first.

Warm-up calls run first and are thrown away (allocator, caches, lazy initialisation, autotuning).
On CUDA each repetition is bracketed by CUDA events on the current stream and the device is
synchronised once, before reading them, so asynchronous launches are neither missed (no sync at all)
nor inflated (a sync per call adds the launch queue drain to every sample). On the CPU the host
clock is used. ``inner`` repeats the call inside one sample for functions too short for the clock.
"""

from __future__ import annotations

import sys
import time
from typing import Callable

__all__ = ["bench"]


def _cuda_for(sync: str):
    if sync == "none":
        return None
    torch = sys.modules.get("torch")
    if sync == "cuda":
        if torch is None or not torch.cuda.is_available():
            raise ValueError("bench(sync='cuda') needs torch with a CUDA device")
        return torch.cuda
    if sync != "auto":
        raise ValueError(f"sync must be 'auto', 'cuda' or 'none', got {sync!r}")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda
    return None


def bench(
    fn: Callable[[], object],
    *,
    warmup: int = 3,
    repeat: int = 20,
    min_time_s: float | None = None,
    inner: int = 1,
    sync: str = "auto",
) -> list[float]:
    """Seconds per call of ``fn()``, one sample per repetition (``inner`` calls averaged).

    Runs at least ``repeat`` samples, and more until ``min_time_s`` of measured time when given.
    ``sync``: "auto" (CUDA events when torch has initialised CUDA), "cuda" or "none" (host clock).
    """
    if repeat < 1 or inner < 1 or warmup < 0:
        raise ValueError("bench needs repeat >= 1, inner >= 1 and warmup >= 0")
    cuda = _cuda_for(sync)
    for _ in range(warmup):
        fn()
    if cuda is not None:
        cuda.synchronize()
        pairs = []
        spent = 0.0
        t_start = time.perf_counter()
        while len(pairs) < repeat or (min_time_s is not None and spent < min_time_s):
            start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
            start.record()
            for _ in range(inner):
                fn()
            end.record()
            pairs.append((start, end))
            spent = time.perf_counter() - t_start  # host time bounds the loop; events give samples
        cuda.synchronize()
        return [s.elapsed_time(e) / 1e3 / inner for s, e in pairs]
    samples: list[float] = []
    spent = 0.0
    clock = time.perf_counter
    while len(samples) < repeat or (min_time_s is not None and spent < min_time_s):
        t0 = clock()
        for _ in range(inner):
            fn()
        dt = clock() - t0
        spent += dt
        samples.append(dt / inner)
    return samples
