"""Change points in a series of runs: where a measurement moved, by Apache Otava's method. No I/O.

E-divisive (Matteson and James 2014) locates each candidate; Student's two-sample t-test of the segments
beside it keeps it; Otava's split (sliding windows) and merge (the weakest dropped, its neighbours tested
again) make it work on long series (Fleming et al., "Hunter: Using Change Point Detection to Hunt for
Performance Regressions", ICPE 2023). Whether a located change is one perfkit reports is judged with the
intervals of perfkit.stats (experiment/records/series.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from perfkit.stats import t_cdf

#: Apache Otava's defaults (the method of Fleming et al., "Hunter: Using Change Point Detection to Hunt for
#: Performance Regressions", ICPE 2023): windows of 50 points, a change kept at p <= 0.001
CHANGE_WINDOW = 50
CHANGE_PVALUE = 0.001


@dataclass(frozen=True)
class ChangePoint:
    """A change in a series at `index` (the first point after it), between the segments beside it."""

    index: int
    pvalue: float  # Student's two-sample t-test of the two segments, as Otava computes it
    before: float  # the segments' means
    after: float
    qhat: float = 0.0  # the E-divisive statistic that placed it

    def magnitude(self) -> float:
        """The larger of the forward and backward relative change (Otava's change magnitude); 0 at a zero mean."""
        forward = self.after / self.before - 1.0 if self.before else 0.0
        backward = self.before / self.after - 1.0 if self.after else 0.0
        return max(abs(forward), abs(backward))


def _segments_test(left: np.ndarray, right: np.ndarray) -> tuple[float, float, float]:
    """(p, mean left, mean right): Student's pooled two-sample t-test, two-sided, with each segment's
    standard deviation taken without Bessel's correction, as Otava passes it to scipy's
    ttest_ind_from_stats (kept so that the change points are Otava's on the same series)."""
    n1, n2 = left.size, right.size
    m1, m2 = float(left.mean()), float(right.mean())
    if n1 + n2 <= 2:
        return 1.0, m1, m2
    s1 = float(left.std()) if n1 >= 2 else 0.0
    s2 = float(right.std()) if n2 >= 2 else 0.0
    df = n1 + n2 - 2
    pooled = ((n1 - 1) * s1 * s1 + (n2 - 1) * s2 * s2) / df
    se = math.sqrt(pooled * (1.0 / n1 + 1.0 / n2))
    if se == 0.0:
        return (0.0 if m1 != m2 else 1.0), m1, m2
    t = abs(m1 - m2) / se
    return min(1.0, 2.0 * (1.0 - t_cdf(t, df))), m1, m2


def _best_split(x: np.ndarray, start: int, end: int) -> tuple[int, float]:
    """E-divisive (Matteson and James 2014, distances to the power 1): the split tau in start < tau < end
    maximising Q(x[start:tau], x[tau:kappa]) over kappa <= end, and that Q."""
    d = np.abs(x[start:end, None] - x[None, start:end])
    total = np.zeros((d.shape[0] + 1, d.shape[1] + 1))
    total[1:, 1:] = d.cumsum(0).cumsum(1)  # total[a, b]: the sum of d[:a, :b]

    def block(a, b, c, e):
        return total[b, e] - total[a, e] - total[b, c] + total[a, c]

    best, at = -math.inf, start + 1
    size = end - start
    for tau in range(1, size):
        n = tau
        within_x = block(0, tau, 0, tau) / 2.0
        for kappa in range(tau + 1, size + 1):
            m = kappa - tau
            q = 2.0 / (m + n) * block(0, tau, tau, kappa)
            if n > 1:
                q -= 2.0 * m / ((m + n) * (n - 1)) * within_x
            if m > 1:
                q -= 2.0 * n / ((m + n) * (m - 1)) * block(tau, kappa, tau, kappa) / 2.0
            if q > best:
                best, at = q, start + tau
    if best < 0.0 and size > 2:  # as Otava's argmax over its matrix of Q, which holds zeros below the diagonal
        best, at = 0.0, start + 2
    return at, best


def _bounds(indices: list[int], size: int) -> list[tuple[int, int]]:
    edges = [0, *sorted(indices), size]
    return [(a, b) for a, b in zip(edges, edges[1:]) if b > a]


def _tested(x: np.ndarray, index: int, qhat: float, indices: list[int]) -> ChangePoint:
    """The change at `index` tested between the segments beside it (`indices`: the other change points)."""
    below = max([0, *(i for i in indices if i < index)])
    above = min([x.size, *(i for i in indices if i > index)])
    p, m1, m2 = _segments_test(x[below:index], x[index:above])
    return ChangePoint(index, p, m1, m2, qhat)


def _divisive(x: np.ndarray, max_pvalue: float) -> list[ChangePoint]:
    """Change points of a whole (short) series: split the segment with the largest Q while significant."""
    found: list[ChangePoint] = []
    while True:
        candidates = [_best_split(x, a, b) for a, b in _bounds([c.index for c in found], x.size) if b - a > 1]
        if not candidates:
            return found
        index, qhat = max(candidates, key=lambda c: c[1])
        point = _tested(x, index, qhat, [c.index for c in found])
        if not point.pvalue <= max_pvalue:
            return found
        found = sorted([*found, point], key=lambda c: c.index)


def change_points(
    values: Sequence[float],
    *,
    window: int = CHANGE_WINDOW,
    max_pvalue: float = CHANGE_PVALUE,
    min_magnitude: float = 0.0,
) -> list[ChangePoint]:
    """The change points of a series (one value per run, in run order), by Apache Otava's method:

    1. split: E-divisive in sliding windows of `window` points (half a window apart), each kept at a
       first-pass level 10x `max_pvalue` (2x above 0.05), their union being the weak change points;
    2. merge: the weakest (the largest p-value, or once all pass, the smallest magnitude) is dropped
       while it fails `max_pvalue` or `min_magnitude`, its neighbours tested again without it.

    Each p-value is Student's t-test of the two segments beside the point. Against Otava 0.8.0's
    compute_change_points on the same series: tests/test_changes.py."""
    x = np.asarray(values, dtype=float)
    if window < 2 or not np.all(np.isfinite(x)):
        raise ValueError("change_points needs window >= 2 and finite values")
    first = max_pvalue * 10 if max_pvalue < 0.05 else (max_pvalue * 2 if max_pvalue < 0.5 else max_pvalue)
    weak: dict[int, float] = {}
    start, step = 0, window // 2
    while start < x.size:
        end = min(start + window, x.size)
        found = _divisive(x[start:end], first)
        for c in found:
            weak.setdefault(start + c.index, c.qhat)
        start = max(start + found[-1].index if found else 0, start + step)
    points = [_tested(x, i, weak[i], list(weak)) for i in sorted(weak)]
    while points:
        weakest = max(points, key=lambda c: c.pvalue)
        if weakest.pvalue < max_pvalue:
            weakest = min(points, key=lambda c: c.magnitude())
            if weakest.magnitude() > min_magnitude:
                return points
        at = points.index(weakest)
        del points[at]
        indices = [c.index for c in points]
        for i in (at - 1, at):  # the neighbours: their segments grew
            if 0 <= i < len(points):
                points[i] = _tested(x, points[i].index, points[i].qhat, indices)
    return points
