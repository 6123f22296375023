"""bench(): time a callable honestly and return samples, not one number.

The module is not called `bench` so that `perfkit.bench` stays the function whatever was imported first.

Warm-up calls run first and are thrown away (allocator, caches, lazy initialisation, autotuning).
On CUDA each repetition is bracketed by CUDA events on the current stream and the device is
synchronised once, before reading them, so asynchronous launches are neither missed (no sync at all)
nor inflated (a sync per call adds the launch queue drain to every sample). On the CPU the host
clock is used. `inner` repeats the call inside one sample for functions too short for the clock.
`sync="each"` is the host clock with the device synchronised around every call: the whole cost of
work that mixes host and device (a copy to the host, then Python), or what a sync per call costs.
`clock="cpu"` times the CPU the process spent instead of the wall clock (host-side work only): another
job on the machine does not add to it while the probe has a core, so record it in `cpu_ms`, a unit of
its own that a claim in ms is never judged with.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

__all__ = ["bench", "interleave"]

SYNCS = ("auto", "cuda", "each", "none")
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
MAX_SAMPLES = 10_000


def _cuda_for(sync: str):
    if sync not in SYNCS:
        raise ValueError(f"sync must be one of {', '.join(SYNCS)}, got {sync!r}")
    if sync == "none":
        return None
    torch = sys.modules.get("torch")
    if sync != "auto":
        if torch is None or not torch.cuda.is_available():
            raise ValueError(f"bench(sync={sync!r}) needs torch with a CUDA device")
        return torch.cuda
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda
    return None


def _more(count: int, spent: float, repeat: int, min_time_s: float | None, cap: int) -> bool:
    if count >= cap:  # memory and the statistics stay bounded whatever min_time_s asks
        return False
    return count < repeat or (min_time_s is not None and spent < min_time_s)


def _by_events(fn, cuda, *, repeat: int, min_time_s: float | None, inner: int, cap: int) -> list[float]:
    cuda.synchronize()
    pairs = []
    t_start = time.perf_counter()
    while _more(len(pairs), time.perf_counter() - t_start, repeat, min_time_s, cap):  # host time bounds the loop
        start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        pairs.append((start, end))
    cuda.synchronize()
    return [s.elapsed_time(e) / 1e3 / inner for s, e in pairs]


def _by_host_clock(
    fn, drain, *, repeat: int, min_time_s: float | None, inner: int, cap: int, clock=time.perf_counter
) -> list[float]:
    """`drain`: the device synchronisation to run after every call, or None (nothing added to the loop);
    `clock`: what a sample reads (the wall clock, or the process's CPU time); `min_time_s` is in its seconds."""
    call = fn if drain is None else (lambda: (fn(), drain()))
    samples: list[float] = []
    spent = 0.0
    while _more(len(samples), spent, repeat, min_time_s, cap):
        if drain is not None:
            drain()  # outside the sample: what earlier calls left queued is not this sample's
        t0 = clock()
        for _ in range(inner):
            call()
        dt = clock() - t0
        spent += dt
        samples.append(dt / inner)
    return samples


def bench(
    fn: Callable[[], object],
    *,
    warmup: int = 3,
    repeat: int = 20,
    min_time_s: float | None = None,
    inner: int = 1,
    sync: str = "auto",
    max_samples: int = MAX_SAMPLES,
    clock: str = "wall",
) -> list[float]:
    """Seconds per call of `fn()`, one sample per repetition (`inner` calls averaged).

    Runs at least `repeat` samples, and more until `min_time_s` of measured time when given, but
    never more than `max_samples`: a tiny function timed for long would otherwise return hundreds
    of thousands of samples (raise `inner` to time it longer).
    `sync`: "auto" (CUDA events when torch has initialised CUDA), "cuda" (CUDA events), "each"
    (host clock, the device synchronised after every call) or "none" (host clock only).
    `clock`: "wall" (the default) or "cpu", the CPU seconds of this process (host work; never CUDA events).
    """
    if repeat < 1 or inner < 1 or warmup < 0 or max_samples < repeat:
        raise ValueError("bench needs repeat >= 1, inner >= 1, warmup >= 0 and max_samples >= repeat")
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {', '.join(CLOCKS)}, got {clock!r}")
    if clock == "cpu":
        for _ in range(warmup):
            fn()
        return _by_host_clock(fn, None, repeat=repeat, min_time_s=min_time_s, inner=inner, cap=max_samples,
                              clock=CLOCKS["cpu"])  # fmt: skip
    cuda = _cuda_for(sync)
    for _ in range(warmup):
        fn()
    if cuda is not None and sync != "each":
        return _by_events(fn, cuda, repeat=repeat, min_time_s=min_time_s, inner=inner, cap=max_samples)
    drain = cuda.synchronize if cuda is not None else None
    return _by_host_clock(fn, drain, repeat=repeat, min_time_s=min_time_s, inner=inner, cap=max_samples)


def interleave(
    arms: dict[str, Callable[[], object]],
    *,
    turns: int = 10,
    repeat: int = 20,
    warmup: int = 3,
    min_time_s: float | None = None,
    replicate: int = 0,
    **bench_options,
) -> dict[str, list[float]]:
    """Time the arms of a comparison in turns, in one process: seconds per call of each, as `bench` times them.

    Each of the `turns` visits every arm for its share of `repeat` (and of `min_time_s`), in the opposite
    order on every other turn (A B, B A, A B, ...), and an odd `replicate` starts from the other end, so a
    slow spell of the machine (another job's burst, a clock change, drift inside the process) falls on
    every arm alike instead of on whichever ran second (Pinpoint's rule; Abedi and Brecht, 2017). A
    speedup, share or ratio is then estimated within the process, from arms that saw the same machine.
    `bench_options`: the rest of `bench`'s (`inner`, `sync`, `clock`, `max_samples`).
    """
    if not arms:
        raise ValueError("interleave needs at least one arm")
    if turns < 1:
        raise ValueError(f"interleave needs turns >= 1, got {turns}")
    order = list(arms)[::-1] if replicate % 2 else list(arms)
    per_turn = -(-repeat // turns)  # at least `repeat` samples per arm in all
    share = None if min_time_s is None else min_time_s / turns
    samples: dict[str, list[float]] = {name: [] for name in arms}
    for turn in range(turns):
        for name in order if turn % 2 == 0 else order[::-1]:
            samples[name] += bench(
                arms[name], warmup=warmup if turn == 0 else 0, repeat=per_turn, min_time_s=share, **bench_options
            )
    return samples
