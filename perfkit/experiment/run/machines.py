"""A verdict over several machines: each machine's own measurement (a row per machine under the
pooled one), the worst machine deciding a claim about every machine, a machine apart from the pool
named, and what a change of machine between two measurements says.

The pooled interval itself nests processes within machines in perfkit/stats.py; this module judges
the claim on each machine's replicates alone and words what the machines say together.
"""

from __future__ import annotations

from dataclasses import replace

from perfkit import stats, units
from perfkit.experiment.records.kinds import Expect
from perfkit.experiment.records.results import HypothesisResult
from perfkit.experiment.records.verdict import Inconclusive, Judgement, MachineMeasured, Point, Verdict


def machines_of(executions) -> dict[str, str]:
    """The machines the usable replicates ran on, id -> a label for a reader ("host (CPU)"), in id order."""
    found = {}
    for x in executions:
        if x.machine_id and x.status == "ok" and not x.unfit:
            found.setdefault(x.machine_id, f"{x.machine.get('host') or x.machine_id} ({x.machine.get('cpu') or '?'})")
    return dict(sorted(found.items()))


def level(confidence: float, count: int, *, every: bool) -> float:
    """The level each of `count` machines is judged at. For a claim about every machine, 1 - (1 -
    confidence) / count, so that a wrong refutation of any of them stays within the run's error
    (Bonferroni); otherwise the run's level (the rows are then what each machine says, not a test)."""
    return 1 - (1 - confidence) / count if every else confidence


def judged_on(
    expect: Expect, points: tuple[Point, ...], machine: str, label: str, confidence: float
) -> MachineMeasured:
    """One machine's own measurement: the claim judged on its replicates alone, at `confidence` (`level`)."""
    mine = [on_machine(p, machine) for p in points]
    try:
        own = expect.judge([p for p in mine if p.replicates], confidence=confidence)
    except Inconclusive as exc:
        return MachineMeasured(machine, label, None, Verdict.INCONCLUSIVE.value, str(exc))
    return MachineMeasured(machine, label, own.measured, own.verdict.value, own.reason, own.off_by)


def on_machine(point: Point, machine: str) -> Point:
    """The point with only the replicates that ran on `machine`."""
    keep = [i for i, m in enumerate(point.machines or ()) if m == machine]
    return replace(point, replicates=tuple(point.replicates[i] for i in keep), machines=(machine,) * len(keep))


#: the order in which one machine's verdict outweighs another's when the claim must hold on every machine
_WORST = (Verdict.REFUTED.value, Verdict.INCONCLUSIVE.value, Verdict.CONFIRMED.value)


def machine_apart(per_machine: tuple[MachineMeasured, ...]) -> tuple[str, ...]:
    """The warning that one machine's own measurement stands apart from the pool's (stats.apart over
    the machines' values, three machines at least): a slow node is named, not averaged away."""
    measured = [m for m in per_machine if m.measured is not None]
    values = [m.measured.value for m in measured]
    found = stats.apart(values, log=all(v > 0 for v in values)) if len(values) >= 3 else None
    if found is None:
        return ()
    odd = measured[found[0]]
    others = [v for i, v in enumerate(values) if i != found[0]]
    unit = odd.measured.unit
    return (
        f"machine {odd.label} ({odd.machine}) measured {odd.measured.text(level=True)}, apart from the other "
        f"{len(others)} machines ({units.format_number(min(others))} to {units.format_quantity(max(others), unit)}): "
        "look at what differs on it (clocks, firmware, a neighbour's load) before it stands for the pool",
    )


def over_machines(pooled: Judgement, per_machine: tuple[MachineMeasured, ...], every: bool) -> Judgement:
    """The pooled judgement with each machine's row; for a claim about every machine, the worst machine's
    verdict (refuted on any, confirmed only on all), said with that machine's name."""
    judgement = replace(pooled, per_machine=per_machine, warnings=(*pooled.warnings, *machine_apart(per_machine)))
    if not every:
        if judgement.verdict == Verdict.INCONCLUSIVE and judgement.measured is not None:
            more = (
                f"the interval's units are the {len(per_machine)} machines: more machines of this kind, not more "
                "replicates on these, would narrow it (or a claim about every machine: `machines: every`)"
            )
            judgement = replace(judgement, warnings=(*judgement.warnings, more), needed=None)
        return judgement
    worst = min(per_machine, key=lambda m: _WORST.index(m.verdict) if m.verdict in _WORST else 0)
    if worst.verdict == Verdict.CONFIRMED.value:  # on each machine, whatever the pool's wider interval says
        held = f"confirmed on each of the {len(per_machine)} machines"
        return replace(judgement, verdict=Verdict.CONFIRMED, reason=None, off_by=held, needed=None)
    why = worst.reason or (f"measured {worst.measured.text(level=True)}" if worst.measured else "")
    return replace(
        judgement,
        verdict=Verdict(worst.verdict),
        reason=f"the claim must hold on every machine; on {worst.label}: {why}".rstrip(": "),
        measured=worst.measured or judgement.measured,  # what decided it: the worst machine's own
        off_by=f"on {worst.label}: {worst.off_by}" if worst.off_by else judgement.off_by,
        needed=None,
    )


def ids(result: HypothesisResult) -> set[str]:
    """The machines a result's replicates ran on (empty: not said, before results format 10)."""
    return {x.machine_id for x in result.executions if x.machine_id}


def pool_spread(*results: HypothesisResult) -> float | None:
    """The between-machine spread (a share of the value) a measurement over several machines found."""
    found = [r.measured.between_machines for r in results if r.measured and r.measured.between_machines is not None]
    return max(found) if found else None


def beyond_the_pool(previous: HypothesisResult, result: HypothesisResult, previous_run: str) -> str | None:
    """'Not reproduced' across machines of one kind: only when the two measurements are farther apart than
    twice the spread between machines a run over several measured (its own offset is no surprise)."""
    then, now = previous.measured, result.measured
    spread = pool_spread(previous, result)
    gap = abs(now.value / then.value - 1) if then.value > 0 and now.value > 0 else None
    if spread is None or gap is None or gap <= 2 * spread:
        return None
    return (
        f"run {previous_run} measured {then.text()} on another machine of this kind, farther apart than "
        f"the pool's machines are ({units.format_number(100 * spread)}% sd)"
    )


def machine_change(result: HypothesisResult, previous: HypothesisResult | None) -> str | None:
    """'the machine changed: ...' when the two measurements ran on different machines (both said)."""
    if previous is None:
        return None
    now, then = ids(result), ids(previous)
    if not now or not then or now == then:
        return None
    spread = pool_spread(previous, result)
    pool = (
        f"; the pool's machines differ by {units.format_number(100 * spread)}% (sd)"
        if spread is not None
        else "; how much machines of this kind differ is not known yet (measure on several: --cluster)"
    )
    return f"the machine changed ({_named(then)} -> {_named(now)}, another of the same kind){pool}"


def _named(ids: set[str]) -> str:
    shown = sorted(ids)
    return ", ".join(shown[:3]) + (f" and {len(shown) - 3} more" if len(shown) > 3 else "")
