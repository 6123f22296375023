"""A metric's mean against a value: `cost` (within a factor), `at_most` and `at_least` (a bound).

The reference is a number in the record (`value`) or a floor the probe records itself (`floor`,
e.g. a roofline figure for this machine), which a bound may multiply by `factor`.
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
    bounds,
    mean,
    measured,
    one,
    pairing,
    positive,
    ratio_text,
    read_unit,
    same_point,
    samples,
    warnings_for,
)
from perfkit.experiment.records.verdict import Floor, Inconclusive, Judgement, Point

_KEYS = {
    "metric": required("the name the probe records the measurement under (`perfkit.record(name, ...)`)"),
    "unit": required("the unit `value` is in; the recorded unit must convert to it (ms and s, tok/s and tok/ms)"),
    "value": optional("the reference, a number above 0; give exactly one of `value` and `floor`"),
    "floor": optional(
        "instead of `value`: a metric the probe records beside the measurement (a roofline for this machine), "
        "judged as the ratio measured / floor replicate by replicate"
    ),
    "factor": optional("how far from the reference is still the claim: a bound is factor x the reference"),
}


@dataclass(frozen=True, kw_only=True)
class _Value(Expect):
    metric: str
    unit: str
    value: float | None = None
    floor: str | None = None  # a metric the probe records: the reference measured on this machine
    factor: float | None = None

    @classmethod
    def read(cls, checker: Checker, expect: dict, where: tuple) -> dict[str, Any]:
        fields: dict[str, Any] = cls.names(checker, expect, where, "metric", "floor")
        fields["unit"] = read_unit(checker, expect, where)
        fields["value"] = checker.number(expect, "value", where, positive=True)
        fields["factor"] = checker.number(expect, "factor", where, positive=True, at_least=cls._least_factor())
        if ("value" in expect) == ("floor" in expect):
            checker.missing(
                where, "value", "give exactly one of `value` (a number) or `floor` (a recorded floor metric)"
            )
        return fields

    @staticmethod
    def _least_factor() -> float | None:
        return None

    def metrics(self) -> tuple[str, ...]:
        return tuple(n for n in (self.metric, self.floor) if n)

    def _reference(self, floor: Floor | None) -> tuple[float | None, str]:
        """The reference value (None while a floor is unmeasured) and how to write it."""
        if self.floor is None:
            return self.value, units.format_quantity(self.value, self.unit)
        if floor is None:
            return None, self.floor
        return floor.value, f"{floor.text()} ({self.floor})"

    def _edges(self, reference: float) -> tuple[float | None, float | None]:
        raise NotImplementedError

    def edges(self) -> tuple[float | None, float | None]:
        return self._edges(1.0) if self.floor is not None else self._edges(self.value)

    def judge(self, points: list[Point], *, confidence: float = stats.CONFIDENCE) -> Judgement:
        point = one(points, self.metric, self.at)
        values = samples(point, self.unit, self.min_samples)
        if self.floor is not None:
            return self._judge_on_floor(point, values, same_point(points, self.floor, point.at), confidence)
        est = stats.mean_estimate(values, confidence=confidence, machines=point.machines)
        low, high = self._edges(self.value)
        verdict, why, needed = bounds(est, at_least=low, at_most=high)
        return Judgement(
            verdict=verdict,
            reason=why,
            needed=needed,
            expected=self.expected(),
            measured=measured("mean", self.unit, est, between=values),
            off_by=self._off_by(est.value, self.value, None),
            warnings=warnings_for([(self.metric, values)])
            + apart_warning("mean", [mean(r) for r in values], self.unit, log=positive(values)),
            used=(point,),
        )

    def _judge_on_floor(
        self, point: Point, values: list[list[float]], floor_point: Point, confidence: float
    ) -> Judgement:
        """The per-replicate ratio measured / floor against `factor`: the floor's own noise is in the interval.

        A floor measured in each replicate (a roofline from this process's own bandwidth and FLOP/s)
        moves with the machine's state as the measurement does; dividing replicate by replicate keeps
        both spreads in one interval. An exact floor (a datasheet figure) simply scales the measurement.
        """
        floors = samples(floor_point, self.unit, 1)
        if len(floors) != len(values):
            raise Inconclusive(
                f"{self.metric} and {self.floor} come from different numbers of replicates "
                f"({len(values)} and {len(floors)})"
            )
        if min(v for r in floors for v in r) <= 0:
            raise Inconclusive(f"{self.floor} is not positive: it cannot be a floor")
        exact = len({v for r in floors for v in r}) == 1
        if exact:  # the same number everywhere: each sample divided by it, batches as the measurement's own
            den = [[floors[0][0]] * len(r) for r in values]
            est = stats.ratio_estimate(values, den, paired=True, confidence=confidence, machines=point.machines)
        else:
            est = stats.ratio_estimate(values, floors, paired=False, confidence=confidence, machines=point.machines)
        spread = stats.mean_estimate(floors, confidence=confidence)
        floor = Floor(
            metric=self.floor,
            value=spread.value,
            unit=self.unit,
            note=floor_point.note,
            low=None if exact else spread.low,
            high=None if exact else spread.high,
            replicates=None if exact else spread.replicates,
        )
        low, high = self._edges(1.0)
        verdict, why, needed = bounds(est, at_least=low, at_most=high)
        return Judgement(
            verdict=verdict,
            reason=why,
            needed=needed,
            expected=self.expected(floor),
            measured=measured(
                f"ratio to {self.floor}",
                "x",
                est,
                between=values,
                paired=None if exact else pairing(est, "each one's measurement over its own floor"),
            ),
            off_by=self._off_floor(est.value),
            floor=floor,
            warnings=warnings_for([(self.metric, values)] + ([] if exact else [(self.floor, floors)]))
            + apart_warning(
                f"ratio to {self.floor}",
                [mean(v) / mean(f) for v, f in zip(values, floors)],
                "x",
                log=positive(values),
            ),
            used=(point, floor_point),
        )

    def _off_by(self, value: float, reference: float, floor: Floor | None) -> str:
        raise NotImplementedError

    def _off_floor(self, ratio: float) -> str:
        """How far the ratio to the floor is from the claim: '1.6x above the bound 2 × verify_floor'."""
        raise NotImplementedError

    def _claims(self, reference: float, unit: str) -> list[plots.Claim]:
        """The claim on the axis, in `unit` (the reference is 1 on a ratio to the floor)."""
        raise NotImplementedError

    def _evidence(self, judgement: Judgement) -> tuple[plots.Evidence, float, str, str]:
        """(each process's samples and mean, the reference, its unit, the axis's label): on a floor, each
        sample over its own process's floor, and each process's mean over its floor's mean."""
        m, used = judgement.measured, judgement.used[0]
        values = [units.convert(list(r), used.unit, self.unit) for r in used.replicates]
        if len(judgement.used) == 1:
            means = [sum(r) / len(r) for r in values]
            words = f"{self.metric} [{self.unit}]"
            return plots.evidence_of(values, means, m), self._reference(judgement.floor)[0], self.unit, words
        floor = judgement.used[1]
        floors = [sum(r) / len(r) for r in (units.convert(list(r), floor.unit, self.unit) for r in floor.replicates)]
        ratios = [[v / f for v in rep] for rep, f in zip(values, floors)]
        means = [sum(rep) / len(rep) / f for rep, f in zip(values, floors)]
        words = f"{self.metric} / {self.floor} [x] (floor {judgement.floor.text()})"
        return plots.evidence_of(ratios, means, m), 1.0, "x", words

    def plot(self, fig, judgement: Judgement, points: list[Point]) -> None:
        m = judgement.measured
        evidence, reference, unit, words = self._evidence(judgement)
        claims = self._claims(reference, unit)
        edges = [v for c in claims for v in (c.value, *(c.band or ()))]
        ax = fig.add_axes((0.13, 0.24, 0.83, 0.46))
        scale = plots.scale_for("x", evidence.shown(), evidence.reach() + edges)
        plots.pooled(ax, scale, m, 0.0, plots.COLORS[judgement.verdict], f"{m.label}, {m.level()} interval")
        at = plots.rows(ax, scale, evidence)
        for c in claims:
            plots.claim(ax, scale, c, plots.ABOVE)
        plots.row_labels(ax, at, f"all {len(at) - 1}")
        scale.apply(ax, words)
        plots.legend(fig, [ax], ncol=3)


@dataclass(frozen=True, kw_only=True)
class Cost(_Value):
    """The mean lies within `factor` of the reference: reference / factor .. reference * factor."""

    KIND = "cost"
    KEYS = {**_KEYS, "factor": required("the claim holds from reference / factor to reference x factor (>= 1)")}

    @staticmethod
    def _least_factor() -> float | None:
        return 1.0

    def expected(self, floor: Floor | None = None) -> str:
        return f"≈ {self._reference(floor)[1]} (×{units.format_number(self.factor)})"

    def _edges(self, reference: float) -> tuple[float | None, float | None]:
        return reference / self.factor, reference * self.factor

    def _off_by(self, value: float, reference: float, floor: Floor | None) -> str:
        return ratio_text(value, reference, f"the expected {self._reference(floor)[1]}")

    def _off_floor(self, ratio: float) -> str:
        return ratio_text(ratio, 1.0, f"the floor {self.floor}")

    def _claims(self, reference: float, unit: str) -> list[plots.Claim]:
        low, high = self._edges(reference)
        text = f"expected {units.format_quantity(reference, unit)} (×{units.format_number(self.factor)})"
        return [plots.Claim(reference, text, band=(low, high))]


@dataclass(frozen=True, kw_only=True)
class _Bound(_Value):
    SIGN = ""

    @classmethod
    def read(cls, checker: Checker, expect: dict, where: tuple) -> dict[str, Any]:
        fields = super().read(checker, expect, where)
        if "factor" in expect and "floor" not in expect:
            checker.fail(
                where + ("factor",),
                "a bound's `factor` multiplies a `floor`; with a plain `value` write the bound itself",
            )
        return fields

    def _bound(self, reference: float) -> float:
        return reference * (self.factor or 1.0)

    def expected(self, floor: Floor | None = None) -> str:
        reference, text = self._reference(floor)
        scale = self.factor or 1.0
        if scale != 1:
            text = f"{units.format_number(scale)} × {text}"
            if reference is not None:
                text += f" = {units.format_quantity(self._bound(reference), self.unit)}"
        return f"{self.SIGN} {text}"

    def _off_by(self, value: float, reference: float, floor: Floor | None) -> str:
        bound = self._bound(reference)
        return ratio_text(value, bound, f"the bound {units.format_quantity(bound, self.unit)}")

    def _off_floor(self, ratio: float) -> str:
        bound = self._bound(1.0)
        return ratio_text(ratio, bound, f"the bound {units.format_number(bound)} × {self.floor}")

    def _claims(self, reference: float, unit: str) -> list[plots.Claim]:
        bound = self._bound(reference)
        return [plots.Claim(bound, f"bound {self.SIGN} {units.format_quantity(bound, unit)}")]


@dataclass(frozen=True, kw_only=True)
class AtMost(_Bound):
    """The mean is at most the bound (the whole interval below it to confirm)."""

    KIND = "at_most"
    KEYS = _KEYS
    SIGN = "≤"

    def _edges(self, reference: float) -> tuple[float | None, float | None]:
        return None, self._bound(reference)


@dataclass(frozen=True, kw_only=True)
class AtLeast(_Bound):
    """The mean is at least the bound (the whole interval above it to confirm)."""

    KIND = "at_least"
    KEYS = _KEYS
    SIGN = "≥"

    def _edges(self, reference: float) -> tuple[float | None, float | None]:
        return self._bound(reference), None
