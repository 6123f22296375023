"""From a hypothesis and what its probe recorded to a verdict that says how far off it was.

Confirmed only when the whole 95% interval satisfies the claim, refuted only when the whole
interval violates it; everything else is inconclusive with the reason, and missing, too few or
NaN samples are always inconclusive, loudly. A failed probe is an error naming the cell.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from perfkit import stats, units
from perfkit.errors import UserError
from perfkit.experiment.results import Execution, Floor, Measured
from perfkit.samples import MetricRecord

if TYPE_CHECKING:
    from perfkit.experiment.hypothesis import Hypothesis


class Verdict(StrEnum):
    CONFIRMED = "confirmed"
    REFUTED = "refuted"
    INCONCLUSIVE = "inconclusive"
    ERROR = "error"


@dataclass(frozen=True)
class Point:
    """One metric where it was measured (its own `at` plus the sweep point), from every replicate.

    `replicates` holds one tuple of samples per replicate that recorded it, in replicate order,
    in `unit`; `records` counts the records merged, `duplicated` says one execution recorded the
    metric more than once at this point (which of them a claim means is then unknown).
    """

    name: str
    unit: str
    at: dict[str, Any]
    replicates: tuple[tuple[float, ...], ...]
    note: str | None = None
    breakdown: str | None = None
    records: int = 1
    duplicated: bool = False

    def where(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in sorted(self.at.items())) or "the only point"

    def samples(self) -> list[float]:
        """Every sample of every replicate."""
        return [s for r in self.replicates for s in r]


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    reason: str | None
    expected: str
    measured: Measured | None = None
    off_by: str | None = None
    floor: Floor | None = None
    warnings: tuple[str, ...] = ()
    used: tuple[Point, ...] = ()  # the records the verdict was computed from (for plots, summaries)
    needed: int | None = None  # replicates that would likely decide an inconclusive verdict

    def line(self) -> str:
        """One readable line: 'measured 0.18 ms [0.16, 0.21], 1,100x below the expected 200 ms'."""
        if self.measured is None:
            return self.reason or ""
        text = f"measured {self.measured.text()}"
        if self.off_by:
            text += f", {self.off_by}"
        if self.reason:
            text += f" ({self.reason})"
        return text


class Inconclusive(Exception):
    """The evidence cannot support a verdict; the message says why (raised by the kinds' judging)."""


def effective_points(executions: list[Execution], sweep_param: str | None) -> list[Point]:
    """The records of the executions, merged over replicates: one Point per metric and `at`.

    The sweep value is added to each record's `at`; samples of later replicates are converted to
    the unit of the first (a unit of another dimension is a UserError: a mistake, not evidence).
    """
    groups: dict[tuple[str, str], list[tuple[Execution, MetricRecord, dict[str, Any]]]] = {}
    for execution in sorted(executions, key=lambda x: (x.replicate, x.key)):
        for record in execution.records:
            at = dict(record.at or {})
            if sweep_param is not None and sweep_param in execution.params:
                at.setdefault(sweep_param, execution.params[sweep_param])
            groups.setdefault((record.name, json.dumps(at, sort_keys=True, default=str)), []).append(
                (execution, record, at)
            )
    points = []
    for entries in groups.values():
        _, first, at = entries[0]
        points.append(
            Point(
                name=first.name,
                unit=first.unit,
                at=at,
                replicates=tuple(tuple(units.convert(list(r.samples), r.unit, first.unit)) for _, r, _ in entries),
                note=first.note,
                breakdown=first.breakdown,
                records=len(entries),
                duplicated=len(entries) != len({(x.key, x.replicate) for x, _, _ in entries}),
            )
        )
    return points


def failure_reason(execution: Execution) -> str:
    return execution.reason or f"{execution.notebook}: {execution.status}"


def _fitness(executions: list[Execution]) -> tuple[list[Execution], str | None, str | None]:
    """(the replicates to judge, why none can be judged, a warning about those left out)."""
    unfit = [x for x in executions if x.unfit]
    if not unfit:
        return executions, None, None
    fit = [x for x in executions if not x.unfit]
    keys = {x.key for x in executions}
    said = f"{unfit[0].unfit} during {len(unfit)} of {len(executions)} replicates"
    if any(sum(1 for x in fit if x.key == k) * 2 < sum(1 for x in executions if x.key == k) for k in keys):
        return [], f"the machine was not fit to measure on: {said}", None
    return fit, None, f"left out {len(unfit)} of {len(executions)} replicates: {said}"


def usable_replicates(executions) -> list[Execution]:
    """The replicates a verdict rests on: ended well, on a fit machine (empty when too few are fit)."""
    if any(x.status != "ok" for x in executions):
        return []
    return _fitness(list(executions))[0]


def judge(hypothesis: Hypothesis, executions: list[Execution], *, confidence: float = stats.CONFIDENCE) -> Judgement:
    """The verdict on one hypothesis from the executions (every replicate) of its probe, at `confidence`."""
    expect = hypothesis.expect
    failed = [x for x in executions if x.status != "ok"]
    if failed:
        return Judgement(
            verdict=Verdict.ERROR,
            reason="; ".join(dict.fromkeys(failure_reason(x) for x in failed)),
            expected=expect.expected(),
        )
    if not executions:
        return Judgement(verdict=Verdict.INCONCLUSIVE, reason="the probe was not executed", expected=expect.expected())
    usable, unfit, left_out = _fitness(executions)
    if unfit:
        return Judgement(verdict=Verdict.INCONCLUSIVE, reason=unfit, expected=expect.expected())
    sweep = hypothesis.probe.sweep
    try:
        judgement = expect.judge(effective_points(usable, sweep.param if sweep else None), confidence=confidence)
    except Inconclusive as exc:
        return Judgement(verdict=Verdict.INCONCLUSIVE, reason=str(exc), expected=expect.expected())
    except UserError as exc:
        # a unit mismatch between the record and the expectation is a mistake to fix, not evidence
        return Judgement(verdict=Verdict.ERROR, reason=f"cannot compare: {exc}", expected=expect.expected())
    if left_out:
        judgement = replace(judgement, warnings=(left_out, *judgement.warnings))
    return judgement
