"""How a metric grows with a parameter: the log-log exponent k of `metric ∝ over^k`, within a tolerance.

The points come from a sweep of executions or from the `at` values a probe records itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from perfkit import stats, units
from perfkit.experiment.records import plots
from perfkit.experiment.records.checker import Checker
from perfkit.experiment.records.kinds.base import Expect, bounds, candidates, measured, samples, warnings_for
from perfkit.experiment.records.verdict import Floor, Inconclusive, Judgement, Point


@dataclass(frozen=True, kw_only=True)
class Scaling(Expect):
    """`metric ∝ over^k` with k = exponent ± tolerance."""

    KIND = "scaling"
    KEYS = {"metric": True, "over": True, "exponent": True, "tolerance": True}

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
        try:
            est = stats.slope_estimate([float(p.at[self.over]) for p in found], per_point, confidence=confidence)
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
            measured=measured("exponent", None, est),
            off_by=(
                f"{units.format_number(abs(diff), 2)} {'above' if diff >= 0 else 'below'} "
                f"the expected exponent {self._claim()}"
            ),
            warnings=warnings_for(
                [(f"{self.metric} at {self.over}={p.at[self.over]}", s) for p, s in zip(found, per_point)]
            ),
            used=tuple(found),
        )

    def plot(self, fig, judgement: Judgement, points: list[Point]) -> None:
        from matplotlib.ticker import NullLocator

        ax = fig.add_axes((0.13, 0.16, 0.55, 0.62))
        xs, means, lows, highs = [], [], [], []
        level = judgement.measured.confidence or stats.CONFIDENCE
        for p in judgement.used:
            est = stats.mean_estimate(p.replicates, confidence=level)
            xs.append(float(p.at[self.over]))
            means.append(est.value)
            lows.append(est.value - est.low)
            highs.append(est.high - est.value)
        unit = judgement.used[0].unit
        ax.errorbar(
            xs,
            means,
            yerr=[lows, highs],
            fmt="o",
            color="#37474f",
            capsize=3,
            label=f"measured ({judgement.measured.level()})",
        )
        ax.set_xscale("log")
        ax.set_yscale("log")
        anchor_x = math.exp(sum(math.log(x) for x in xs) / len(xs))
        anchor_y = math.exp(sum(math.log(y) for y in means) / len(means))
        span = [min(xs), max(xs)]
        m = judgement.measured
        ax.plot(
            span,
            [anchor_y * (x / anchor_x) ** m.value for x in span],
            color=plots.COLORS[judgement.verdict],
            label=(
                f"fitted k = {units.format_number(m.value)} "
                f"[{units.format_number(m.low)}, {units.format_number(m.high)}]"
            ),
        )
        ax.plot(
            span,
            [anchor_y * (x / anchor_x) ** self.exponent for x in span],
            color=plots.CLAIMED,
            linestyle="--",
            label=f"expected k = {self._claim()}",
        )
        plots.log_ticks(ax, "y")
        ax.set_xticks(sorted(set(xs)), [units.format_number(x, 6) for x in sorted(set(xs))])  # the sizes measured
        ax.xaxis.set_minor_locator(NullLocator())
        ax.tick_params(labelsize=7, which="both")
        ax.set_xlabel(self.over)
        ax.set_ylabel(f"{self.metric} [{unit}]", fontsize=8)
        # beside the axes, inside the figure: the labels are wrapped to the room there is
        for text in ax.legend(fontsize=6.5, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False).get_texts():
            text.set_text(plots.wrap(text.get_text(), 26))
