"""The share of a whole taken by a part: `metric / of` within `at_least` and/or `at_most`.

A breakdown records every phase and the step with samples paired step by step, so the share is a
ratio of paired sums; unattributed time is its own part, never folded into a phase.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from perfkit import stats, units
from perfkit.experiment.records import plots
from perfkit.experiment.records.checker import Checker
from perfkit.experiment.records.kinds.base import (
    Expect,
    measured,
    off_range,
    one,
    range_text,
    read_range,
    read_unit,
    same_point,
    samples,
    warnings_for,
)
from perfkit.experiment.records.kinds.base import bounds as compare
from perfkit.experiment.records.verdict import Floor, Inconclusive, Judgement, Point
from perfkit.phases import BREAKDOWN, STEP, UNATTRIBUTED


def _pct(value: float) -> str:
    return f"{units.format_number(value * 100, 2)}%"


@dataclass(frozen=True, kw_only=True)
class Share(Expect):
    """`metric` takes between `at_least` and `at_most` of `of` (fractions, or % with `unit`)."""

    KIND = "share"
    KEYS = {"metric": True, "of": True, "at_least": False, "at_most": False, "unit": False}

    metric: str
    of: str
    at_least: float | None = None
    at_most: float | None = None
    unit: str | None = None

    @classmethod
    def read(cls, checker: Checker, expect: dict, where: tuple) -> dict[str, Any]:
        fields: dict[str, Any] = cls.names(checker, expect, where, "metric", "of")
        unit = read_unit(checker, expect, where)
        if unit is not None and units.dimension(unit) != "fraction":
            checker.fail(where + ("unit",), f"a share is a fraction; expected 'fraction' or '%', got {unit!r}")
        elif unit is not None:
            fields["unit"] = unit
        fields.update(read_range(checker, expect, where, positive=False))
        scale = units.factor(fields.get("unit") or "fraction", "fraction")
        for key in ("at_least", "at_most"):
            if fields.get(key) is not None:
                fields[key] *= scale
                if not 0 <= fields[key] <= 1:
                    checker.fail(where + (key,), f"a share lies between 0 and 1 (0% and 100%), got {expect[key]!r}")
        return fields

    def metrics(self) -> tuple[str, ...]:
        return (self.metric, self.of)

    def summarized(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((self.metric, self.of, STEP, *BREAKDOWN)))

    def expected(self, floor: Floor | None = None) -> str:
        return f"{self.metric} / {self.of} {range_text(self.at_least, self.at_most, _pct)}"

    def edges(self) -> tuple[float | None, float | None]:
        return tuple(
            None if e is None else e * 100 for e in (self.at_least, self.at_most)
        )  # the measured share is in %

    def judge(self, points: list[Point], *, confidence: float = stats.CONFIDENCE) -> Judgement:
        part = one(points, self.metric, self.at)
        whole = same_point(points, self.of, part.at)
        part_samples = samples(part, None, self.min_samples)
        whole_samples = samples(whole, part.unit, self.min_samples)
        paired = (
            part.breakdown is not None
            and part.breakdown == whole.breakdown
            and [len(r) for r in part_samples] == [len(r) for r in whole_samples]
        )
        try:
            est = stats.ratio_estimate(part_samples, whole_samples, paired=paired, log=False, confidence=confidence)
        except ValueError as exc:
            raise Inconclusive(f"cannot compute {self.metric} / {self.of}: {exc}") from None
        verdict, why, needed = compare(est, at_least=self.at_least, at_most=self.at_most)
        return Judgement(
            verdict=verdict,
            reason=why,
            needed=needed,
            expected=self.expected(),
            measured=measured("share", "%", est, scale=100, between=part_samples),
            off_by=off_range(est.value, self.at_least, self.at_most, _pct, "share"),
            warnings=warnings_for([(part.name, part_samples), (whole.name, whole_samples)]),
            used=(part, whole),
        )

    def _parts(self, judgement: Judgement, points: list[Point]) -> list[tuple[str, float]]:
        """(name, mean) of each part of the whole, in phase order."""
        part = judgement.used[0]
        if part.breakdown is None:
            whole = judgement.used[1]
            part_mean = stats.mean_estimate(part.replicates).value
            whole_mean = stats.mean_estimate(whole.replicates).value * units.factor(whole.unit, part.unit)
            return [(part.name, part_mean), (f"rest of {whole.name}", max(whole_mean - part_mean, 0.0))]
        same = [p for p in points if p.at == part.at and p.breakdown == part.breakdown and p.name != part.breakdown]
        out = []
        for point in same:  # in the order the probe recorded them: the phases, then unattributed
            if point.samples():
                mean = stats.mean_estimate(point.replicates).value
                out.append((point.name, mean * units.factor(point.unit, part.unit)))
        return out

    def plot(self, fig, judgement: Judgement, points: list[Point]) -> None:
        parts = self._parts(judgement, points)
        total = sum(v for _, v in parts) or 1.0
        ax = fig.add_axes((0.08, 0.3, 0.88, 0.36))
        left = 0.0
        for i, (name, value) in enumerate(parts):
            share = value / total
            claimed = name == self.metric
            color = (
                plots.CLAIMED
                if claimed
                else ("#ffffff" if name == UNATTRIBUTED else plots.PHASE_COLORS[i % len(plots.PHASE_COLORS)])
            )
            ax.barh(
                [0],
                [share],
                left=left,
                color=color,
                edgecolor="#37474f",
                linewidth=1.5 if claimed else 0.6,
                hatch="//" if name == UNATTRIBUTED else None,
                label=f"{name} {share:.1%}",
            )
            left += share
        color = plots.COLORS[judgement.verdict]
        for bound, style in ((self.at_least, "--"), (self.at_most, ":")):
            if bound is not None:
                ax.axvline(bound, color=color, linestyle=style, linewidth=1.5)
                ax.text(bound, 0.55, f" claimed {'≥' if style == '--' else '≤'} {bound:.0%}", fontsize=7, color=color)
        ax.set_xlim(0, 1)
        ax.set_yticks([])
        unit = judgement.used[0].unit
        of = self.of if self.of != STEP else "step"
        ax.set_xlabel(f"share of {of} (mean {units.format_quantity(total, unit)}); claimed part: {self.metric}")
        ax.legend(fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=4, frameon=False)
