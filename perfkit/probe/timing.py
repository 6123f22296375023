"""bench(): time a callable honestly and return samples, not one number.

The module is not called `bench` so that `perfkit.bench` stays the function whatever was imported first.

Warm-up calls run first and are thrown away (allocator, caches, lazy initialisation, autotuning).
On CUDA each repetition is bracketed by CUDA events on the current stream and the device is
synchronised once, before reading them, so asynchronous launches are neither missed (no sync at all)
nor inflated (a sync per call adds the launch queue drain to every sample). On the CPU the host
clock is used. `inner` repeats the call inside one sample for functions too short for the clock:
by default ("auto") bench calibrates it after the warm-up, doubling the calls in one sample until
they take at least `TARGET_SAMPLE_S` by the sample's own clock, and says on stderr what it chose.
`sync="each"` is the host clock with the device synchronised around every call: the whole cost of
work that mixes host and device (a copy to the host, then Python), or what a sync per call costs.
`clock="cpu"` times the CPU the process spent instead of the wall clock (host-side work only): another
job on the machine does not add to it while the probe has a core, so record it in `cpu_ms`, a unit of
its own that a claim in ms is never judged with.
"""

from __future__ import annotations

import operator
import sys
import time
from collections.abc import Callable

__all__ = ["Samples", "bench", "interleave"]

SYNCS = ("auto", "cuda", "each", "none")
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}  # read at call time: a test may stand in for them
MAX_SAMPLES = 10_000

# What inner="auto" aims a sample at. Measured on the 2-core development machine (CPython 3.11, Linux,
# two runs): time.perf_counter (clock_gettime(CLOCK_MONOTONIC), vDSO) costs 43-60 ns a read, and the
# smallest step seen between two reads is 60-140 ns; time.process_time (CLOCK_PROCESS_CPUTIME_ID, a
# system call) costs 0.46-0.51 us a read, with steps of 0.47-0.59 us. A sample's error from its clock is
# about one read plus one step: at most 0.2 us on the wall clock, 1.1 us on the CPU clock, 0.02% and
# 0.11% of 1 ms, under 1% with room for a machine whose clock reads are several times slower. Longer
# samples would buy little and make calibration, and every sample, slower.
# Re-measure: .venv/bin/python tests/test_bench_calibration.py
TARGET_SAMPLE_S = 1e-3
MAX_INNER = 1 << 20  # calls in one sample at most: about 20 ms of the cheapest Python call there is
CALIBRATION_MAX_S = 0.1  # wall seconds calibration may spend: a batch that would pass it is not run
# (a calibration that reaches the target spends under 4 * TARGET_SAMPLE_S: the doubled batches sum to
# twice the last, which is under twice the target; the bound is for calls whose CPU time is a small part
# of their wall time under clock="cpu", a sleep say, and for calls that are not the same cost each time)


class Samples(list):
    """Seconds per call, one float a sample (a list, as before), and `inner`: the calls each sample averaged."""

    inner: int = 1


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


def _check_inner(inner) -> int | str:
    if isinstance(inner, str) and inner == "auto":
        return inner
    if not isinstance(inner, bool):
        try:
            count = operator.index(inner)  # an int, or numpy's: not 2.0, not "4"
        except TypeError:
            count = 0
        if count >= 1:
            return count
    raise ValueError(f'inner must be "auto" or an int >= 1, got {inner!r}')


def _more(count: int, spent: float, repeat: int, min_time_s: float | None, cap: int) -> bool:
    if count >= cap:  # memory and the statistics stay bounded whatever min_time_s asks
        return False
    return count < repeat or (min_time_s is not None and spent < min_time_s)


def _events_batch(fn, cuda) -> Callable[[int], float]:
    """Device seconds of `n` calls, by a pair of CUDA events, from an idle device.

    Calibration on the CUDA-events path uses the clock its samples use, the events, rather than the
    host clock after a synchronisation: the host clock would add the sync's own latency and the first
    launch's to every batch (several to tens of us: most of a batch of short kernels at small counts), and what the
    target must bound is the events' resolution (about 0.5 us) and the cost of recording them, which
    only the events see. The device is synchronised before each batch so that no earlier work is in it.
    """

    def batch(n: int) -> float:
        cuda.synchronize()
        start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            fn()
        end.record()
        cuda.synchronize()
        return start.elapsed_time(end) / 1e3

    return batch


def _host_batch(call, drain, clock) -> Callable[[int], float]:
    """Seconds of `n` calls by `clock`, exactly as a host-clock sample takes them."""

    def batch(n: int) -> float:
        if drain is not None:
            drain()  # outside the sample: what earlier calls left queued is not this sample's
        t0 = clock()
        for _ in range(n):
            call()
        return clock() - t0

    return batch


def _calibrate(batch: Callable[[int], float]) -> tuple[int, float, str | None]:
    """The calls per sample: (count, seconds of one batch of that count, why it stopped short or None).

    Doubles the count from 1 until one batch takes at least TARGET_SAMPLE_S by the sample's clock, at
    most MAX_INNER calls, and never starts a batch that would take the calibration's wall time past
    CALIBRATION_MAX_S (a batch is expected to last twice the one before).
    """
    wall = CLOCKS["wall"]
    n, spent = 1, 0.0
    while True:
        w0 = wall()
        dt = batch(n)
        took = wall() - w0
        spent += took
        if dt >= TARGET_SAMPLE_S:
            return n, dt, None
        if n >= MAX_INNER:
            return n, dt, f"the most calls calibration allows ({MAX_INNER})"
        if spent + 2 * took > CALIBRATION_MAX_S:
            return n, dt, f"calibration stopped at its {_seconds(CALIBRATION_MAX_S)} bound"
        n = min(2 * n, MAX_INNER)


def _seconds(s: float) -> str:
    """Two significant digits in the unit that puts them under 100: "17 ns", "0.24 us", "1 ms", "0.1 s"."""
    s = float(f"{s:.2g}")
    for scale, unit in ((1e9, "ns"), (1e6, "us"), (1e3, "ms")):
        if s * scale < 100:
            return f"{s * scale:.2g} {unit}"
    return f"{s:.3g} s"


def _say(n: int, dt: float, short: str | None) -> None:
    if n == 1:
        return  # nothing chosen: the call alone is long enough for the clock (or calibration could not grow it)
    sample = f"a sample at least {_seconds(TARGET_SAMPLE_S)}" if short is None else f"a sample {_seconds(dt)}, {short}"
    print(f"bench: {n} calls per sample (one call takes about {_seconds(dt / n)}; {sample})", file=sys.stderr)


def _auto(batch: Callable[[int], float]) -> tuple[int, float | None]:
    """Calibrate and say so; returns the count and, when it is 1, the one call's time: the first sample."""
    n, dt, short = _calibrate(batch)
    _say(n, dt, short)
    return n, (dt if n == 1 else None)


def _by_events(
    fn, cuda, *, repeat: int, min_time_s: float | None, inner: int | str, cap: int
) -> tuple[int, list[float]]:
    cuda.synchronize()
    first: list[float] = []
    t_start = time.perf_counter()
    if inner == "auto":
        inner, one = _auto(_events_batch(fn, cuda))
        first = [] if one is None else [one]  # a call as long as the target: it was timed as a sample is
        t_start = time.perf_counter() - sum(first)
    pairs = []  # host time bounds the loop: the events are read once it ends
    while _more(len(first) + len(pairs), time.perf_counter() - t_start, repeat, min_time_s, cap):
        start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        pairs.append((start, end))
    cuda.synchronize()
    return inner, first + [s.elapsed_time(e) / 1e3 / inner for s, e in pairs]


def _by_host_clock(
    fn, drain, *, repeat: int, min_time_s: float | None, inner: int | str, cap: int, clock
) -> tuple[int, list[float]]:
    """`drain`: the device synchronisation to run after every call, or None (nothing added to the loop);
    `clock`: what a sample reads (the wall clock, or the process's CPU time); `min_time_s` is in its seconds."""
    call = fn if drain is None else (lambda: (fn(), drain()))
    samples: list[float] = []
    spent = 0.0
    if inner == "auto":
        inner, one = _auto(_host_batch(call, drain, clock))
        if one is not None:  # a call as long as the target: it was timed as a sample is, so it is the first
            samples.append(one)
            spent = one
    while _more(len(samples), spent, repeat, min_time_s, cap):
        if drain is not None:
            drain()  # outside the sample: what earlier calls left queued is not this sample's
        t0 = clock()
        for _ in range(inner):
            call()
        dt = clock() - t0
        spent += dt
        samples.append(dt / inner)
    return inner, samples


def bench(
    fn: Callable[[], object],
    *,
    warmup: int = 3,
    repeat: int = 20,
    min_time_s: float | None = None,
    inner: int | str = "auto",
    sync: str = "auto",
    max_samples: int = MAX_SAMPLES,
    clock: str = "wall",
) -> Samples:
    """Seconds per call of `fn()`, one sample per repetition (`inner` calls averaged).

    Runs at least `repeat` samples, and more until `min_time_s` of measured time when given, but
    never more than `max_samples`: a tiny function timed for long would otherwise return hundreds
    of thousands of samples (calibration, or a larger `inner`, makes each sample longer instead).
    `inner`: "auto" (the default) times single calls after the warm-up, by the clock the samples use,
    and doubles the count until one batch takes at least TARGET_SAMPLE_S (1 ms; at most MAX_INNER
    calls and CALIBRATION_MAX_S of calibration), printing one line to stderr when it chose more than
    one call; a call already that long keeps 1 and its timing is the first sample, so a call of a
    millisecond or more is timed exactly as with inner=1. An int >= 1 fixes the count (no calibration).
    The list returned is a `Samples`: its `.inner` is the count used, for a probe to record.
    `sync`: "auto" (CUDA events when torch has initialised CUDA), "cuda" (CUDA events), "each"
    (host clock, the device synchronised after every call) or "none" (host clock only).
    `clock`: "wall" (the default) or "cpu", the CPU seconds of this process (host work; never CUDA events).
    """
    inner = _check_inner(inner)
    if repeat < 1 or warmup < 0 or max_samples < repeat:
        raise ValueError("bench needs repeat >= 1, warmup >= 0 and max_samples >= repeat")
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {', '.join(CLOCKS)}, got {clock!r}")
    if clock == "cpu":
        for _ in range(warmup):
            fn()
        used, got = _by_host_clock(fn, None, repeat=repeat, min_time_s=min_time_s, inner=inner, cap=max_samples,
                                   clock=CLOCKS["cpu"])  # fmt: skip
    else:
        cuda = _cuda_for(sync)
        for _ in range(warmup):
            fn()
        if cuda is not None and sync != "each":
            used, got = _by_events(fn, cuda, repeat=repeat, min_time_s=min_time_s, inner=inner, cap=max_samples)
        else:
            drain = cuda.synchronize if cuda is not None else None
            used, got = _by_host_clock(fn, drain, repeat=repeat, min_time_s=min_time_s, inner=inner, cap=max_samples,
                                       clock=CLOCKS["wall"])  # fmt: skip
    samples = Samples(got)
    samples.inner = used
    return samples


def interleave(
    arms: dict[str, Callable[[], object]],
    *,
    turns: int = 10,
    repeat: int = 20,
    warmup: int = 3,
    min_time_s: float | None = None,
    replicate: int = 0,
    **bench_options,
) -> dict[str, Samples]:
    """Time the arms of a comparison in turns, in one process: seconds per call of each, as `bench` times them.

    Each of the `turns` visits every arm for its share of `repeat` (and of `min_time_s`), in the opposite
    order on every other turn (A B, B A, A B, ...), and an odd `replicate` starts from the other end, so a
    slow spell of the machine (another job's burst, a clock change, drift inside the process) falls on
    every arm alike instead of on whichever ran second (Pinpoint's rule; Abedi and Brecht, 2017). A
    speedup, share or ratio is then estimated within the process, from arms that saw the same machine.
    `bench_options`: the rest of `bench`'s (`inner`, `sync`, `clock`, `max_samples`). With inner="auto"
    (the default) each arm is calibrated once, on its first turn, and keeps that count on every later
    turn, so that its samples are alike across turns; each arm's `Samples.inner` says the count.
    """
    if not arms:
        raise ValueError("interleave needs at least one arm")
    if turns < 1:
        raise ValueError(f"interleave needs turns >= 1, got {turns}")
    inner = _check_inner(bench_options.pop("inner", "auto"))
    order = list(arms)[::-1] if replicate % 2 else list(arms)
    per_turn = -(-repeat // turns)  # at least `repeat` samples per arm in all
    share = None if min_time_s is None else min_time_s / turns
    samples: dict[str, Samples] = {name: Samples() for name in arms}
    for turn in range(turns):
        for name in order if turn % 2 == 0 else order[::-1]:
            got = bench(
                arms[name],
                warmup=warmup if turn == 0 else 0,
                repeat=per_turn,
                min_time_s=share,
                inner=inner if turn == 0 else samples[name].inner,
                **bench_options,
            )
            samples[name] += got
            samples[name].inner = got.inner
    return samples
