"""Was the machine fit to measure on while a probe ran? Judged from its utilization trace.

A measurement taken while other work competed for the machine is not evidence: with one of two
cores taken by another process, torch's threads stall and a mask build went bimodal at 0.3 and
31 ms. The trace samples the execution's own process tree and the CPUs it runs on (its slot:
executions running at once each get their own, `slots`, so a sibling is never foreign load, on
this machine or on a cluster's). Unfit: foreign CPU load (what those CPUs did beyond the tree),
swapping, the CPU clock falling, a GPU throttled (power cap, thermal or hardware slowdown, as NVML
reports it) or used by a process outside the tree. Only the time the notebook's cells ran counts.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Limits:
    """When foreign load makes a replicate unfit, as shares of the machine's logical cores (so the same
    limits mean the same on 2 cores and on 64); set in `[tool.perfkit] fitness = {...}`."""

    foreign_share: float = 0.25  # mean load of processes outside the probe's tree above this share: unfit
    episode_share: float = 0.5  # a second with foreign load above this share of the cores is a load episode
    episodes: float = 0.25  # ... and more than this share of the seconds in episodes: unfit

    @classmethod
    def parse(cls, table: dict, where: str) -> Limits:
        """From a settings table; a ValueError names the key that is wrong."""
        known = {f.name for f in fields(cls)}
        for key, value in table.items():
            if key not in known:
                raise ValueError(f"{where} has no key {key} (known: {', '.join(sorted(known))})")
            if not isinstance(value, int | float) or isinstance(value, bool) or not 0 < value <= 1:
                raise ValueError(f"{where}.{key} must be a share from 0 to 1, got {value!r}")
        return cls(**{k: float(v) for k, v in table.items()})


LIMITS = Limits()
SWAP_BYTES = 16 * 2**20  # swapped in or out during the measurement
CLOCK_DROP = 0.7  # the CPU clock below this share of its median in the window
#: NVML clock-throttle reasons that slow a measurement (idle, application and display clock
#: settings are not throttling): SW power cap, HW slowdown, SW/HW thermal, HW power brake
THROTTLES = {0x4: "power cap", 0x8: "hardware slowdown", 0x20: "thermal", 0x40: "hardware thermal", 0x80: "power brake"}


THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")  # what torch's CPU thread pools read at start


def cpus() -> tuple[int, ...]:
    """The logical CPUs this process may run on (its affinity: a container or `taskset` may give fewer)."""
    import os

    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity on this platform: every core
        return tuple(range(logical_cores()))


def logical_cores() -> int:
    """The machine's logical cores (at least 1)."""
    import psutil

    return psutil.cpu_count(logical=True) or 1


def slots(count: int, available: tuple[int, ...] | None = None) -> list[tuple[int, ...]]:
    """`count` disjoint sets of CPUs, contiguous and as equal as can be, one per execution running at once.

    Executions on one machine each get their own cores (their threads, the CPUs they may run on), so
    a sibling's load is on other cores and the fitness check, which watches an execution's own CPUs,
    never takes it for foreign load. More executions than CPUs share them round robin (and are judged so).
    """
    available = available or cpus()
    if count <= len(available):
        bounds = [round(i * len(available) / count) for i in range(count + 1)]
        return [available[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
    return [(available[i % len(available)],) for i in range(count)]


def at_once(requested: int, threads: int, available: int | None = None) -> int:
    """How many executions of `threads` threads can run at once, each on cores of its own (at least 1)."""
    available = available or len(cpus())
    return max(1, min(requested, available // max(1, threads)))


def cpu_list(chosen: tuple[int, ...] | list[int]) -> str:
    """'0-3,6' for the CPUs 0, 1, 2, 3 and 6 (the form taskset and /proc use)."""
    from itertools import groupby

    out = []
    for _, run in groupby(enumerate(sorted(chosen)), key=lambda pair: pair[1] - pair[0]):  # consecutive runs
        first, *rest = [c for _, c in run]
        out.append(f"{first}-{rest[-1]}" if rest else str(first))
    return ",".join(out)


def free_cores(*, on: tuple[int, ...] | None = None, seconds: float = 0.2) -> int:
    """How many of the CPUs `on` (default: all this process may use) are not busy now, over `seconds`.

    torch starts one thread per core; with one of two cores taken by another process its threads
    stall on each other, so a replicate waits for its cores to be free.
    """
    import psutil

    on = on or cpus()
    per_cpu = psutil.cpu_percent(interval=seconds, percpu=True)
    busy = sum(per_cpu[c] for c in on if c < len(per_cpu)) / 100.0
    return max(0, int(len(on) - busy + 0.5))


def threads_for(jobs: int = 1, environ: dict[str, str] | None = None) -> int:
    """The CPU threads a run gives each probe execution, decided once (never from the moment's load):
    the user's OMP_NUM_THREADS when set, else the CPUs this process may use shared by `jobs` at a time."""
    import os

    environ = os.environ if environ is None else environ
    for name in THREAD_VARIABLES:
        try:
            if int(environ.get(name, "")) >= 1:
                return int(environ[name])
        except ValueError:
            continue
    return max(1, len(cpus()) // max(1, jobs))


def thread_env(threads: int) -> dict[str, str]:
    """The thread-pool variables that give a probe exactly `threads` threads (torch reads them at start)."""
    return {name: str(threads) for name in THREAD_VARIABLES}


WAIT_FOR_CORES_S = 10.0  # how long a replicate waits for its cores before it runs anyway (and is judged)


def wait_for_cores(threads: int, *, on: tuple[int, ...] | None = None, timeout_s: float = WAIT_FOR_CORES_S) -> float:
    """Wait, at most `timeout_s`, until `threads` of the CPUs `on` (its slot) are free; the seconds waited.

    A replicate never runs with fewer threads than its execution's: it waits for them, and when they
    do not come it runs with its count and the utilization trace judges whether it was fit.
    """
    import time

    on = on or cpus()
    started = time.monotonic()
    while free_cores(on=on, seconds=0.2) < min(threads, len(on)):
        if time.monotonic() - started >= timeout_s:
            break
    return time.monotonic() - started


BLOCK_S = 1.0  # foreign load is judged per second or so: the tree finds new processes once a second


def foreign_cores(trace: dict, window: tuple[float, float] | None = None) -> list[float]:
    """Cores used by processes outside the probe's tree, per block of about BLOCK_S inside `window`.

    Each sample covers the time since the one before it; only those wholly inside the window
    (epoch seconds: when the notebook's cells ran) count. Per block, foreign CPU time is the
    machine's minus the tree's: a process the tree finds late is counted by it late, in a lump,
    and summing over a block keeps that lump from reading as foreign load a moment earlier.
    """
    cores = trace.get("logical_cores") or 1
    times = trace.get("t", [])
    step = max(1, round(BLOCK_S / (trace.get("interval_s") or BLOCK_S)))
    usable = []
    for i, (machine, tree) in enumerate(zip(trace.get("system_cpu_percent", []), trace.get("cpu_percent", []))):
        if machine is None or tree is None or i == 0 or i >= len(times):
            continue
        if window is not None and (times[i - 1] < window[0] or times[i] > window[1]):
            continue
        usable.append((times[i] - times[i - 1], machine / 100.0 * cores - tree / 100.0))
    out = []
    for b in range(0, len(usable), step):
        block = usable[b : b + step]
        span = sum(dt for dt, _ in block)
        if span > 0:
            out.append(max(0.0, sum(dt * load for dt, load in block) / span))
    return out


def _inside(trace: dict, values: list, window: tuple[float, float] | None) -> list:
    """The values of the samples taken inside the window (all of them without one), None dropped."""
    times = trace.get("t", [])
    return [
        v
        for i, v in enumerate(values)
        if v is not None and (window is None or (i < len(times) and window[0] <= times[i] <= window[1]))
    ]


def _busy(trace: dict, window: tuple[float, float] | None, limits: Limits) -> str | None:
    load = foreign_cores(trace, window)
    if not load:
        return None
    cores = trace.get("logical_cores") or 1
    mean = sum(load) / len(load)
    episode = sum(1 for x in load if x > limits.episode_share * cores) / len(load)
    if mean > limits.foreign_share * cores or episode > limits.episodes:
        over = f", more than {limits.episode_share * cores:g} cores {episode:.0%} of the time"
        return f"machine busy: {mean:.1f} of {cores} cores used by other processes on average" + (
            over if episode > limits.episodes else ""
        )
    return None


def _swapping(trace: dict, window: tuple[float, float] | None) -> str | None:
    swapped = _inside(trace, trace.get("swap_bytes", []), window)
    moved = swapped[-1] - swapped[0] if len(swapped) > 1 else 0
    return f"swapping: {moved / 2**20:.0f} MiB swapped in or out" if moved > SWAP_BYTES else None


def _clock(trace: dict, window: tuple[float, float] | None) -> str | None:
    freq = sorted(_inside(trace, trace.get("cpu_freq_mhz", []), window))
    if len(freq) < 2:
        return None
    median = freq[len(freq) // 2]
    if freq[0] < CLOCK_DROP * median:
        return f"CPU clock fell to {freq[0]:.0f} MHz (median {median:.0f} MHz)"
    return None


def _gpus(trace: dict, window: tuple[float, float] | None) -> str | None:
    tree = set(trace.get("tree_pids", []))
    for gpu in trace.get("gpus", []):
        reasons = _inside(trace, gpu.get("throttle_reasons", []), window)
        hit = sorted({name for r in reasons for bit, name in THROTTLES.items() if r & bit})
        if hit:
            share = sum(1 for r in reasons if any(r & bit for bit in THROTTLES)) / len(reasons)
            return f"GPU {gpu.get('index')} throttled ({', '.join(hit)}) {share:.0%} of the time"
        strangers = sorted({pid for pids in _inside(trace, gpu.get("gpu_pids", []), window) for pid in pids} - tree)
        if tree and strangers:
            shown = ", ".join(map(str, strangers[:3]))
            return f"GPU {gpu.get('index')} used by {len(strangers)} other processes (pid {shown})"
    return None


def unfit(trace: dict | None, window: tuple[float, float] | None = None, limits: Limits = LIMITS) -> str | None:
    """Why the machine was not fit to measure on during this trace (within `window`), or None when it was."""
    if not trace:
        return None
    why = _busy(trace, window, limits)
    if why:
        return why
    for check in (_swapping, _clock, _gpus):
        why = check(trace, window)
        if why:
            return why
    return None
