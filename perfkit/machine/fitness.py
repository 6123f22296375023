"""Was the machine fit to measure on while a probe ran? Judged from its utilization trace.

A measurement taken while other work competed for the CPU is not evidence: with one of two cores
taken by another process, torch's threads stall and a mask build went bimodal at 0.3 and 31 ms.
The trace samples the probe's own process tree and the whole machine; what the machine did
beyond the tree is foreign load.
"""

from __future__ import annotations

#: mean cores used by processes outside the probe's tree above which a replicate is unfit
FOREIGN_CORES = 0.5
#: ... or this share of the samples with more than a whole core of foreign load (a load episode)
EPISODE_SHARE = 0.25


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


def unfit(trace: dict | None, window: tuple[float, float] | None = None) -> str | None:
    """Why the machine was not fit to measure on during this trace (within `window`), or None when it was."""
    if not trace:
        return None
    load = foreign_cores(trace, window)
    if not load:
        return None
    mean = sum(load) / len(load)
    episode = sum(1 for x in load if x > 1.0) / len(load)
    if mean > FOREIGN_CORES or episode > EPISODE_SHARE:
        return f"machine busy: {mean:.1f} cores used by other processes on average" + (
            f", more than one core {episode:.0%} of the time" if episode > EPISODE_SHARE else ""
        )
    return None
