"""Was the machine fit to measure on while a probe ran, and how busy was it? Judged from its utilization trace.

The trace samples the execution's own process tree and the CPUs it runs on (its slot: executions
running at once each get their own, `slots`, so a sibling is never foreign load, on this machine or
on a cluster's). Foreign CPU load is what those CPUs did beyond the tree; `load` says how much of it
a replicate had and which processes made it.

Two modes (`[tool.perfkit] fitness`):
- "shared" (the default): a shared, busy machine is the normal case. A replicate measured while
  other jobs used the cores is evidence with more noise, not no evidence: its `load` is recorded and
  the verdict's interval, taken over processes, includes what the load did. A replicate is left out
  only when it stands apart from the others and its load explains it (perfkit/experiment/run/
  judging.py). Probes get one thread unless told otherwise, so a neighbour on another core cannot
  stall a thread pool (two threads on two cores, one of them taken, went bimodal at 0.3 and 31 ms).
- "strict" (or a table of limits): for a dedicated machine. Foreign load above `Limits` makes a
  replicate unfit: it waits for free cores, is re-run once, and is left out of the verdict.
In both modes swapping, the CPU clock falling, a GPU throttled (power cap, thermal or hardware
slowdown, as NVML reports it) or used by a process outside the tree make a replicate unfit. Only
the time the notebook's cells ran counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

SHARED, STRICT = "shared", "strict"
MODES = (SHARED, STRICT)
SETTING = "fitness"  # the [tool.perfkit] key, named wherever its behaviour shows


@dataclass(frozen=True)
class Limits:
    """How foreign load is treated: measured through ("shared") or, above these shares of the machine's
    logical cores (the same limits mean the same on 2 cores and on 64), a replicate unfit ("strict").
    Set in `[tool.perfkit] fitness = "strict"` or `fitness = {foreign_share = ..., ...}` (strict, those limits)."""

    foreign_share: float = field(
        default=0.25, metadata={"says": "mean load of processes outside the probe's tree above this share: unfit"}
    )
    episode_share: float = field(
        default=0.5, metadata={"says": "a second with foreign load above this share of the cores is a load episode"}
    )
    episodes: float = field(
        default=0.25, metadata={"says": "more than this share of the seconds in load episodes: unfit"}
    )
    mode: str = field(
        default=SHARED,
        metadata={"says": 'shared (load recorded and measured through) or strict; a table of limits is "strict"'},
    )

    @property
    def strict(self) -> bool:
        return self.mode == STRICT

    @classmethod
    def parse(cls, value: str | dict, where: str) -> Limits:
        """From a settings value ("shared", "strict" or a table of limits, which is strict unless its `mode`
        says otherwise); a ValueError names the key that is wrong."""
        if isinstance(value, str):
            if value not in MODES:
                raise ValueError(f'{where} must be "shared", "strict" or a table of limits, got {value!r}')
            return cls(mode=value)
        if not isinstance(value, dict):
            raise ValueError(f'{where} must be "shared", "strict" or a table of limits, got {value!r}')
        known = {f.name for f in fields(cls)}
        for key, given in value.items():
            if key not in known:
                raise ValueError(f"{where} has no key {key} (known: {', '.join(sorted(known))})")
            if key == "mode":
                if given not in MODES:
                    raise ValueError(f'{where}.mode must be "shared" or "strict", got {given!r}')
            elif not isinstance(given, int | float) or isinstance(given, bool) or not 0 < given <= 1:
                raise ValueError(f"{where}.{key} must be a share from 0 to 1, got {given!r}")
        limits = {k: float(v) for k, v in value.items() if k != "mode"}
        return cls(**limits, mode=value.get("mode", STRICT if limits else SHARED))


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


def threads_for(jobs: int = 1, environ: dict[str, str] | None = None, *, strict: bool = False) -> int:
    """The CPU threads a run gives each probe execution, decided once (never from the moment's load):
    the user's OMP_NUM_THREADS when set; else, on a shared machine, one (a neighbour on another core
    cannot stall it); else (strict: a dedicated machine) the CPUs this process may use shared by `jobs`."""
    import os

    environ = os.environ if environ is None else environ
    for name in THREAD_VARIABLES:
        try:
            if int(environ.get(name, "")) >= 1:
                return int(environ[name])
        except ValueError:
            continue
    return max(1, len(cpus()) // max(1, jobs)) if strict else 1


def threads_said(threads: int, *, given: str | None, strict: bool) -> str:
    """Why an execution has the threads it has, for the plan line: who set them, or the mode's default."""
    if given:
        return f"{threads} threads ({given})"
    if strict:
        return f'{threads} threads (fitness = "strict": the CPUs shared by the executions at a time)'
    return (
        f"{threads} thread (a shared machine: a neighbour on another core cannot stall it; --threads N or "
        "OMP_NUM_THREADS sets more)"
    )


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
    found = load(trace, window, limits)
    if found is None:
        return None
    cores, mean, episode = found["of"], found["cores"], found["busy_share"]
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
    """Why the machine was not fit to measure on during this trace (within `window`), or None when it was.
    Foreign CPU load makes it unfit in strict mode, above the limits; on a shared machine it is `load`,
    measured through (a verdict on an absolute time allows for what it may have done: run/judging.py)."""
    if not trace:
        return None
    why = _busy(trace, window, limits) if limits.strict else None
    if why:
        return why
    for check in (_swapping, _clock, _gpus):
        why = check(trace, window)
        if why:
            return why
    return None


TOP_PROCESSES = 3  # the foreign processes a replicate's load names, busiest first
NOTICEABLE_CORES = 0.1  # foreign load below this many cores is not worth a word


def load(trace: dict | None, window: tuple[float, float] | None = None, limits: Limits = LIMITS) -> dict | None:
    """The foreign CPU load a replicate ran under (within `window`): `cores` used by processes outside its
    tree on average, of the `of` CPUs it ran on, the share of seconds in which more than `episode_share` of
    them were (`busy_share`), and the busiest foreign processes over the whole trace (`top`: pid, name and
    % of one core). None when the trace cannot say."""
    blocks = foreign_cores(trace or {}, window)
    if not blocks:
        return None
    cores = trace.get("logical_cores") or 1
    return {
        "cores": round(sum(blocks) / len(blocks), 3),
        "of": cores,
        "busy_share": round(sum(1 for x in blocks if x > limits.episode_share * cores) / len(blocks), 3),
        "top": list(trace.get("foreign_processes") or [])[:TOP_PROCESSES],
    }


def load_words(loads: list[dict | None], *, count: bool = True) -> str | None:
    """'other processes used 1.0 of 2 cores (pid 1234 python3, 98%) during 3 of 3 replicates' (without
    `count`, no 'during'), or None when no replicate had noticeable foreign load."""
    known = [x for x in loads if x]
    loaded = [x for x in known if x["cores"] >= NOTICEABLE_CORES]
    if not loaded:
        return None
    mean = sum(x["cores"] for x in loaded) / len(loaded)
    top: dict[tuple, float] = {}
    for x in loaded:
        for p in x.get("top") or []:
            if (p.get("percent") or 0.0) >= 1.0:  # a process that used a per cent of a core or more
                name = (p.get("pid"), p.get("name"))
                top[name] = max(top.get(name, 0.0), p.get("percent"))
    busiest = sorted(top.items(), key=lambda kv: -kv[1])[:TOP_PROCESSES]
    named = ", ".join(f"pid {pid} {name}, {percent:.0f}%" for (pid, name), percent in busiest)
    return (
        f"other processes used {mean:.1f} of {loaded[0]['of']} cores"
        + (f" ({named})" if named else "")
        + (f" during {len(loaded)} of {len(loads)} replicates" if count else "")
    )
