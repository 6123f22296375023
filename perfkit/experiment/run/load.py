"""What foreign load did to a verdict, on a shared machine: which replicates it explains, what it may have
done to an absolute time, and what would decide a verdict it left undecided.

perfkit measures through load (machine/fitness.py records it per replicate, `Execution.load`); the
interval, taken over processes, holds the noise it made between them. Three rules act on the rest:
- a replicate that stands apart from the others (stats.apart) is left out only when it ran under
  more load than they did: the load explains it, and the verdict says which one, how far off, under what;
- a claim on an absolute time or rate is decided the way load pushes it (slower) only with what the
  load may have done to spare (`may_slow`); comparisons, estimated within each process, are left alone;
- an undecided verdict names the load it was measured under and the replicates that would decide it.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

from perfkit import stats, units
from perfkit.experiment.records.hypothesis import Hypothesis
from perfkit.experiment.records.results import Execution
from perfkit.experiment.records.verdict import Judgement, Verdict
from perfkit.machine import fitness

#: a replicate that stands apart from the others (stats.apart) is left out only when other processes used
#: at least this many cores more while it ran than the others' median: the load explains it
LOAD_EXPLAINS_CORES = 0.25


def _record_means(execution: Execution) -> dict[tuple[str, str], float]:
    """(metric, place) -> the mean of the replicate's samples there."""
    out = {}
    for r in execution.records:
        if r.samples:
            out[(r.name, json.dumps(r.at or {}, sort_keys=True, default=str))] = sum(r.samples) / len(r.samples)
    return out


def _cores(x: Execution) -> float:
    return (x.load or {}).get("cores") or 0.0


def loaded_outliers(executions: list[Execution]) -> list[tuple[Execution, str]]:
    """The replicates to leave out because they stand apart and the foreign load explains it: at most one
    per execution key, each with what was off and by how much, and the load it ran under."""
    out = []
    for key in sorted({x.key for x in executions}):
        reps = sorted((x for x in executions if x.key == key), key=lambda x: x.replicate)
        if len(reps) < 3 or not any(_cores(x) for x in reps):
            continue
        means = [_record_means(x) for x in reps]
        worst: tuple[float, int, str] | None = None
        for place in sorted(set.intersection(*(set(m) for m in means))):
            values = [m[place] for m in means]
            found = stats.apart(values, log=True) if all(v > 0 for v in values) else None  # times, rates: factors
            if found is None:
                continue
            i = found[0]
            others = sorted(_cores(x) for j, x in enumerate(reps) if j != i)
            if _cores(reps[i]) - others[len(others) // 2] < LOAD_EXPLAINS_CORES:
                continue
            rest = [v for j, v in enumerate(values) if j != i]
            factor = values[i] / (sum(rest) / len(rest))
            if worst is None or abs(math.log(factor)) > abs(math.log(worst[0])):
                worst = (factor, i, place[0])
        if worst is not None:
            factor, i, name = worst
            x = reps[i]
            others = sorted(_cores(y) for j, y in enumerate(reps) if j != i)
            out.append(
                (
                    x,
                    (
                        f"replicate {x.replicate} of {x.label()}: its {name} was {units.format_factor(factor)} "
                        f"the others' mean while other processes used {_cores(x):.1f} of {x.load.get('of')} cores "
                        f"(the others: {others[0]:.1f} to {others[-1]:.1f})"
                    ),
                )
            )
    return out


def what_would_decide(judgement: Judgement, executions: tuple[Execution, ...]) -> Judgement:
    """An undecided verdict says the load it was measured under, and what would decide it then."""
    words = fitness.load_words([x.load for x in executions if x.status == "ok"])
    if judgement.verdict is not Verdict.INCONCLUSIVE or words is None or judgement.measured is None:
        return judgement
    forecast = "that forecast is at this load, and " if judgement.needed else ""
    return replace(judgement, reason=f"{judgement.reason}; {words}: {forecast}a quieter machine would narrow it")


#: how much slower a neighbour can make a probe whose threads keep cores of their own, per share of the
#: machine it takes: the caches, memory bandwidth and turbo budget they share, and a burst the scheduler
#: puts on the probe's core now and then
SHARED_SLOWDOWN = 0.2


def may_slow(x: Execution, dim: str) -> float:
    """How many times slower foreign load may have made this replicate, in a quantity of dimension `dim`:
    its share of the machine times SHARED_SLOWDOWN, plus, in wall time and rates, where it left the
    replicate's threads fewer cores than they are, the time they waited for one (CPU time does not count
    the wait). Instructions counted under a simulator are not moved at all."""
    if dim == "instructions":
        return 1.0
    load = x.load or {}
    of = load.get("of") or 1
    threads = min(x.threads or 1, of)
    starved = max(0.0, _cores(x) - (of - threads)) / threads if dim != "cpu_time" else 0.0
    return 1 + SHARED_SLOWDOWN * _cores(x) / of + starved


def may_explain(hypothesis: Hypothesis, judgement: Judgement, executions: tuple[Execution, ...]) -> Judgement:
    """A claim on an absolute time or rate, decided the way foreign load pushes it (slower), is undecided
    unless the interval clears the edge with what the load may have done to spare (`may_slow`, the mean
    over replicates). Comparisons (speedups, shares, a ratio to a floor measured in the same process) are
    judged within the process, where the load slows both sides alike, and are left as they are."""
    from perfkit.experiment.records.kinds.value import _Value

    expect, m = hypothesis.expect, judgement.measured
    decided = judgement.verdict in (Verdict.CONFIRMED, Verdict.REFUTED)
    if not decided or m is None or not isinstance(expect, _Value) or expect.floor is not None:
        return judgement
    ok = [x for x in executions if x.status == "ok"]
    dim = units.dimension(m.unit)
    slower = sum(may_slow(x, dim) for x in ok) / max(1, len(ok))
    if slower < 1.01 or dim not in units.LOWER_IS_FASTER | units.HIGHER_IS_FASTER:
        return judgement
    low, high = (m.low / slower, m.high) if dim in units.LOWER_IS_FASTER else (m.low, m.high * slower)
    at_least, at_most = expect.edges()

    def says(low: float, high: float) -> Verdict:
        if (at_least is None or low >= at_least) and (at_most is None or high <= at_most):
            return Verdict.CONFIRMED
        if (at_least is not None and high < at_least) or (at_most is not None and low > at_most):
            return Verdict.REFUTED
        return Verdict.INCONCLUSIVE

    if says(m.low, m.high) is not judgement.verdict or says(low, high) is judgement.verdict:
        return judgement  # decided otherwise than by this interval (machine by machine), or with room to spare
    words = fitness.load_words([x.load for x in ok]) or "other processes used the machine"
    quiet = f"[{units.format_number(low)}, {units.format_number(high)}]"
    return replace(
        judgement,
        verdict=Verdict.INCONCLUSIVE,
        off_by=None,
        needed=None,
        reason=(
            f"{m.text()} was measured while {words}: load only slows a probe, by up to {slower:.2g}x at that "
            f"load, and {quiet} would not decide it. A quieter machine would, or a claim against a baseline "
            "or a floor measured in the same process (load slows both alike)"
        ),
    )
