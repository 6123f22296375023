"""From a hypothesis and what its probe recorded to a verdict that says how far off it was.

Confirmed only when the whole 95% interval satisfies the claim, refuted only when the whole
interval violates it; everything else is inconclusive with the reason, and missing, too few or
NaN samples are always inconclusive, loudly. A failed probe is an error naming the cell.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from typing import TYPE_CHECKING

from perfkit.errors import UserError
from perfkit.experiment.results import Execution, Floor, Measured
from perfkit.samples import MetricRecord

if TYPE_CHECKING:
    from perfkit.experiment.hypothesis import Hypothesis


class Verdict(str, Enum):
    CONFIRMED = "confirmed"
    REFUTED = "refuted"
    INCONCLUSIVE = "inconclusive"
    ERROR = "error"


@dataclass(frozen=True)
class Point:
    """A metric record with where it was measured: its own `at` plus the sweep point."""

    record: MetricRecord
    at: dict[str, Any]

    def where(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in sorted(self.at.items())) or "the only point"


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
    """Every record of the successful executions, with the sweep value added to its `at`."""
    points = []
    for execution in executions:
        for record in execution.records:
            at = dict(record.at or {})
            if sweep_param is not None and sweep_param in execution.params:
                at.setdefault(sweep_param, execution.params[sweep_param])
            points.append(Point(record=record, at=at))
    return points


def failure_reason(execution: Execution) -> str:
    return execution.reason or f"{execution.notebook}: {execution.status}"


def judge(hypothesis: Hypothesis, executions: list[Execution]) -> Judgement:
    """The verdict on one hypothesis from the executions of its probe."""
    expect = hypothesis.expect
    failed = [x for x in executions if x.status != "ok"]
    if failed:
        return Judgement(verdict=Verdict.ERROR, reason="; ".join(failure_reason(x) for x in failed), expected=expect.expected())
    if not executions:
        return Judgement(verdict=Verdict.INCONCLUSIVE, reason="the probe was not executed", expected=expect.expected())
    sweep = hypothesis.probe.sweep
    try:
        return expect.judge(effective_points(executions, sweep.param if sweep else None))
    except Inconclusive as exc:
        return Judgement(verdict=Verdict.INCONCLUSIVE, reason=str(exc), expected=expect.expected())
    except UserError as exc:
        # a unit mismatch between the record and the expectation is a mistake to fix, not evidence
        return Judgement(verdict=Verdict.ERROR, reason=f"cannot compare: {exc}", expected=expect.expected())
