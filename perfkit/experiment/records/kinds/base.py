"""What every expectation kind shares: the common keys, reading samples, comparing an interval.

A kind is one class (a frozen dataclass) that owns its schema (`KEYS` and `parse`), its judging
(`judge`), its expected text (`expected`) and its plot (`plot`). The helpers here are the parts
they share: picking the records a claim reads, turning them into samples or saying why they
cannot be judged, and comparing an interval with an allowed range.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, ClassVar

from perfkit import stats, units
from perfkit.errors import UserError
from perfkit.experiment.records import replicates
from perfkit.experiment.records.checker import Checker, Key, check_scalars, optional, required
from perfkit.experiment.records.plots import process_label
from perfkit.experiment.records.verdict import Floor, Inconclusive, Judgement, Measured, Point, Verdict
from perfkit.samples import MAX_SAMPLES

NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:/-]*$")
DEFAULT_MIN_SAMPLES = 5
COMMON_KEYS = {
    "kind": required("which expected cost this is; the other keys depend on it"),
    "at": optional(
        "which recorded point the claim is about, as `{param: value}`, when the probe records the metric at several"
    ),
    "min_samples": optional(f"fewer samples than this give inconclusive (default {DEFAULT_MIN_SAMPLES})"),
}


@dataclass(frozen=True, kw_only=True)
class Expect:
    """The expected cost of a hypothesis. Subclasses are the kinds; `kind` is the record's word."""

    KIND: ClassVar[str]
    KEYS: ClassVar[dict[str, Key]]  # the kind's own keys

    kind: str
    at: dict[str, Any] | None = None  # which recorded point, when there are several
    min_samples: int = DEFAULT_MIN_SAMPLES

    # ------------------------------------------------------------ schema

    @classmethod
    def parse(cls, checker: Checker, expect: dict, where: tuple) -> Expect | None:
        """The expectation in `expect` (the record's mapping), or None after adding its errors."""
        errors_before = len(checker.errors)
        checker.keys(expect, where, {**COMMON_KEYS, **cls.KEYS})
        fields = cls.read(checker, expect, where)
        fields["min_samples"] = checker.integer(expect, "min_samples", where, low=1, high=MAX_SAMPLES)
        if "at" in expect:
            at = checker.mapping(expect["at"], where + ("at",))
            if at is not None:
                check_scalars(checker, at, where + ("at",))
                fields["at"] = dict(at)
        if len(checker.errors) > errors_before:
            return None
        return cls(kind=cls.KIND, **{k: v for k, v in fields.items() if v is not None})

    @classmethod
    def read(cls, checker: Checker, expect: dict, where: tuple) -> dict[str, Any]:
        """The kind's own fields from the record, adding an error for each bad one."""
        raise NotImplementedError

    @staticmethod
    def names(checker: Checker, expect: dict, where: tuple, *keys: str) -> dict[str, str | None]:
        return {k: checker.string(expect, k, where, pattern=NAME, what="a metric or parameter name") for k in keys}

    # ------------------------------------------------------------ meaning

    def metrics(self) -> tuple[str, ...]:
        """Every metric name the probe must record for this expectation."""
        raise NotImplementedError

    def summarized(self) -> tuple[str, ...]:
        """The metrics a result summarizes next to the verdict (by default, those it reads)."""
        return self.metrics()

    def expected(self, floor: Floor | None = None) -> str:
        """The expectation in words; with the floor's measured value once it is known."""
        raise NotImplementedError

    def edges(self) -> tuple[float | None, float | None]:
        """The (at least, at most) the measured quantity is compared with, in its unit (None: no such edge)."""
        raise NotImplementedError

    def judge(self, points: list[Point], *, confidence: float = stats.CONFIDENCE) -> Judgement:
        """The verdict from every record of the probe's executions, at `confidence`; raises Inconclusive."""
        raise NotImplementedError

    def plot(self, fig, judgement: Judgement, points: list[Point]) -> None:
        """Draw the measured evidence against the claim on `fig` (title and text are done)."""
        raise NotImplementedError


# ---------------------------------------------------------------- choosing records


def matches(at: dict[str, Any], selector: dict[str, Any] | None) -> bool:
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


def candidates(points: list[Point], name: str, selector: dict | None) -> list[Point]:
    found = [p for p in points if p.name == name and matches(p.at, selector)]
    for p in found:
        if p.duplicated:
            raise Inconclusive(
                f"{name} was recorded {p.records} times at {p.where()} in {len(p.replicates)} entries; "
                "record it once per point (or give each record its own `at`)"
            )
    if not found:
        names = sorted({p.name for p in points})
        where = f" at {', '.join(f'{k}={v}' for k, v in selector.items())}" if selector else ""
        recorded = f" (it recorded: {', '.join(names)})" if names else ""
        raise Inconclusive(f"probe recorded no samples for {name}{where}{recorded}")
    return found


def one(points: list[Point], name: str, selector: dict | None) -> Point:
    found = candidates(points, name, selector)
    if len(found) > 1:
        wheres = "; ".join(p.where() for p in found)
        raise Inconclusive(f"{name} was recorded {len(found)} times ({wheres}); add expect.at to choose one")
    return found[0]


def same_point(points: list[Point], name: str, at: dict[str, Any]) -> Point:
    """The record of `name` measured where another record was (same `at`)."""
    found = [p for p in points if p.name == name and p.at == at]
    if len(found) != 1:
        where = ", ".join(f"{k}={v}" for k, v in sorted(at.items())) or "the same point"
        if not found:
            raise Inconclusive(f"probe recorded no samples for {name} at {where}")
        raise Inconclusive(f"{name} was recorded {len(found)} times at {where}")
    return found[0]


def machines_of(points: list[Point]) -> tuple[str, ...] | None:
    """The machine each replicate ran on, for estimates that combine points replicate by replicate
    (replicate r of every point is one process): the points must agree, or the pairing is wrong."""
    labels = {p.machines for p in points}
    if len(labels) == 1:
        return next(iter(labels))
    if None in labels:  # some records say no machine (before format 10): one machine, as the others can't say
        return None
    raise Inconclusive(
        f"the replicates of {', '.join(sorted({p.name for p in points}))} ran on different machines "
        "at different points; each replicate must measure every point on one machine"
    )


def samples(point: Point, unit: str | None, min_samples: int) -> list[list[float]]:
    """A point's samples per replicate, in `unit`, or why they cannot be judged."""
    every = point.samples()
    if not every:
        raise Inconclusive(f"probe recorded no samples for {point.name}")
    bad = sum(1 for s in every if not math.isfinite(s))
    if bad:
        raise Inconclusive(f"{bad} of {len(every)} samples of {point.name} are NaN or infinite")
    if units.dimension(point.unit) in units.LOWER_IS_FASTER and min(every) < 0:
        raise UserError(f"{point.name} has negative durations ({min(every):g} {point.unit}): the probe mis-measured")
    fewest = min(len(r) for r in point.replicates)
    if fewest < min_samples:
        per = "" if len(point.replicates) == 1 else " in a replicate"
        raise Inconclusive(
            f"{point.name} has {fewest} samples{per}, fewer than the {min_samples} needed "
            "(raise the probe's repetitions or lower expect.min_samples)"
        )
    return [units.convert(list(r), point.unit, unit) if unit else list(r) for r in point.replicates]


def measured(
    label: str,
    unit: str | None,
    est: stats.Estimate,
    *,
    scale: float = 1.0,
    between: list[list[float]] | None = None,
    paired: str | None = None,
) -> Measured:
    """The verdict's measured quantity (times `scale`, e.g. 100 for a share in %) and what it rests on,
    with the spread of its unit estimates, from which a later run forecasts what deciding it takes;
    `paired`: how a comparison's arms were paired (`pairing`)."""
    finite = math.isfinite(est.spread)
    return Measured(
        label=label,
        unit=unit,
        value=est.value * scale,
        low=est.low * scale,
        high=est.high * scale,
        replicates=est.replicates,
        samples=est.n,
        between=stats.between_share(between) if between is not None else None,
        confidence=est.confidence,
        spread=(est.spread if est.log else est.spread * scale) if finite else None,
        log=est.log,
        machines=est.machines if est.machines > 1 else None,
        between_machines=est.between_machines,
        paired=paired,
    )


def pairing(est: stats.Estimate, what: str) -> str:
    """'arms paired within each of 5 processes (each one's ratio of its arms' means), pooled over them': how
    a comparison was estimated, so that a reader knows load and a process's own state hit both sides alike."""
    if est.replicates == 1:
        return f"arms paired within one process ({what}, over batches of its samples)"
    return f"arms paired within each of {est.replicates} processes ({what}), pooled over them"


def _kind(warning: str) -> str:
    """A warning without its figures: what makes two warnings of different points the same warning."""
    return re.sub(r"\([^)]*\)|\d+", "", warning)


def warnings_for(labelled: list[tuple[str, list[list[float]]]]) -> tuple[str, ...]:
    """What could make the labelled sets of replicates mislead: one line per kind of warning, with the
    labels it holds for ('at 4 of 6: ...') and its figures when they are the same everywhere."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for label, reps in labelled:
        for w in stats.warnings(reps):
            groups.setdefault(_kind(w), []).append((label, w))
    out = []
    for items in groups.values():
        if len(items) == 1:
            out.append(f"{items[0][0]}: {items[0][1]}")
            continue
        texts = {w for _, w in items}
        said = items[0][1] if len(texts) == 1 else re.sub(r" \([^)]*\)", "", items[0][1])
        labels = ", ".join(label for label, _ in items)
        out.append(f"{said} (at {len(items)} of {len(labelled)}: {labels})")
    return tuple(out)


def mean(values) -> float:
    return sum(values) / len(values)


def positive(replicates: list[list[float]]) -> bool:
    """Whether a quantity cannot be negative: no sample below zero, no process's mean at zero (as
    stats.mean_estimate decides where its interval is taken)."""
    return all(min(r) >= 0 and mean(r) > 0 for r in replicates)


def apart_warning(what: str, estimates: list[float], unit: str | None, *, log: bool) -> tuple[str, ...]:
    """The warning that one process stands apart and drives the spread between processes, when one does
    (stats.apart): "process 2's mean (12 ms) is 6.2x the others' (1.8 to 2.1 ms): ...". `estimates` are
    each process's own estimate of the verdict's quantity, in replicate order; `log` compares them as
    factors (positive quantities: times, rates, ratios), else as differences (exponents, differences)."""
    found = stats.apart(estimates, log=log)
    if found is None:
        return ()
    i, shrink = found
    others = [e for j, e in enumerate(estimates) if j != i]
    low, high = min(others), max(others)
    said = (
        units.format_quantity(low, unit)
        if low == high
        else f"{units.format_number(low)} to {units.format_quantity(high, unit)}"
    )
    if log:
        factor = estimates[i] / math.exp(mean([math.log(e) for e in others]))
        how = (
            f"{units.format_factor(factor)} the others'"
            if factor >= 1
            else f"{units.format_factor(1 / factor)} below the others'"
        )
    else:
        how = "apart from the others'"
    narrower = (
        "the others agree exactly"
        if math.isinf(shrink)
        else f"their spread is {units.format_factor(shrink)} smaller without it"
    )
    return (
        f"{process_label(i)}'s {what} ({units.format_quantity(estimates[i], unit)}) is {how} ({said}): it drives "
        f"the spread between processes ({narrower}); look at what differed in that process",
    )


# ---------------------------------------------------------------- comparing


def bounds(
    est: stats.Estimate, *, at_least: float | None, at_most: float | None
) -> tuple[Verdict, str | None, int | None]:
    """Compare an interval with an allowed range: inside, outside, or straddling an edge.

    A straddle says what would decide it (the replicate policy's forecast, perfkit/experiment/
    replicates.py); the third value is that number of replicates (None when confirmed, refuted or
    too close to the edge to decide at this noise).
    """
    lo_ok = at_least is None or est.low >= at_least
    hi_ok = at_most is None or est.high <= at_most
    if lo_ok and hi_ok:
        return Verdict.CONFIRMED, None, None
    if (at_least is not None and est.high < at_least) or (at_most is not None and est.low > at_most):
        return Verdict.REFUTED, None, None
    if at_least is not None and est.value < at_least:  # outside: only the edge on its side can be cleared
        edges = [at_least]
    elif at_most is not None and est.value > at_most:
        edges = [at_most]
    else:  # inside: every edge the interval crosses must be cleared
        edges = [e for e, ok in ((at_least, lo_ok), (at_most, hi_ok)) if e is not None and not ok]
    why, needed = replicates.forecast(est, edges)
    return Verdict.INCONCLUSIVE, why, needed


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


def range_text(at_least: float | None, at_most: float | None, fmt) -> str:
    parts = []
    if at_least is not None:
        parts.append(f"≥ {fmt(at_least)}")
    if at_most is not None:
        parts.append(f"≤ {fmt(at_most)}")
    return " and ".join(parts)


def off_range(value: float, at_least: float | None, at_most: float | None, fmt, what: str) -> str:
    """How far a ratio is from the claimed minimum or maximum (the nearer one when both are given)."""
    use_min = at_least is not None and (
        at_most is None or value < at_least or (value <= at_most and value / at_least < at_most / value)
    )
    if use_min:
        return ratio_text(value, at_least, f"the claimed minimum {what} {fmt(at_least)}")
    return ratio_text(value, at_most, f"the claimed maximum {what} {fmt(at_most)}")


def read_unit(checker: Checker, expect: dict, where: tuple) -> str | None:
    """The record's `unit`, when there is one and perfkit knows it."""
    if "unit" not in expect:
        return None
    unit = expect["unit"]
    if not units.is_unit(unit):
        checker.fail(where + ("unit",), f"unknown unit {unit!r}; expected one of: {', '.join(units.KNOWN_UNITS)}")
        return None
    return unit


def read_range(checker: Checker, expect: dict, where: tuple, *, positive: bool) -> dict[str, float | None]:
    """`at_least` and/or `at_most`, at least one of them."""
    fields = {k: checker.number(expect, k, where, positive=positive) for k in ("at_least", "at_most")}
    if "at_least" not in expect and "at_most" not in expect:
        checker.missing(where, "at_least", "give `at_least` and/or `at_most`")
    return fields
