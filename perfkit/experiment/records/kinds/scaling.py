"""How a metric grows with a parameter: the log-log exponent k of `metric ∝ over^k`, within a tolerance.

The points come from a sweep of executions or from the `at` values a probe records itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from perfkit import stats, units
from perfkit.experiment.records import plots
from perfkit.experiment.records.checker import Checker, required
from perfkit.experiment.records.kinds.base import (
    Expect,
    apart_warning,
    bounds,
    candidates,
    machines_of,
    mean,
    measured,
    pairing,
    samples,
    warnings_for,
)
from perfkit.experiment.records.verdict import Floor, Inconclusive, Judgement, Point


@dataclass(frozen=True, kw_only=True)
class Scaling(Expect):
    """`metric ∝ over^k` with k = exponent ± tolerance."""

    KIND = "scaling"
    KEYS = {
        "metric": required("the metric whose growth is claimed, recorded at two or more values of `over`"),
        "over": required("the parameter it grows with: a probe.sweep parameter, or an `at` key the probe records"),
        "exponent": required("k in metric ∝ over^k, fitted on log-log axes (1: linear, 0: flat)"),
        "tolerance": required("the claim holds for k within exponent ± tolerance (above 0)"),
    }

    metric: str
    over: str  # the swept parameter
    exponent: float
    tolerance: float

    @classmethod
    def read(cls, checker: Checker, expect: dict, where: tuple) -> dict[str, Any]:
        fields: dict[str, Any] = cls.names(checker, expect, where, "metric", "over")
        fields["tolerance"] = checker.number(expect, "tolerance", where, positive=True)
        fields["exponent"] = checker.number(expect, "exponent", where)
        return fields

    def metrics(self) -> tuple[str, ...]:
        return (self.metric,)

    def _claim(self) -> str:
        return f"{units.format_number(self.exponent)} ± {units.format_number(self.tolerance)}"

    def expected(self, floor: Floor | None = None) -> str:
        return f"{self.metric} ∝ {self.over}^k, k = {self._claim()}"

    def edges(self) -> tuple[float | None, float | None]:
        return self.exponent - self.tolerance, self.exponent + self.tolerance

    def judge(self, points: list[Point], *, confidence: float = stats.CONFIDENCE) -> Judgement:
        found = [p for p in candidates(points, self.metric, self.at) if self.over in p.at]
        if not found:
            raise Inconclusive(f"no record of {self.metric} says which {self.over} it was measured at")
        xs = [p.at[self.over] for p in found]
        if len(set(xs)) != len(xs):
            raise Inconclusive(
                f"{self.metric} was recorded more than once per {self.over}; add expect.at to choose one series"
            )
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs):
            raise Inconclusive(f"{self.over} values are not numbers: {xs}")
        if len(xs) < 2:
            raise Inconclusive(
                f"a scaling exponent needs at least two values of {self.over}; the probe recorded {len(xs)}"
            )
        found = sorted(found, key=lambda p: p.at[self.over])
        unit = found[0].unit
        per_point = [samples(p, unit, self.min_samples) for p in found]
        if len({len(r) for r in per_point}) != 1:
            raise Inconclusive(
                f"the points of {self.metric} come from different numbers of replicates; "
                "each replicate must measure every point"
            )
        sizes = [float(p.at[self.over]) for p in found]
        try:
            est = stats.slope_estimate(sizes, per_point, confidence=confidence, machines=machines_of(found))
        except ValueError as exc:
            raise Inconclusive(f"cannot fit an exponent: {exc}") from None
        verdict, why, needed = bounds(
            est, at_least=self.exponent - self.tolerance, at_most=self.exponent + self.tolerance
        )
        diff = est.value - self.exponent
        return Judgement(
            verdict=verdict,
            reason=why,
            needed=needed,
            expected=self.expected(),
            measured=measured("exponent", None, est, paired=pairing(est, "each one's own sweep, fitted")),
            off_by=(
                f"{units.format_number(abs(diff), 2)} {'above' if diff >= 0 else 'below'} "
                f"the expected exponent {self._claim()}"
            ),
            warnings=warnings_for(
                [(f"{self.metric} at {self.over}={p.at[self.over]}", s) for p, s in zip(found, per_point)]
            )
            + apart_warning("exponent", self._own_exponents(sizes, per_point), None, log=False),
            used=tuple(found),
        )

    @staticmethod
    def _own_exponents(xs: list[float], per_point: list[list[list[float]]]) -> list[float]:
        """Each process's own exponent: the log-log slope of its means over the sizes (one process: none)."""
        if len(per_point[0]) < 2:
            return []
        return [stats.loglog_slope(xs, [mean(p[r]) for p in per_point]) for r in range(len(per_point[0]))]

    def _sweep(self, judgement: Judgement) -> tuple[list[float], list[plots.Evidence]]:
        """The sizes measured and, at each, its evidence: samples and each process's mean, in the first
        point's unit, with the mean over processes at the verdict's level."""
        level = judgement.measured.confidence or stats.CONFIDENCE
        unit = judgement.used[0].unit
        xs, points = [], []
        for p in judgement.used:
            reps = [units.convert(list(r), p.unit, unit) for r in p.replicates]
            est = stats.mean_estimate(reps, confidence=level)
            xs.append(float(p.at[self.over]))
            points.append(plots.evidence_of(reps, [sum(r) / len(r) for r in reps], est))
        return xs, points

    def plot(self, fig, judgement: Judgement, points: list[Point]) -> None:
        xs, sweep = self._sweep(judgement)
        m = judgement.measured
        ax = fig.add_axes((0.1, 0.26, 0.5, 0.5))
        scale = plots.scale_for(
            "y", [v for e in sweep for v in e.shown()], [v for e in sweep for v in e.reach()], power=True
        )
        processes = len(sweep[0].estimates)
        gaps = [math.log10(b / a) for a, b in zip(xs, xs[1:])]
        width = 0.6 * min(gaps)  # in decades: each process's strip beside the others, within its size's room
        for x, e in zip(xs, sweep):
            slots = [width * ((i + 0.5) / (processes + 1) - 0.5) for i in range(processes + 1)]  # the mean's last
            for i, values in enumerate(e.samples):
                offsets = plots.spread(len(values), width / (processes + 1) * 0.7)
                plots.strip(ax, scale, list(values), [x * 10 ** (slots[i] + o) for o in offsets], i)
                plots.own(ax, scale, e.estimates[i], x * 10 ** slots[i], i)
            plots.pooled(
                ax, scale, e, x * 10 ** slots[-1], plots.POOLED, f"mean of the processes, {m.level()} interval"
            )
        self._lines(ax, xs, sweep, judgement)
        xscale = plots.scale_for("x", [x * 10**s for x in xs for s in (-width / 2, width / 2)], power=True)
        xscale.apply(ax, self.over)
        if len(xs) >= 3:  # the sizes measured, when there are enough of them to read the axis by
            plots.readable_ticks(ax, xscale, sorted(set(xs)))
        scale.apply(ax, f"{self.metric} [{judgement.used[0].unit}]")
        self._exponents(fig, judgement, xs, sweep)
        plots.legend(fig, fig.axes, ncol=3)

    def _lines(self, ax, xs: list[float], sweep: list[plots.Evidence], judgement: Judgement) -> None:
        """The fitted and the expected power laws through the processes' means, over the sizes measured."""
        m = judgement.measured
        anchor_x = math.exp(sum(math.log(x) for x in xs) / len(xs))
        anchor_y = math.exp(sum(math.log(e.value) for e in sweep) / len(sweep))
        span = [min(xs), max(xs)]
        fitted = (
            f"fitted k = {units.format_number(m.value)} [{units.format_number(m.low)}, {units.format_number(m.high)}]"
        )
        for k, color, style, label in (
            (m.value, plots.COLORS[judgement.verdict], "-", fitted),
            (self.exponent, plots.CLAIMED, "--", f"expected k = {self._claim()}"),
        ):
            ax.plot(span, [anchor_y * (x / anchor_x) ** k for x in span], color=color, linestyle=style, label=label)

    def _exponents(self, fig, judgement: Judgement, xs: list[float], sweep: list[plots.Evidence]) -> None:
        """Each process's own exponent (its means' log-log slope) below the verdict's, and the claimed range."""
        m = judgement.measured
        own = self._own_exponents(xs, [[list(s) for s in e.samples] for e in sweep]) or [m.value]
        evidence = plots.evidence_of([[] for _ in own], own, m)
        claim = plots.Claim(self.exponent, f"expected k = {self._claim()}", band=self.edges())
        ax = fig.add_axes((0.75, 0.26, 0.22, 0.5))
        scale = plots.scale_for("x", evidence.shown(), evidence.reach() + [claim.value, *claim.band])
        plots.pooled(ax, scale, m, 0.0, plots.COLORS[judgement.verdict], f"exponent, {m.level()} interval")
        at = plots.rows(ax, scale, evidence)
        plots.claim(ax, scale, claim, plots.ABOVE)
        plots.row_labels(ax, at, f"all {len(at) - 1}")
        scale.apply(ax, "k, no unit")
