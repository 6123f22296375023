"""A hypothesis's measurements over runs as a series per machine kind, and the runs where they changed.

A series holds one point per run that measured the hypothesis afresh (a run that only re-read a stored
measurement adds none; an attempt on a busy machine, a failed probe or a profiled run adds none): its
estimate and interval, the run, its commit and what the run said had changed. Measurements from
different machine kinds are different series: a move between machines is never a change in the code.

Change points are located by Apache Otava's method (perfkit.changepoints: E-divisive in windows, each
kept by Student's t-test of the segments beside it, on the log of a quantity that cannot be negative),
then judged by perfkit's own comparison of the two segments: the runs on each side are the units, and
Welch's interval of how far the later segment moved (a ratio for a positive quantity, else a difference)
must exclude no change and be material (MIN_CHANGE of the value, or for a quantity that may be zero or
negative, the runs' own typical half-interval). A change with one run after it so far is *pending*: one
more run confirms or clears it. The false-alarm rate per series (no change present) is measured by
simulation in tests/test_changes.py and stated in docs/history.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np

from perfkit import changepoints, stats
from perfkit.experiment.records.history import Entry, attempt, history
from perfkit.experiment.records.results import RunResults
from perfkit.experiment.records.verdict import Measured

MIN_POINTS = 6  # a series shorter than this has no change points to find
MIN_CHANGE = 0.05  # a positive quantity's change below 5% of its value is not reported
MIN_SEGMENT = 5  # runs on each side of a change that confirm it; fewer after the last: pending; else an episode


@dataclass(frozen=True)
class Point:
    run_id: str
    commit: str | None
    dirty: bool | None
    created: str  # UTC, ISO 8601
    verdict: str
    measured: Measured
    changed: str | None  # what the run said differed from the measurement before it


@dataclass(frozen=True)
class Series:
    hypothesis: str
    quantity: str  # "mean (ms)", "speedup", "exponent": the measured label and unit
    machine: str  # the machine kind, in words
    points: tuple[Point, ...]

    log: bool = False  # judged as factors: every value positive (times, rates, speedups, shares); set by `of`

    @staticmethod
    def of(hypothesis: str, quantity: str, machine: str, points: tuple[Point, ...]) -> Series:
        return Series(hypothesis, quantity, machine, points, all(p.measured.value > 0 for p in points))

    def values(self) -> list[float]:
        if self.log:
            return [math.log(p.measured.value) for p in self.points]
        return [p.measured.value for p in self.points]


@dataclass(frozen=True)
class Change:
    series: Series
    index: int  # of the first point after it
    pvalue: float  # the segments' t-test (Otava's)
    moved: stats.Estimate  # after vs before: a ratio (series.log) or a difference, Welch's interval over runs
    status: str  # "confirmed"; "pending" (fewer than MIN_SEGMENT runs after it, the last); "not confirmed"
    why: str  # in words: how far, or why it is not confirmed

    @property
    def first(self) -> Point:
        return self.series.points[self.index]

    @property
    def last_before(self) -> Point:
        return self.series.points[self.index - 1]

    def flipped(self) -> str | None:
        """'confirmed → refuted' when the verdict differs across the change, else None."""
        a, b = self.last_before.verdict, self.first.verdict
        return f"{a} → {b}" if a != b else None

    def severity(self) -> float:
        """How large the change is, comparable across series: |log ratio|, or the difference in the
        runs' own half-intervals."""
        if self.series.log:
            return abs(math.log(self.moved.value))
        return abs(self.moved.value) / max(_typical_half(self.series), 1e-300)

    def words(self) -> str:
        """'+15.2% [12.9, 17.6]', '-0.21 [-0.25, -0.17]': how far the later segment moved."""
        m = self.moved
        if not (math.isfinite(m.low) and math.isfinite(m.high)):  # pending: too few runs for an interval
            return _percent(m.value) if self.series.log else f"{m.value:+.3g}"
        if self.series.log:
            return f"{_percent(m.value)} [{_percent(m.low, sign=False)}, {_percent(m.high, sign=False)}]"
        return f"{m.value:+.3g} [{m.low:.3g}, {m.high:.3g}]"


def _percent(ratio: float, *, sign: bool = True) -> str:
    value = (ratio - 1.0) * 100.0
    return f"{value:+.1f}%" if sign else f"{value:.1f}"


def _typical_half(series: Series) -> float:
    halves = sorted((p.measured.high - p.measured.low) / 2.0 for p in series.points)
    return halves[len(halves) // 2]


def _machine(entry: Entry) -> str:
    return (entry.run.machine if entry.run and entry.run.machine else None) or "an unnamed machine"


def _point(entry: Entry, measured: Measured) -> Point:
    run = entry.run
    return Point(
        run_id=entry.run_id,
        commit=run.git_commit if run else None,
        dirty=run.git_dirty if run else None,
        created=run.created if run else "",
        verdict=entry.result.verdict,
        measured=measured,
        changed=entry.result.changed,
    )


def quantity(measured: Measured) -> str:
    return f"{measured.label} ({measured.unit})" if measured.unit else measured.label


def series_of(all_results: list[RunResults], hid: str | None = None) -> list[Series]:
    """Every series (of `hid` alone when given), by hypothesis, quantity and machine kind; the points of
    a measurement taken over several machines go to each machine's own series."""
    return series_of_history(history(all_results), hid)


def series_of_history(entries_by_id: dict[str, list[Entry]], hid: str | None = None) -> list[Series]:
    """`series_of` from the history already read (records/history.py)."""
    found: dict[tuple[str, str, str], list[Point]] = {}
    for key, entries in entries_by_id.items():
        if hid is not None and key != hid:
            continue
        for entry in entries:
            r = entry.result
            if attempt(entry) is not None or r.measured is None:
                continue
            if r.per_machine:
                for m in r.per_machine:
                    bounds = (m.measured.value, m.measured.low, m.measured.high) if m.measured else (math.nan,)
                    if all(map(math.isfinite, bounds)):
                        found.setdefault((key, quantity(m.measured), m.label), []).append(_point(entry, m.measured))
                continue
            if all(map(math.isfinite, (r.measured.value, r.measured.low, r.measured.high))):
                found.setdefault((key, quantity(r.measured), _machine(entry)), []).append(_point(entry, r.measured))
    return [Series.of(h, q, m, tuple(points)) for (h, q, m), points in sorted(found.items())]


def changes(series: Series, *, max_pvalue: float = changepoints.CHANGE_PVALUE) -> list[Change]:
    """The change points of one series, each judged by the segments beside it: Otava's points, then the
    weakest that perfkit's comparison does not confirm dropped, one at a time, its neighbours judged
    again over the segments it joined, until each left is confirmed or pending."""
    if len(series.points) < MIN_POINTS:
        return []
    located = changepoints.change_points(series.values(), max_pvalue=max_pvalue)
    indices, pvalues = [c.index for c in located], {c.index: c.pvalue for c in located}
    while True:
        judged = _judge_all(series, indices, pvalues)
        weak = [c for c in judged if c.status == "not confirmed"]
        if not weak:
            return judged
        indices.remove(min(weak, key=lambda c: c.severity()).index)


def _judge_all(series: Series, indices: list[int], pvalues: dict[int, float]) -> list[Change]:
    edges = [0, *indices, len(series.points)]
    rho = _lag1_within(series.values(), edges)
    return [_judged(series, edges, k, pvalues[edges[k + 1]], rho) for k in range(len(indices))]


def _lag1_within(values: list[float], edges: list[int]) -> float:
    """The lag-1 autocorrelation of the runs around their segments' means (0 when it cannot be told)."""
    x = np.asarray(values, dtype=float)
    residual = np.concatenate([x[a:b] - x[a:b].mean() for a, b in zip(edges, edges[1:]) if b > a])
    if residual.size < 4 or float(residual.var()) == 0.0:
        return 0.0
    return float(np.dot(residual[:-1], residual[1:]) / np.dot(residual, residual))


def _judged(series: Series, edges: list[int], k: int, pvalue: float, rho: float) -> Change:
    """The change at edges[k + 1], between the segments beside it (`edges`: the series' segment bounds)."""
    raw = [p.measured.value for p in series.points]
    index = edges[k + 1]
    before, after, last = raw[edges[k] : index], raw[index : edges[k + 2]], edges[k + 2] == len(raw)

    def change(moved, status, why):
        return Change(series, index, pvalue, moved, status, why)

    if len(before) < MIN_SEGMENT or len(after) < MIN_SEGMENT:
        if series.log:  # the geometric means' ratio, without an interval: too few runs for one
            far = math.exp(float(np.mean(np.log(after)) - np.mean(np.log(before))))
        else:
            far = float(np.mean(after) - np.mean(before))
        moved = stats.Estimate(far, -math.inf, math.inf, log=series.log)
        if len(after) < MIN_SEGMENT and len(before) >= MIN_SEGMENT and last:
            return change(moved, "pending", f"{len(after)} run{'s' if len(after) > 1 else ''} after it so far; "
                          f"{MIN_SEGMENT} tell")  # fmt: skip
        return change(moved, "not confirmed", f"an episode of {min(len(before), len(after))} runs")
    moved = stats.between_groups(before, after, log=series.log, rho=rho)
    nothing = 1.0 if series.log else 0.0
    if moved.low <= nothing <= moved.high:
        return change(moved, "not confirmed", "the runs' interval of it includes no change")
    if series.log and abs(moved.value - 1.0) < MIN_CHANGE:
        return change(moved, "not confirmed", f"smaller than {MIN_CHANGE:.0%}")
    if not series.log and abs(moved.value) < _typical_half(series):
        return change(moved, "not confirmed", "smaller than a run's own half-interval")
    return change(moved, "confirmed", f"over {len(before)} runs before and {len(after)} after")


def all_changes(all_results: list[RunResults], *, since: str | None = None) -> list[Change]:
    """Every change point across the ledger, confirmed and pending ones, the most severe first; with
    `since` (a run id: see `since_run`), those whose first run after the change is that run or later."""
    out = []
    for s in series_of(all_results):
        for c in changes(s):
            if c.status != "not confirmed" and (since is None or c.first.run_id >= since):
                out.append(c)
    return sorted(out, key=lambda c: (c.status != "confirmed", -c.severity(), c.series.hypothesis, c.index))


def since_run(all_results: list[RunResults], since: str) -> str | None:
    """The run id `since` means: a run id itself; a date or time in UTC (2026-12-07, 2026-12-07T12:00), as
    run ids are; a commit (7 to 40 hex digits): the first run measured at it. None: it names none of these."""
    text = since.strip()
    if len(text) == 15 and text[8] == "-" and (text[:8] + text[9:]).isdigit():
        return text
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        when = None
    if when is not None:
        if when.tzinfo is not None:
            when = when.astimezone(UTC).replace(tzinfo=None)
        return when.strftime("%Y%m%d-%H%M%S")
    if 7 <= len(text) <= 40 and all(ch in "0123456789abcdef" for ch in text.lower()):
        runs = sorted(r.run_id for r in all_results if (r.git_commit or "").startswith(text.lower()))
        return runs[0] if runs else None
    return None
