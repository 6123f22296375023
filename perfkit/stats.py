"""Point estimates and 95% intervals, with the process as the unit of replication. No I/O.

This module is the one path for every interval perfkit shows (verdicts, metric summaries, plots,
`perfkit show`, a notebook's record summary, the engine benchmarks, bandwidth figures).

Why it works this way:
- Samples from one process are not independent draws of what the next run will see. Allocator
  state, page faults, thread pools and address layout differ between processes, and a process
  drifts. So every estimate (a mean, a ratio, an exponent) is computed once per replicate (one
  kernel process each) and the interval comes from the spread of those R estimates: a Student
  t-interval with R - 1 degrees of freedom. Each replicate estimate averages many samples, so it
  is close to normal and the t-interval keeps its coverage at small R, where a bootstrap over R
  values covers far less than it claims (about 70% at R = 3). More samples per process never
  narrow it below the between-process spread; more processes do.
- With one replicate there is no between-process spread to see. The interval then comes from
  batch means: the samples in time order are cut into contiguous batches, and the batch
  estimates are the units. Neighbouring samples are correlated (lag-1 0.5-0.8 was measured here);
  batches of many samples are nearly independent, so the interval does not take correlated
  samples for independent ones. `Estimate.replicates == 1` says it rests on one process.
- Speedups are pooled on the log scale (a geometric mean of per-replicate ratios): a ratio is
  symmetric there, 2x faster and 2x slower are equally far from 1x.
- A quantity that cannot be negative (a time, a rate, a share: no sample below zero) keeps its mean,
  but its interval is the spread of the log unit estimates placed around it: above zero, wider above
  than below, as such units are skewed (tests/test_stats.py: its coverage against known truth). A
  difference (an overhead per pair, on - off) has negative samples: its interval may straddle zero.
- Machines are a level above processes. When a measurement's replicates ran on several machines
  (`machines=`, one label per replicate), each machine's processes are averaged first and the
  interval is a t-interval over the M machine means with M - 1 degrees of freedom: the pool's mean,
  with the between-machine spread in it (the classic nested design; a balanced spread of replicates
  over machines makes it exact under normal machine and process effects, tests/test_machines.py).
  Two machines give a wide interval: one difference between machines is all there is to see.
  `Estimate.between_machines` is the machine-level standard deviation left after the processes'
  own spread is taken out (method of moments), as a share of the estimate.
- There is no resampling: time and memory are linear in the number of samples, with no seed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.95
BATCHES = 10  # batch means for one replicate: this many units
MIN_BATCH = 3  # ... of at least this many samples each; fewer samples: each sample is a unit
#: above this share of the variance between processes, more processes (not samples) help
BETWEEN_DOMINATES = 0.5
AUTOCORRELATED = 0.5  # lag-1 autocorrelation above which one process's samples are not independent


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its confidence interval, and what the interval rests on."""

    value: float
    low: float
    high: float
    replicates: int = 1  # processes
    units: int = 0  # independent units the interval was computed from (replicates, or batches of one)
    n: int = 0  # samples in all
    spread: float = 0.0  # standard deviation of the unit estimates (on the log scale when pooled there)
    log: bool = False  # the interval is on the log scale (ratios, positive quantities); `spread` is there too
    confidence: float = CONFIDENCE
    machines: int = 1  # machines the replicates ran on; above 1, the interval's units are machine means
    between_machines: float | None = None  # the machines' own spread, as a share of the estimate (None: one)


@dataclass(frozen=True)
class Summary:
    n: int
    mean: float
    std: float
    min: float
    median: float
    max: float


Replicates = Sequence[Sequence[float]]


def is_clean(samples: Sequence[float]) -> bool:
    """True when every sample is a finite number."""
    return all(math.isfinite(s) for s in samples)


def summarize(samples: Sequence[float]) -> Summary:
    data = np.asarray(samples, dtype=float)
    return Summary(
        n=int(data.size),
        mean=float(data.mean()),
        std=float(data.std(ddof=1)) if data.size > 1 else 0.0,
        min=float(data.min()),
        median=float(np.median(data)),
        max=float(data.max()),
    )


# ---------------------------------------------------------------- Student's t


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _incomplete_beta(a: float, b: float, x: float) -> float:
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom."""
    tail = 0.5 * _incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The t value below which a share `p` of Student's t (df degrees of freedom) lies."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must lie in (0, 1), got {p}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        high *= 2.0
    for _ in range(200):
        mid = 0.5 * (low + high)
        if t_cdf(mid, df) < p:
            low = mid
        else:
            high = mid
        if high - low < 1e-12 * max(1.0, high):
            break
    return 0.5 * (low + high)


# ---------------------------------------------------------------- the one interval


def _batches(n: int) -> list[slice]:
    """Contiguous batches of one process's samples (all samples used; sizes differ by at most one)."""
    count = min(BATCHES, n, max(5, n // MIN_BATCH))  # no jump in width as n grows: never fewer than 5 units
    edges = np.linspace(0, n, count + 1).round().astype(int)
    return [slice(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]


def interval(
    units: Sequence[float], *, confidence: float = CONFIDENCE, log: bool = False, centre: float | None = None
) -> tuple[float, float, float]:
    """(estimate, low, high): a t-interval on independent unit estimates (replicates or batches).

    `log` takes the interval on the log scale: around the units' geometric mean (ratios), or around
    `centre` when given (a positive quantity's mean), so it stays above zero. One unit gives an
    infinite interval. `centre`, when given, is the point estimate the interval is placed around
    (one process's batches: its samples' own mean, which a mean of unequal batches is not).
    """
    data = np.asarray(units, dtype=float)
    if data.size == 0:
        raise ValueError("no samples")
    if log:
        if (data <= 0).any():
            raise ValueError("a ratio pooled on the log scale must be positive")
        data = np.log(data)
    spread_centre = float(data.mean())
    if centre is not None:
        spread_centre = math.log(centre) if log else float(centre)
    centre = spread_centre
    if data.size < 2:
        half = math.inf
    else:
        half = t_quantile(0.5 + confidence / 2.0, data.size - 1) * float(data.std(ddof=1)) / math.sqrt(data.size)
    low, high = centre - half, centre + half
    if log:
        return (
            math.exp(centre),
            math.exp(low) if math.isfinite(low) else 0.0,
            math.exp(high) if math.isfinite(high) else math.inf,
        )
    return centre, low, high


def _replicates(replicates: Replicates) -> list[np.ndarray]:
    out = [np.asarray(r, dtype=float) for r in replicates]
    out = [r for r in out if r.size]
    if not out:
        raise ValueError("no samples")
    return out


def _kept(replicates: Replicates, machines: Sequence[str] | None) -> Sequence[str] | None:
    """The machine labels of the replicates `_replicates` keeps (those with samples)."""
    if machines is None or len(machines) != len(replicates):
        return machines  # a mismatch is said by _groups
    return [m for r, m in zip(replicates, machines) if len(r)]


def _estimate(units: list[float], replicates: int, samples: list[np.ndarray], *, confidence: float, log: bool,
              centre: float | None = None, machines: Sequence[str] | None = None) -> Estimate:  # fmt: skip
    per_process = np.log(np.asarray(units, dtype=float)) if log else np.asarray(units, dtype=float)
    groups = _groups(machines, len(units)) if replicates > 1 else []
    nested = len(groups) > 1
    scaled = per_process
    if nested:  # each machine's processes averaged first: the machine means are the interval's units
        scaled = np.array([per_process[g].mean() for g in groups])
        units = [math.exp(m) for m in scaled] if log else list(scaled)
    value, low, high = interval(units, confidence=confidence, log=log, centre=centre)
    share = None
    if nested:
        sd = _between_machines(per_process, groups)
        share = math.expm1(sd) if log else (sd / abs(value) if value else math.inf)
    return Estimate(
        value=value,
        low=low,
        high=high,
        replicates=replicates,
        units=len(units),
        n=int(sum(r.size for r in samples)),
        spread=float(scaled.std(ddof=1)) if scaled.size > 1 else math.inf,
        log=log,
        confidence=confidence,
        machines=len(groups) if nested else 1,
        between_machines=share,
    )


def _groups(machines: Sequence[str] | None, count: int) -> list[list[int]]:
    """The replicates' indices per machine, machines in the order first seen (none: no labels)."""
    if machines is None:
        return []
    if len(machines) != count:
        raise ValueError(f"{len(machines)} machine labels for {count} replicates")
    found: dict[str, list[int]] = {}
    for i, machine in enumerate(machines):
        found.setdefault(machine, []).append(i)
    return list(found.values())


def _mean_of_machines(units: list[float], machines: Sequence[str] | None) -> float:
    """The mean of the units; over several machines, the mean of each machine's mean (each weighs the same)."""
    groups = _groups(machines, len(units))
    return float(np.mean([np.mean([units[i] for i in g]) for g in groups] if len(groups) > 1 else units))


def _between_machines(scaled: np.ndarray, groups: list[list[int]]) -> float:
    """The standard deviation between machines, the processes' own spread taken out: one-way
    random effects on the process estimates, sqrt(max(0, (MSB - MSW) / n0)); with one process per
    machine there is no MSW, and all of the machine means' spread is counted as the machines'."""
    sizes = np.array([len(g) for g in groups], dtype=float)
    means = np.array([scaled[g].mean() for g in groups])
    total, k = sizes.sum(), len(groups)
    grand = float((sizes * means).sum() / total)
    msb = float((sizes * (means - grand) ** 2).sum() / (k - 1))
    inside = total - k
    msw = float(sum(((scaled[g] - scaled[g].mean()) ** 2).sum() for g in groups) / inside) if inside else 0.0
    n0 = (total - (sizes**2).sum() / total) / (k - 1)
    return math.sqrt(max(0.0, (msb - msw) / n0))


def _positive(samples: list[np.ndarray], units: list[float]) -> bool:
    """A quantity that cannot be negative: every sample at least zero and every unit estimate above it."""
    return all(r.min() >= 0 for r in samples) and min(units) > 0


def mean_estimate(
    replicates: Replicates, *, confidence: float = CONFIDENCE, machines: Sequence[str] | None = None
) -> Estimate:
    """The mean over processes (each replicate's mean weighs the same; over machines, each machine's
    mean) and its interval; on the log scale around that mean when the quantity cannot be negative."""
    reps, machines = _replicates(replicates), _kept(replicates, machines)
    if len(reps) > 1:
        units = [float(r.mean()) for r in reps]
        centre = _mean_of_machines(units, machines)
    else:
        units = [float(reps[0][s].mean()) for s in _batches(reps[0].size)]
        centre = float(reps[0].mean())
    log = _positive(reps, units)
    return _estimate(units, len(reps), reps, confidence=confidence, log=log, centre=centre, machines=machines)


def mean_interval(samples: Sequence[float], *, confidence: float = CONFIDENCE) -> Estimate:
    """The mean of one process's samples, in time order, and its batch-means interval."""
    return mean_estimate([samples], confidence=confidence)


def ratio_estimate(numerator: Replicates, denominator: Replicates, *, paired: bool, log: bool = True,
                   confidence: float = CONFIDENCE, machines: Sequence[str] | None = None) -> Estimate:  # fmt: skip
    """mean(numerator) / mean(denominator) per replicate (or batch), pooled over them.

    Paired samples (a phase and the step it belongs to) are cut into the same batches; unpaired
    arms of one process (taken alternately, in time order) into batches of equal count. `log`
    pools on the log scale (speedups: a geometric mean); otherwise (a share) the estimate is the
    units' mean and its interval is on the log scale around it when nothing in it can be negative.
    """
    num, den, machines = _replicates(numerator), _replicates(denominator), _kept(numerator, machines)
    if len(num) != len(den):
        raise ValueError(f"the two sides have {len(num)} and {len(den)} replicates")
    if paired and any(a.size != b.size for a, b in zip(num, den)):
        raise ValueError("paired samples differ in length")
    if any(b.mean() == 0 for b in den):
        raise ValueError("the denominator's mean is zero")
    if len(num) > 1:
        units = [float(a.mean() / b.mean()) for a, b in zip(num, den)]
    else:
        a, b = num[0], den[0]
        if paired:
            units = [float(a[s].sum() / b[s].sum()) for s in _batches(a.size) if b[s].sum() != 0]
        else:
            count = min(len(_batches(a.size)), len(_batches(b.size)))
            sa = np.array_split(a, count)
            sb = np.array_split(b, count)
            units = [float(x.mean() / y.mean()) for x, y in zip(sa, sb) if y.mean() != 0]
    centre = None if len(num) > 1 else float(num[0].mean() / den[0].mean())  # one process: its own ratio
    if not log:
        if centre is None:  # the units' mean (over machines: of the machine means)
            centre = _mean_of_machines(units, machines)
        log = _positive(num + den, units)
    return _estimate(  # samples: of one side
        units, len(num), num, confidence=confidence, log=log, centre=centre, machines=machines
    )


def ratio_interval(
    numerator: Sequence[float], denominator: Sequence[float], *, paired: bool, confidence: float = CONFIDENCE
) -> Estimate:
    """A speedup-like ratio of one process's two arms (log-pooled batch means)."""
    return ratio_estimate([numerator], [denominator], paired=paired, confidence=confidence)


def loglog_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of log(y) against log(x): the exponent of a power law y ~ x^k."""
    lx, ly = np.log(np.asarray(xs, dtype=float)), np.log(np.asarray(ys, dtype=float))
    cx = lx - lx.mean()
    return float((cx * (ly - ly.mean())).sum() / (cx * cx).sum())


def slope_estimate(
    xs: Sequence[float],
    points: Sequence[Replicates],
    *,
    confidence: float = CONFIDENCE,
    machines: Sequence[str] | None = None,
) -> Estimate:
    """Log-log exponent over sweep points: fitted per replicate (or per batch of one), pooled.

    `points[j]` holds the replicates measured at xs[j]; replicate r of every point is one process
    (and ran on `machines[r]`).
    """
    if len(xs) != len(points):
        raise ValueError("one set of replicates per x is needed")
    if len(set(xs)) < 2:
        raise ValueError("a slope needs at least two distinct x values")
    per_point = [_replicates(p) for p in points]
    if min(xs) <= 0 or any(r.min() <= 0 for p in per_point for r in p):
        raise ValueError("a log-log fit needs positive x and positive samples")
    counts = {len(p) for p in per_point}
    if len(counts) != 1:
        raise ValueError(f"every point needs the same replicates; they have {sorted(counts)}")
    (replicates,) = counts
    if replicates > 1:
        units = [loglog_slope(xs, [float(p[r].mean()) for p in per_point]) for r in range(replicates)]
    else:
        count = min(len(_batches(p[0].size)) for p in per_point)
        split = [np.array_split(p[0], count) for p in per_point]
        units = [loglog_slope(xs, [float(s[b].mean()) for s in split]) for b in range(count)]
        centre = loglog_slope(xs, [float(p[0].mean()) for p in per_point])
        return _estimate(units, 1, [p[0] for p in per_point], confidence=confidence, log=False, centre=centre)
    samples = [r for p in per_point for r in p]
    return _estimate(units, replicates, samples, confidence=confidence, log=False, machines=machines)


def slope_interval(
    xs: Sequence[float], samples: Sequence[Sequence[float]], *, confidence: float = CONFIDENCE
) -> Estimate:
    """The exponent from one process's samples at each x."""
    return slope_estimate(xs, [[s] for s in samples], confidence=confidence)


# ---------------------------------------------------------------- what it would take


MOST_REPLICATES = 100  # beyond this, "more replicates" is not an answer: the effect is too close to call


def replicates_to_decide(est: Estimate, edge: float) -> int | None:
    """How many replicates would likely put the interval clear of `edge` at this spread, or None
    when that is more than MOST_REPLICATES (too close to the edge to decide at this noise).

    Assumes the estimate stays where it is and the spread between units stays as measured: a
    forecast, not a promise.
    """
    if est.machines > 1:  # its units are machines: more replicates on the same machines cannot narrow it
        return None
    if est.log and (est.value <= 0 or edge <= 0):
        return None
    distance = abs(math.log(est.value / edge)) if est.log else abs(est.value - edge)
    if distance == 0 or not math.isfinite(est.spread):
        return None
    if est.replicates > 1:
        spread, first = est.spread, est.replicates + 1
    else:  # one process: its batches say only how precise its own mean is, a floor on the process spread
        spread, first = est.spread / math.sqrt(max(est.units, 1)), 2
    for r in range(first, MOST_REPLICATES + 1):
        if t_quantile(0.5 + est.confidence / 2.0, r - 1) * spread / math.sqrt(r) < distance:
            return r
    return None


# ---------------------------------------------------------------- looking more than once


def _normal_tail(z: np.ndarray | float) -> np.ndarray:
    """P(Z > z) for a standard normal, elementwise."""
    return 0.5 * np.vectorize(math.erfc)(np.asarray(z, dtype=float) / math.sqrt(2.0))


def _leaving(z: float, t: float, step: float, b: np.ndarray, weights: np.ndarray) -> float:
    """P(|B(t)| > z sqrt(t)) for paths that stayed inside so far (their weights at grid points b)."""
    e, sd = z * math.sqrt(t), math.sqrt(step)
    return float((weights * (_normal_tail((e - b) / sd) + _normal_tail((e + b) / sd))).sum())


def sequential_levels(fractions: Sequence[float], spent: Sequence[float], *, grid: int = 801) -> list[float]:
    """The confidence of each look of a group-sequential design, so that a verdict wrong at any look is as
    rare as the error it has spent by then (Lan and DeMets' spending approach).

    `fractions` are the information at each look as a share of the most the design may reach (here
    replicates / the most replicates), strictly increasing; `spent[j]` is the two-sided error spent up to
    and including look j. Look j's critical value is the one at which a statistic that stayed inside
    every earlier look's interval leaves this one with probability spent[j] - spent[j - 1], for the
    cumulative statistics of a Brownian motion observed at the fractions (correlation sqrt(t_i / t_j)).
    Looks are correlated, so each later look gets a wider share than a Bonferroni split would give it.
    The levels are for normal statistics; perfkit applies them as the level of its t-intervals, and
    tests/test_stats.py measures the error that gives against known truth under optional stopping.
    """
    from statistics import NormalDist

    ts = [float(t) for t in fractions]
    if any(b <= a for a, b in zip(ts, ts[1:])) or not ts or ts[0] <= 0:
        raise ValueError(f"fractions must be positive and increasing, got {ts}")
    if any(b < a for a, b in zip(spent, spent[1:])) or not 0 < spent[0] < 1:
        raise ValueError(f"the error spent must be in (0, 1) and not decrease, got {list(spent)}")
    c = NormalDist().inv_cdf(1.0 - spent[0] / 2.0)
    levels = [1.0 - spent[0]]
    edge = c * math.sqrt(ts[0])  # on the scale of B(t) = Z * sqrt(t)
    b = np.linspace(-edge, edge, grid)
    density = np.exp(-(b**2) / (2 * ts[0])) / math.sqrt(2 * math.pi * ts[0])
    for j in range(1, len(ts)):
        step = ts[j] - ts[j - 1]
        wanted = spent[j] - spent[j - 1]
        weights = density * np.gradient(b)  # trapezoid-like weights on the grid of the staying region

        if wanted <= 0:
            levels.append(1.0)
            z = 40.0
        else:
            low, high = 0.0, 40.0  # leaving(z) falls as z grows
            for _ in range(60):
                mid = 0.5 * (low + high)
                low, high = (mid, high) if _leaving(mid, ts[j], step, b, weights) > wanted else (low, mid)
            z = 0.5 * (low + high)
            levels.append(1.0 - 2.0 * float(_normal_tail(z)))
        edge = z * math.sqrt(ts[j])
        nb = np.linspace(-edge, edge, grid)
        kernel = np.exp(-((nb[:, None] - b[None, :]) ** 2) / (2 * step)) / math.sqrt(2 * math.pi * step)
        density, b = kernel @ weights, nb
    return levels


# ---------------------------------------------------------------- where the variance is


def between_share(replicates: Replicates) -> float | None:
    """Share of the variance that lies between processes (intra-class correlation), or None with one.

    One-way random-effects estimate: (MSB - MSW) / (MSB + (n0 - 1) MSW), clipped at 0.
    """
    reps = _replicates(replicates)
    if len(reps) < 2 or any(r.size < 2 for r in reps):
        return None
    sizes = np.array([r.size for r in reps], dtype=float)
    means = np.array([r.mean() for r in reps])
    grand = float(np.concatenate(reps).mean())
    k, total = len(reps), sizes.sum()
    msb = float((sizes * (means - grand) ** 2).sum() / (k - 1))
    msw = float(sum(((r - r.mean()) ** 2).sum() for r in reps) / (total - k))
    n0 = (total - (sizes**2).sum() / total) / (k - 1)
    denominator = msb + (n0 - 1) * msw
    if denominator <= 0:
        return 0.0
    return float(min(1.0, max(0.0, (msb - msw) / denominator)))


def between_share_of_mean(replicates: Replicates) -> float | None:
    """Share of a replicate mean's variance that comes from between processes, (MSB - MSW) / MSB.

    This, not the per-sample share, says whether more samples could still narrow the interval:
    with 1,000 samples a process, a per-sample share of 5% is already most of a mean's variance.
    """
    reps = _replicates(replicates)
    if len(reps) < 2 or any(r.size < 2 for r in reps):
        return None
    sizes = np.array([r.size for r in reps], dtype=float)
    means = np.array([r.mean() for r in reps])
    grand = float((sizes * means).sum() / sizes.sum())
    msb = float((sizes * (means - grand) ** 2).sum() / (len(reps) - 1))
    msw = float(sum(((r - r.mean()) ** 2).sum() for r in reps) / (sizes.sum() - len(reps)))
    return None if msb <= 0 else float(min(1.0, max(0.0, (msb - msw) / msb)))


def lag1(samples: Sequence[float]) -> float | None:
    """Lag-1 autocorrelation of samples in time order, or None with fewer than 3 or no spread."""
    data = np.asarray(samples, dtype=float)
    if data.size < 3:
        return None
    centred = data - data.mean()
    denominator = float((centred * centred).sum())
    if denominator == 0:
        return None
    return float((centred[:-1] * centred[1:]).sum() / denominator)


def warnings(replicates: Replicates) -> list[str]:
    """What would make this measurement mislead, each with what to do about it.

    Only what predicts trouble: a spread that is large but correctly inside the interval is not
    warned about (the interval already says it).
    """
    reps = _replicates(replicates)
    out = []
    if len(reps) == 1:
        out.append("one process: the interval cannot see how much the next process differs; run 3 or more replicates")
        r1 = lag1(reps[0])
        if r1 is not None and r1 >= AUTOCORRELATED:
            out.append(f"samples are autocorrelated (lag-1 {r1:.2f}): neighbouring samples are not independent draws")
        if len(_batches(reps[0].size)) < 5:
            out.append(f"only {reps[0].size} samples: too few batches for a stable interval; record more")
        return out
    share = between_share_of_mean(reps)
    if share is not None and share >= BETWEEN_DOMINATES:
        out.append(
            f"between-process spread dominates ({share:.0%} of a replicate mean's variance): more processes, "
            "not more samples, narrow this interval"
        )
    return out


# ---------------------------------------------------------------- one process apart

#: family-wise level of the test that one process stands apart (shared by all processes)
APART_LEVEL = 0.05
APART_SHRINK = 2.0  # ... and it drives the spread: without it, the spread between processes is this many times smaller
APART_MATERIAL = 0.1  # ... and it is 10% away at least (a factor of 1.1; 10% of the largest value's size): two
#: processes that agree to 0.1% make any third look apart by t alone, and a 6% difference is not worth a warning


def apart(estimates: Sequence[float], *, log: bool) -> tuple[int, float] | None:
    """The one process whose own estimate stands apart from the others' and drives their spread:
    (its index, how many times smaller the spread is without it), or None.

    Each process in turn is set against the others: its distance from their mean, in units of their
    spread, is Student's t with R - 2 degrees of freedom when it is one more draw like them (a
    prediction interval). It stands apart when that is beyond chance for any of the R processes
    (Bonferroni, `APART_LEVEL` in all), the spread of the estimates shrinks `APART_SHRINK` times or
    more without it, and it is `APART_MATERIAL` away at least. With `log` the estimates (positive:
    times, rates, ratios) are compared on the log scale, as factors. Three processes at least; with
    fewer, which one is odd cannot be told.
    """
    values = np.asarray(estimates, dtype=float)
    if values.size < 3 or not np.all(np.isfinite(values)) or (log and not np.all(values > 0)):
        return None
    if log:
        values = np.log(values)
    spread = float(values.std(ddof=1))
    if spread == 0:
        return None
    found: tuple[int, float] | None = None
    strongest = 0.0
    material = math.log1p(APART_MATERIAL) if log else APART_MATERIAL * float(np.abs(values).max())
    for i in range(values.size):
        others = np.delete(values, i)
        rest = float(others.std(ddof=1))
        distance = abs(float(values[i] - others.mean()))
        t = distance / (rest * math.sqrt(1 + 1 / others.size)) if rest > 0 else math.inf
        chance = 2 * (1 - t_cdf(t, values.size - 2)) if math.isfinite(t) else 0.0
        shrink = spread / rest if rest > 0 else math.inf
        if chance * values.size < APART_LEVEL and shrink >= APART_SHRINK and distance >= material and t > strongest:
            found, strongest = (i, shrink), t
    return found


# ---------------------------------------------------------------- two groups of runs


def between_groups(before: Sequence[float], after: Sequence[float], *, log: bool, rho: float = 0.0,
                   confidence: float = CONFIDENCE) -> Estimate:  # fmt: skip
    """How far `after` moved from `before`, two groups of units in time order (a run's estimate each):
    the ratio of their geometric means with `log` (positive quantities), else the difference of their
    means, with Welch's t-interval (each group's own spread, Welch-Satterthwaite degrees of freedom).
    `rho`: the lag-1 autocorrelation of neighbouring units (runs on the same machine share its state
    from one day to the next), clipped to [0, 0.9]; each group's variance of its mean is widened by
    (1 + rho) / (1 - rho), as for an AR(1) series. Two units a side at least."""
    a, b = np.asarray(before, dtype=float), np.asarray(after, dtype=float)
    if a.size < 2 or b.size < 2:
        raise ValueError("between_groups needs two units a side")
    if log:
        a, b = np.log(a), np.log(b)
    rho = min(max(rho, 0.0), 0.9)
    widen = (1.0 + rho) / (1.0 - rho)
    va, vb = widen * float(a.var(ddof=1)) / a.size, widen * float(b.var(ddof=1)) / b.size
    diff = float(b.mean() - a.mean())
    se = math.sqrt(va + vb)
    if se == 0.0:
        low = high = diff
    else:
        df = (va + vb) ** 2 / (va * va / (a.size - 1) + vb * vb / (b.size - 1)) if va * vb > 0 else a.size + b.size - 2
        half = t_quantile(1.0 - (1.0 - confidence) / 2.0, df) * se
        low, high = diff - half, diff + half
    if log:
        diff, low, high = math.exp(diff), math.exp(low), math.exp(high)
    return Estimate(diff, low, high, replicates=a.size + b.size, units=a.size + b.size, n=a.size + b.size,
                    spread=se, log=log, confidence=confidence)  # fmt: skip
