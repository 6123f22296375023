"""How much faster a candidate is than a baseline: a ratio of means of times or of rates."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from perfkit import stats, units
from perfkit.errors import UserError
from perfkit.experiment.records import plots
from perfkit.experiment.records.checker import Checker, optional, required
from perfkit.experiment.records.kinds.base import (
    Expect,
    apart_warning,
    bounds,
    machines_of,
    mean,
    measured,
    off_range,
    one,
    pairing,
    positive,
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
    KEYS = {
        "baseline": required("the metric of the slower arm, a time or a rate the probe records"),
        "candidate": required("the metric of the arm claimed faster, in the same dimension as the baseline"),
        "at_least": optional("the least times faster the claim allows (2 = twice as fast)"),
        "at_most": optional("the most times faster it allows; give at_least, at_most or both"),
    }

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
        machines = machines_of([base, cand])
        try:
            est = stats.ratio_estimate(num, den, paired=False, confidence=confidence, machines=machines)
        except ValueError as exc:
            raise Inconclusive(f"cannot compute the speedup: {exc}") from None
        verdict, why, needed = bounds(est, at_least=self.at_least, at_most=self.at_most)
        return Judgement(
            verdict=verdict,
            reason=why,
            needed=needed,
            expected=self.expected(),
            measured=measured("speedup", "x", est, paired=pairing(est, "each one's ratio of its arms' means")),
            off_by=off_range(est.value, self.at_least, self.at_most, units.format_factor, "speedup"),
            warnings=warnings_for([(base.name, base_samples), (cand.name, cand_samples)])
            + apart_warning("speedup", [mean(a) / mean(b) for a, b in zip(num, den)], "x", log=positive(num + den)),
            used=(base, cand),
        )

    def _arms(self, judgement: Judgement) -> tuple[list[plots.Evidence], str]:
        """Each arm's evidence in the baseline's unit (its samples, each process's mean, the mean over
        processes at the verdict's level), and that unit."""
        level = judgement.measured.confidence or stats.CONFIDENCE
        unit = judgement.used[0].unit
        arms = []
        for p in judgement.used:
            reps = [units.convert(list(r), p.unit, unit) for r in p.replicates]
            pooled = stats.mean_estimate(reps, confidence=level)
            arms.append(plots.evidence_of(reps, [sum(r) / len(r) for r in reps], pooled))
        return arms, unit

    def _speedups(self, judgement: Judgement, arms: list[plots.Evidence], unit: str) -> plots.Evidence:
        """Each process's speedup (the ratio of its arms' means) and the verdict's pooled one."""
        base, cand = arms
        lower = units.dimension(unit) in units.LOWER_IS_FASTER
        ratios = [b / c if lower else c / b for b, c in zip(base.estimates, cand.estimates)]
        return plots.evidence_of([[] for _ in ratios], ratios, judgement.measured)

    def plot(self, fig, judgement: Judgement, points: list[Point]) -> None:
        m = judgement.measured
        arms, unit = self._arms(judgement)
        # where the candidate would have to be for the claimed factor, against this baseline
        lower = units.dimension(unit) in units.LOWER_IS_FASTER
        factors = [f for f in (self.at_least, self.at_most) if f]
        claims = [
            plots.Claim(arms[0].value / f if lower else arms[0].value * f, f"claimed {units.format_factor(f)}")
            for f in factors
        ]
        left = fig.add_axes((0.21, 0.26, 0.39, 0.44))
        scale = plots.scale_for(
            "x", [v for a in arms for v in a.shown()], [v for a in arms for v in a.reach()] + [c.value for c in claims]
        )
        tops = [0.0, len(arms[0].estimates) + 1.5]
        for arm, top in zip(arms, tops):
            plots.pooled(left, scale, arm, top, plots.POOLED, f"mean of each arm, {m.level()} interval")
            plots.rows(left, scale, arm, top)
        for c in claims:
            plots.claim(left, scale, c, tops[1] + plots.ABOVE)
        left.set_yticks(tops, [p.name for p in judgement.used], fontsize=7)
        left.set_ylim(tops[1] + len(arms[1].estimates) + 0.7, tops[0] - 0.7)
        scale.apply(left, f"each arm [{unit}]")
        self._ratio_panel(fig, judgement, self._speedups(judgement, arms, unit))
        plots.legend(fig, fig.axes, ncol=3)

    def _ratio_panel(self, fig, judgement: Judgement, speedups: plots.Evidence) -> None:
        """The speedup: the verdict's, each process's below it, and the claimed factors."""
        m = judgement.measured
        ax = fig.add_axes((0.75, 0.26, 0.22, 0.44))
        claims = [
            plots.Claim(f, f"claimed {units.format_factor(f)}", style=style)
            for f, style in ((self.at_least, "--"), (self.at_most, ":"))
            if f
        ]
        scale = plots.scale_for("x", speedups.shown(), speedups.reach() + [c.value for c in claims])
        plots.pooled(ax, scale, m, 0.0, plots.COLORS[judgement.verdict], f"speedup, {m.level()} interval")
        at = plots.rows(ax, scale, speedups)
        for c in claims:
            plots.claim(ax, scale, c, plots.ABOVE)
        plots.row_labels(ax, at, f"all {len(at) - 1}")
        scale.apply(ax, "speedup [x]")
