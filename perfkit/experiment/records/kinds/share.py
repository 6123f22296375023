"""The share of a whole taken by a part: `metric / of` within `at_least` and/or `at_most`.

A breakdown records every phase and the step with samples paired step by step, so the share is a
ratio of paired sums; unattributed time is its own part, never folded into a phase.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from perfkit import stats, units
from perfkit.experiment.records import plots
from perfkit.experiment.records.checker import Checker, optional, required
from perfkit.experiment.records.kinds.base import (
    Expect,
    apart_warning,
    mean,
    measured,
    off_range,
    one,
    pairing,
    positive,
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
    KEYS = {
        "metric": required("the part: a metric the probe records with samples paired with `of`'s (a phase)"),
        "of": required("the whole it is a share of (the step)"),
        "at_least": optional("the least share the claim allows, a fraction (0.25) or, with unit %, a percentage"),
        "at_most": optional("the most share the claim allows; give at_least, at_most or both"),
        "unit": optional("fraction (the default) or %"),
    }

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
            est = stats.ratio_estimate(
                part_samples, whole_samples, paired=paired, log=False, confidence=confidence, machines=part.machines
            )
        except ValueError as exc:
            raise Inconclusive(f"cannot compute {self.metric} / {self.of}: {exc}") from None
        verdict, why, needed = compare(est, at_least=self.at_least, at_most=self.at_most)
        return Judgement(
            verdict=verdict,
            reason=why,
            needed=needed,
            expected=self.expected(),
            measured=measured(
                "share",
                "%",
                est,
                scale=100,
                between=part_samples,
                paired=pairing(est, "each one's part over its own whole"),
            ),
            off_by=off_range(est.value, self.at_least, self.at_most, _pct, "share"),
            warnings=warnings_for([(part.name, part_samples), (whole.name, whole_samples)])
            + apart_warning(
                "share",
                [100 * mean(p) / mean(w) for p, w in zip(part_samples, whole_samples)],
                "%",
                log=positive(part_samples),
            ),
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

    def _evidence(self, judgement: Judgement) -> plots.Evidence:
        """Each process's share (its part's mean over its whole's), in %, and its samples: each step's own
        share where part and whole were recorded step by step, else each sample over its process's whole."""
        part, whole = judgement.used
        scale = units.factor(whole.unit, part.unit)
        samples, shares = [], []
        for p, w in zip(part.replicates, whole.replicates):
            of_whole = mean(w) * scale
            if part.breakdown is not None and part.breakdown == whole.breakdown and len(p) == len(w) and all(w):
                samples.append([100 * a / (b * scale) for a, b in zip(p, w)])
            else:
                samples.append([100 * a / of_whole for a in p])
            shares.append(100 * mean(p) / of_whole)
        return plots.evidence_of(samples, shares, judgement.measured)

    def _composition(self, fig, judgement: Judgement, points: list[Point]) -> None:
        """What the whole is made of (the processes' mean of each part), one stacked bar on a 0-100% axis."""
        parts = self._parts(judgement, points)
        total = sum(max(v, 0.0) for _, v in parts) or 1.0
        ax = fig.add_axes((0.69, 0.24, 0.035, 0.46))
        bottom = 0.0
        for i, (name, value) in enumerate(parts):
            share = 100 * max(value, 0.0) / total
            claimed = name == self.metric
            color = (
                plots.CLAIMED
                if claimed
                else ("#ffffff" if name == UNATTRIBUTED else plots.PHASE_COLORS[i % len(plots.PHASE_COLORS)])
            )
            ax.bar(
                [0],
                [share],
                bottom=bottom,
                width=0.8,
                color=color,
                edgecolor="#37474f",
                linewidth=1.5 if claimed else 0.6,
                hatch="//" if name == UNATTRIBUTED else None,
                label=f"{name} {units.format_number(share, 2)}%",
            )
            bottom += share
        unit = judgement.used[0].unit
        of = self.of if self.of != STEP else "step"
        ax.set_xlim(-0.5, 0.5)
        ax.set_xticks([0], [f"{of}\n{units.format_quantity(total, unit)}"], fontsize=6.5)
        plots.readable_ticks(ax, plots.Scale("y", False, 0.0, 100.0))
        ax.set_ylim(0, 100)
        ax.set_ylabel("share [%], linear scale", fontsize=6.5)
        handles, labels = ax.get_legend_handles_labels()
        ax.legend(handles[::-1], labels[::-1], fontsize=6, loc="center left", bbox_to_anchor=(1.1, 0.5), frameon=False)

    def plot(self, fig, judgement: Judgement, points: list[Point]) -> None:
        m = judgement.measured
        evidence = self._evidence(judgement)
        claims = [
            plots.Claim(100 * bound, f"claimed {sign} {_pct(bound)}", style=style)
            for bound, sign, style in ((self.at_least, "≥", "--"), (self.at_most, "≤", ":"))
            if bound is not None
        ]
        ax = fig.add_axes((0.13, 0.24, 0.46, 0.46))
        scale = plots.scale_for("x", evidence.shown(), evidence.reach() + [c.value for c in claims])
        plots.pooled(ax, scale, m, 0.0, plots.COLORS[judgement.verdict], f"share, {m.level()} interval")
        at = plots.rows(ax, scale, evidence)
        for c in claims:
            plots.claim(ax, scale, c, plots.ABOVE)
        plots.row_labels(ax, at, f"all {len(at) - 1}")
        scale.apply(ax, f"{self.metric} / {self.of} [%]")
        plots.legend(fig, [ax], ncol=3)
        self._composition(fig, judgement, points)
