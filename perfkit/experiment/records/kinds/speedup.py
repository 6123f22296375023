"""How much faster a candidate is than a baseline: a ratio of means of times or of rates."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from perfkit import stats, units
from perfkit.errors import UserError
from perfkit.experiment.records import plots
from perfkit.experiment.records.checker import Checker
from perfkit.experiment.records.kinds.base import (
    Expect,
    bounds,
    measured,
    off_range,
    one,
    range_text,
    read_range,
    samples,
    warnings_for,
)
from perfkit.experiment.records.verdict import Floor, Inconclusive, Judgement, Point


@dataclass(frozen=True, kw_only=True)
class Speedup(Expect):
    """`candidate` is between `at_least` and `at_most` times faster than `baseline`."""

    KIND = "speedup"
    KEYS = {"baseline": True, "candidate": True, "at_least": False, "at_most": False}

    baseline: str
    candidate: str
    at_least: float | None = None
    at_most: float | None = None

    @classmethod
    def read(cls, checker: Checker, expect: dict, where: tuple) -> dict[str, Any]:
        fields: dict[str, Any] = cls.names(checker, expect, where, "baseline", "candidate")
        fields.update(read_range(checker, expect, where, positive=True))
        return fields

    def metrics(self) -> tuple[str, ...]:
        return (self.baseline, self.candidate)

    def expected(self, floor: Floor | None = None) -> str:
        return (
            f"{self.candidate} vs {self.baseline}: speedup "
            f"{range_text(self.at_least, self.at_most, units.format_factor)}"
        )

    def edges(self) -> tuple[float | None, float | None]:
        return self.at_least, self.at_most

    def judge(self, points: list[Point], *, confidence: float = stats.CONFIDENCE) -> Judgement:
        base = one(points, self.baseline, self.at)
        cand = one(points, self.candidate, self.at)
        unit = base.unit
        dim = units.dimension(unit)
        base_samples = samples(base, None, self.min_samples)
        cand_samples = samples(cand, unit, self.min_samples)
        if dim in units.LOWER_IS_FASTER:
            num, den = base_samples, cand_samples
        elif dim in units.HIGHER_IS_FASTER:
            num, den = cand_samples, base_samples
        else:
            raise UserError(f"a speedup compares times or rates; {self.baseline} is in {unit}")
        if len(num) != len(den):
            raise Inconclusive(f"{self.baseline} and {self.candidate} come from different numbers of replicates")
        try:
            est = stats.ratio_estimate(num, den, paired=False, confidence=confidence)
        except ValueError as exc:
            raise Inconclusive(f"cannot compute the speedup: {exc}") from None
        verdict, why, needed = bounds(est, at_least=self.at_least, at_most=self.at_most)
        return Judgement(
            verdict=verdict,
            reason=why,
            needed=needed,
            expected=self.expected(),
            measured=measured("speedup", "x", est),
            off_by=off_range(est.value, self.at_least, self.at_most, units.format_factor, "speedup"),
            warnings=warnings_for([(base.name, base_samples), (cand.name, cand_samples)]),
            used=(base, cand),
        )

    def plot(self, fig, judgement: Judgement, points: list[Point]) -> None:
        ax = fig.add_axes((0.25, 0.2, 0.5, 0.55))
        base, cand = judgement.used
        unit = base.unit
        names, values, errs = [], [], [[], []]
        level = judgement.measured.confidence or stats.CONFIDENCE
        for p in (base, cand):
            est = stats.mean_estimate([units.convert(list(r), p.unit, unit) for r in p.replicates], confidence=level)
            names.append(p.name)
            values.append(est.value)
            errs[0].append(est.value - est.low)
            errs[1].append(est.high - est.value)
        # where the candidate would have to be for the claimed factor, against this baseline
        faster_is_lower = units.dimension(unit) in units.LOWER_IS_FASTER
        factors = [f for f in (self.at_least, self.at_most) if f]
        marks = [values[0] / f if faster_is_lower else values[0] * f for f in factors]
        lows = [v - e for v, e in zip(values, errs[0])]
        edges = [x for x in lows if x > 0] + values + [v + e for v, e in zip(values, errs[1])] + marks
        plots.log_if_spread(ax, values + marks, "x")
        log = ax.get_xscale() == "log"
        left = min(edges) / 1.5 if log else 0.0
        cut = log and any(low <= left for low in lows)
        errs[0] = [v - left if log and low <= left else e for v, e, low in zip(values, errs[0], lows)]
        ax.barh(names, values, xerr=errs, color=["#b0bec5", plots.COLORS[judgement.verdict]], capsize=4)
        ax.set_xlim(left, max(edges) * (1.5 if log else 1.1))
        if log:
            plots.log_ticks(ax, "x")
        for factor, at in zip(factors, marks):
            ax.axvline(at, color=plots.CLAIMED, linestyle="--", linewidth=1.2)
            ax.annotate(
                f" claimed {units.format_factor(factor)}",
                (at, 0.5),
                xycoords=("data", "axes fraction"),
                fontsize=7,
                color=plots.CLAIMED,
                rotation=90,
                ha="left",
                va="center",
            )
        if cut:  # an interval reaching to 0 or below: drawn to the axis's edge, and said
            ax.text(
                0.0,
                -0.32,
                "an interval reaching 0 or below runs off the left edge",
                transform=ax.transAxes,
                fontsize=6.5,
                color="#616161",
            )
        ax.set_xlabel(f"mean [{unit}], {judgement.measured.level()} interval")
        claim = range_text(self.at_least, self.at_most, units.format_factor)
        ax.set_title(f"speedup {units.format_factor(judgement.measured.value)}; claimed {claim}", fontsize=8)
