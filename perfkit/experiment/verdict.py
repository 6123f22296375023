"""From a hypothesis and what its probe recorded to a verdict that says how far off it was.

Confirmed only when the whole 95% interval satisfies the claim, refuted only when the whole
interval violates it; everything else is inconclusive with the reason, and missing, too few or
NaN samples are always inconclusive, loudly. A failed probe is an error naming the cell.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Any

from perfkit import stats, units
from perfkit.errors import UserError
from perfkit.experiment.hypothesis import Expect, Hypothesis
from perfkit.experiment.results import ExecutionRecord, Floor, Measured, MetricRecord


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
        m = self.measured
        text = (f"measured {_label(m)}{units.format_quantity(m.value, m.unit)} "
                f"[{units.format_number(m.low)}, {units.format_number(m.high)}]")
        if self.off_by:
            text += f", {self.off_by}"
        if self.reason:
            text += f" ({self.reason})"
        return text


def _label(m: Measured) -> str:
    return "" if m.label == "mean" else f"{m.label} "


class _Inconclusive(Exception):
    """Internal: the evidence cannot support a verdict; the message says why."""


def effective_points(executions: list[ExecutionRecord], sweep_param: str | None) -> list[Point]:
    """Every record of the successful executions, with the sweep value added to its `at`."""
    points = []
    for execution in executions:
        for record in execution.records:
            at = dict(record.at or {})
            if sweep_param is not None and sweep_param in execution.params:
                at.setdefault(sweep_param, execution.params[sweep_param])
            points.append(Point(record=record, at=at))
    return points


def _matches(at: dict[str, Any], selector: dict[str, Any] | None) -> bool:
    for key, want in (selector or {}).items():
        if key not in at:
            return False
        have = at[key]
        if isinstance(want, (int, float)) and isinstance(have, (int, float)) and not isinstance(have, bool):
            if float(want) != float(have):
                return False
        elif want != have:
            return False
    return True


def _candidates(points: list[Point], name: str, selector: dict | None) -> list[Point]:
    found = [p for p in points if p.record.name == name and _matches(p.at, selector)]
    if not found:
        names = sorted({p.record.name for p in points})
        where = f" at {', '.join(f'{k}={v}' for k, v in selector.items())}" if selector else ""
        recorded = f" (it recorded: {', '.join(names)})" if names else ""
        raise _Inconclusive(f"probe recorded no samples for {name}{where}{recorded}")
    return found


def _one(points: list[Point], name: str, selector: dict | None) -> Point:
    found = _candidates(points, name, selector)
    if len(found) > 1:
        wheres = "; ".join(p.where() for p in found)
        raise _Inconclusive(f"{name} was recorded {len(found)} times ({wheres}); add expect.at to choose one")
    return found[0]


def _same_point(points: list[Point], name: str, at: dict[str, Any]) -> Point:
    """The record of `name` measured where another record was (same `at`)."""
    found = [p for p in points if p.record.name == name and p.at == at]
    if len(found) != 1:
        where = ", ".join(f"{k}={v}" for k, v in sorted(at.items())) or "the same point"
        if not found:
            raise _Inconclusive(f"probe recorded no samples for {name} at {where}")
        raise _Inconclusive(f"{name} was recorded {len(found)} times at {where}")
    return found[0]


def _samples(point: Point, unit: str | None, min_samples: int) -> list[float]:
    """A record's samples in `unit`, or why they cannot be judged."""
    record = point.record
    if not record.samples:
        raise _Inconclusive(f"probe recorded no samples for {record.name}")
    bad = sum(1 for s in record.samples if not math.isfinite(s))
    if bad:
        raise _Inconclusive(f"{bad} of {len(record.samples)} samples of {record.name} are NaN or infinite")
    if len(record.samples) < min_samples:
        raise _Inconclusive(
            f"{record.name} has {len(record.samples)} samples, fewer than the {min_samples} needed "
            "(raise the probe's repetitions or lower expect.min_samples)"
        )
    return units.convert(list(record.samples), record.unit, unit) if unit else list(record.samples)


def ratio_text(measured: float, expected: float, what: str) -> str:
    """'1,100x below the expected 200 ms', '12% above the bound 2 ms'."""
    if expected == 0 or measured <= 0 or expected < 0:
        diff = measured - expected
        return f"{units.format_number(abs(diff))} {'above' if diff >= 0 else 'below'} {what}"
    ratio = measured / expected
    if 1 / 1.1 < ratio < 1.1:
        return f"{units.format_number(abs(ratio - 1) * 100, 2)}% {'above' if ratio >= 1 else 'below'} {what}"
    if ratio >= 1:
        return f"{units.format_factor(ratio)} above {what}"
    return f"{units.format_factor(1 / ratio)} below {what}"


def _bounds(low: float, high: float, *, at_least: float | None, at_most: float | None) -> tuple[Verdict, str | None]:
    """Compare an interval with an allowed range: inside, outside, or straddling an edge."""
    lo_ok = at_least is None or low >= at_least
    hi_ok = at_most is None or high <= at_most
    if lo_ok and hi_ok:
        return Verdict.CONFIRMED, None
    if (at_least is not None and high < at_least) or (at_most is not None and low > at_most):
        return Verdict.REFUTED, None
    edge = at_least if not lo_ok else at_most
    return Verdict.INCONCLUSIVE, f"the interval straddles {units.format_number(edge)}"


def _seed(hypothesis: Hypothesis, *names: str) -> int:
    return stats.seed_for("|".join((hypothesis.id,) + names))


def _floor(expect: Expect, points: list[Point]) -> tuple[float, Floor]:
    point = _one(points, expect.floor, expect.at)
    values = _samples(point, expect.unit, 1)
    value = sum(values) / len(values)
    return value, Floor(metric=expect.floor, value=value, unit=expect.unit, note=point.record.note)


def _judge_value(h: Hypothesis, points: list[Point]) -> Judgement:
    e = h.expect
    point = _one(points, e.metric, e.at)
    samples = _samples(point, e.unit, e.min_samples)
    est = stats.mean_interval(samples, seed=_seed(h, e.metric))
    measured = Measured(label="mean", unit=e.unit, value=est.value, low=est.low, high=est.high)
    floor = None
    if e.floor:
        reference, floor = _floor(e, points)
        scale = e.factor or 1.0
        ref_text = f"{units.format_quantity(reference, e.unit)} ({e.floor})"
    else:
        reference, scale = e.value, (e.factor or 1.0)
        ref_text = units.format_quantity(reference, e.unit)
    warnings = tuple(f"{e.metric}: {w}" for w in stats.instability(samples))
    if e.kind == "cost":
        low_edge, high_edge = reference / e.factor, reference * e.factor
        verdict, why = _bounds(est.low, est.high, at_least=low_edge, at_most=high_edge)
        expected = f"≈ {ref_text} (×{units.format_number(e.factor)})"
        off_by = ratio_text(est.value, reference, f"the expected {ref_text}")
    else:
        bound = reference * scale
        bound_text = ref_text if scale == 1 else f"{units.format_number(scale)} × {ref_text} = {units.format_quantity(bound, e.unit)}"
        sign = "≤" if e.kind == "at_most" else "≥"
        verdict, why = _bounds(
            est.low, est.high,
            at_least=bound if e.kind == "at_least" else None,
            at_most=bound if e.kind == "at_most" else None,
        )
        expected = f"{sign} {bound_text}"
        off_by = ratio_text(est.value, bound, f"the bound {units.format_quantity(bound, e.unit)}")
    return Judgement(verdict=verdict, reason=why, expected=expected, measured=measured, off_by=off_by,
                     floor=floor, warnings=warnings, used=(point,))


def _range_text(at_least: float | None, at_most: float | None, fmt) -> str:
    parts = []
    if at_least is not None:
        parts.append(f"≥ {fmt(at_least)}")
    if at_most is not None:
        parts.append(f"≤ {fmt(at_most)}")
    return " and ".join(parts)


def _off_range(value: float, at_least: float | None, at_most: float | None, fmt, what: str) -> str:
    """How far a ratio is from the claimed minimum or maximum (the nearer one when both are given)."""
    use_min = at_least is not None and (
        at_most is None or value < at_least or (value <= at_most and value / at_least < at_most / value)
    )
    if use_min:
        return ratio_text(value, at_least, f"the claimed minimum {what} {fmt(at_least)}")
    return ratio_text(value, at_most, f"the claimed maximum {what} {fmt(at_most)}")


def _pct(value: float) -> str:
    return f"{units.format_number(value * 100, 2)}%"


def _judge_share(h: Hypothesis, points: list[Point]) -> Judgement:
    e = h.expect
    part = _one(points, e.metric, e.at)
    whole = _same_point(points, e.of, part.at)
    part_samples = _samples(part, None, e.min_samples)
    whole_samples = _samples(whole, part.record.unit, e.min_samples)
    paired = (part.record.breakdown is not None and part.record.breakdown == whole.record.breakdown
              and len(part_samples) == len(whole_samples))
    try:
        est = stats.ratio_interval(part_samples, whole_samples, paired=paired, seed=_seed(h, e.metric, e.of))
    except ValueError as exc:
        raise _Inconclusive(f"cannot compute {e.metric} / {e.of}: {exc}") from None
    verdict, why = _bounds(est.low, est.high, at_least=e.at_least, at_most=e.at_most)
    label = f"{e.metric} / {e.of}"
    return Judgement(
        verdict=verdict,
        reason=why,
        expected=f"{label} {_range_text(e.at_least, e.at_most, _pct)}",
        measured=Measured(label="share", unit="%", value=est.value * 100, low=est.low * 100, high=est.high * 100),
        off_by=_off_range(est.value, e.at_least, e.at_most, _pct, "share"),
        warnings=tuple(f"{p.record.name}: {w}" for p, s in ((part, part_samples), (whole, whole_samples)) for w in stats.instability(s)),
        used=(part, whole),
    )


def _judge_scaling(h: Hypothesis, points: list[Point]) -> Judgement:
    e = h.expect
    found = [p for p in _candidates(points, e.metric, e.at) if e.over in p.at]
    if not found:
        raise _Inconclusive(f"no record of {e.metric} says which {e.over} it was measured at")
    xs = [p.at[e.over] for p in found]
    if len(set(xs)) != len(xs):
        raise _Inconclusive(f"{e.metric} was recorded more than once per {e.over}; add expect.at to choose one series")
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs):
        raise _Inconclusive(f"{e.over} values are not numbers: {xs}")
    if len(xs) < 2:
        raise _Inconclusive(f"a scaling exponent needs at least two values of {e.over}; the probe recorded {len(xs)}")
    found = sorted(found, key=lambda p: p.at[e.over])
    unit = found[0].record.unit
    samples = [_samples(p, unit, e.min_samples) for p in found]
    try:
        est = stats.slope_interval([float(p.at[e.over]) for p in found], samples, seed=_seed(h, e.metric, e.over))
    except ValueError as exc:
        raise _Inconclusive(f"cannot fit an exponent: {exc}") from None
    low_edge, high_edge = e.exponent - e.tolerance, e.exponent + e.tolerance
    verdict, why = _bounds(est.low, est.high, at_least=low_edge, at_most=high_edge)
    diff = est.value - e.exponent
    expected_text = f"{units.format_number(e.exponent)} ± {units.format_number(e.tolerance)}"
    off_by = f"{units.format_number(abs(diff), 2)} {'above' if diff >= 0 else 'below'} the expected exponent {expected_text}"
    warnings = tuple(
        f"{e.metric} at {e.over}={p.at[e.over]}: {w}" for p, s in zip(found, samples) for w in stats.instability(s)
    )
    return Judgement(
        verdict=verdict, reason=why,
        expected=f"{e.metric} ∝ {e.over}^k, k = {expected_text}",
        measured=Measured(label="exponent", unit=None, value=est.value, low=est.low, high=est.high),
        off_by=off_by, warnings=warnings, used=tuple(found),
    )


def _judge_speedup(h: Hypothesis, points: list[Point]) -> Judgement:
    e = h.expect
    base = _one(points, e.baseline, e.at)
    cand = _one(points, e.candidate, e.at)
    unit = base.record.unit
    dim = units.dimension(unit)
    base_samples = _samples(base, None, e.min_samples)
    cand_samples = _samples(cand, unit, e.min_samples)
    if dim in units.LOWER_IS_FASTER:
        num, den = base_samples, cand_samples
    elif dim in units.HIGHER_IS_FASTER:
        num, den = cand_samples, base_samples
    else:
        raise UserError(f"a speedup compares times or rates; {e.baseline} is in {unit}")
    try:
        est = stats.ratio_interval(num, den, paired=False, seed=_seed(h, e.baseline, e.candidate))
    except ValueError as exc:
        raise _Inconclusive(f"cannot compute the speedup: {exc}") from None
    verdict, why = _bounds(est.low, est.high, at_least=e.at_least, at_most=e.at_most)
    return Judgement(
        verdict=verdict, reason=why,
        expected=f"{e.candidate} vs {e.baseline}: speedup {_range_text(e.at_least, e.at_most, units.format_factor)}",
        measured=Measured(label="speedup", unit="x", value=est.value, low=est.low, high=est.high),
        off_by=_off_range(est.value, e.at_least, e.at_most, units.format_factor, "speedup"),
        warnings=tuple(f"{p.record.name}: {w}" for p, s in ((base, base_samples), (cand, cand_samples)) for w in stats.instability(s)),
        used=(base, cand),
    )


_JUDGES = {
    "cost": _judge_value,
    "at_most": _judge_value,
    "at_least": _judge_value,
    "share": _judge_share,
    "scaling": _judge_scaling,
    "speedup": _judge_speedup,
}


def expected_text(expect: Expect) -> str:
    """The expectation in words, for when there is no measurement to put next to it."""
    e = expect
    if e.kind == "cost":
        ref = e.floor if e.floor else units.format_quantity(e.value, e.unit)
        return f"≈ {ref} (×{units.format_number(e.factor)})"
    if e.kind in ("at_most", "at_least"):
        sign = "≤" if e.kind == "at_most" else "≥"
        if e.floor:
            scale = e.factor or 1.0
            return f"{sign} {units.format_number(scale)} × {e.floor}" if scale != 1 else f"{sign} {e.floor}"
        return f"{sign} {units.format_quantity(e.value, e.unit)}"
    if e.kind == "share":
        return f"{e.metric} / {e.of} {_range_text(e.at_least, e.at_most, _pct)}"
    if e.kind == "scaling":
        return f"{e.metric} ∝ {e.over}^k, k = {units.format_number(e.exponent)} ± {units.format_number(e.tolerance)}"
    return f"{e.candidate} vs {e.baseline}: speedup {_range_text(e.at_least, e.at_most, units.format_factor)}"


def failure_reason(execution: ExecutionRecord) -> str:
    return execution.reason or f"{execution.notebook}: {execution.status}"


def judge(hypothesis: Hypothesis, executions: list[ExecutionRecord]) -> Judgement:
    """The verdict on one hypothesis from the executions of its probe."""
    expected = expected_text(hypothesis.expect)
    failed = [x for x in executions if x.status != "ok"]
    if failed:
        return Judgement(verdict=Verdict.ERROR, reason="; ".join(failure_reason(x) for x in failed), expected=expected)
    if not executions:
        return Judgement(verdict=Verdict.INCONCLUSIVE, reason="the probe was not executed", expected=expected)
    sweep = hypothesis.probe.sweep
    points = effective_points(executions, sweep.param if sweep else None)
    try:
        return _JUDGES[hypothesis.expect.kind](hypothesis, points)
    except _Inconclusive as exc:
        return Judgement(verdict=Verdict.INCONCLUSIVE, reason=str(exc), expected=expected)
    except UserError as exc:
        # a unit mismatch between the record and the expectation is a mistake to fix, not evidence
        return Judgement(verdict=Verdict.ERROR, reason=f"cannot compare: {exc}", expected=expected)
