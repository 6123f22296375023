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


def foreign_cores(trace: dict) -> list[float]:
    """Cores used by processes outside the probe's tree, per sample (samples without data skipped)."""
    cores = trace.get("logical_cores") or 1
    out = []
    for machine, tree in zip(trace.get("system_cpu_percent", []), trace.get("cpu_percent", [])):
        if machine is None or tree is None:
            continue
        out.append(max(0.0, machine / 100.0 * cores - tree / 100.0))
    return out


def unfit(trace: dict | None) -> str | None:
    """Why the machine was not fit to measure on during this trace, or None when it was."""
    if not trace:
        return None
    load = foreign_cores(trace)
    if not load:
        return None
    mean = sum(load) / len(load)
    episode = sum(1 for x in load if x > 1.0) / len(load)
    if mean > FOREIGN_CORES or episode > EPISODE_SHARE:
        return f"machine busy: {mean:.1f} cores used by other processes on average" + (
            f", more than one core {episode:.0%} of the time" if episode > EPISODE_SHARE else ""
        )
    return None
