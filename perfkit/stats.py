"""Point estimates and 95% intervals: percentile bootstrap, seeded by the samples themselves.

No I/O here. This module is the one path for every interval perfkit shows (verdicts, metric
summaries, plots, `perfkit show`, a notebook's record summary, the engine benchmarks). The seed
of each bootstrap is a hash of the samples it resamples, so the same samples give the same
interval whoever asks and however often, and a run's intervals are reproducible from its samples.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 2000
#: pyperf's rule of thumb: a spread this large relative to the mean makes a number unreliable.
UNSTABLE_CV = 0.10
FEW_SAMPLES = 10


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its confidence interval, in the unit of the samples."""

    value: float
    low: float
    high: float


@dataclass(frozen=True)
class Summary:
    n: int
    mean: float
    std: float
    min: float
    median: float
    max: float


def seed_of(*arrays: np.ndarray) -> int:
    """The one seed rule: a hash of the samples (values and lengths), stable across processes."""
    digest = hashlib.sha256()
    for array in arrays:
        data = np.ascontiguousarray(array, dtype=np.float64)
        digest.update(data.size.to_bytes(8, "little"))
        digest.update(data.tobytes())
    return int.from_bytes(digest.digest()[:8], "little")


def is_clean(samples: list[float]) -> bool:
    """True when every sample is a finite number."""
    return all(math.isfinite(s) for s in samples)


def summarize(samples: list[float]) -> Summary:
    data = np.asarray(samples, dtype=float)
    return Summary(
        n=int(data.size),
        mean=float(data.mean()),
        std=float(data.std(ddof=1)) if data.size > 1 else 0.0,
        min=float(data.min()),
        median=float(np.median(data)),
        max=float(data.max()),
    )


def _percentiles(draws: np.ndarray, point: float, confidence: float) -> Estimate:
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(draws, [tail, 100.0 - tail])
    return Estimate(value=float(point), low=float(low), high=float(high))


def mean_interval(samples: list[float], *, confidence: float = CONFIDENCE, resamples: int = RESAMPLES) -> Estimate:
    """Mean and its percentile-bootstrap interval."""
    data = np.asarray(samples, dtype=float)
    if data.size == 0:
        raise ValueError("no samples")
    rng = np.random.default_rng(seed_of(data))
    idx = rng.integers(0, data.size, size=(resamples, data.size))
    return _percentiles(data[idx].mean(axis=1), data.mean(), confidence)


def ratio_interval(
    numerator: list[float],
    denominator: list[float],
    *,
    paired: bool,
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
) -> Estimate:
    """Ratio of means, mean(numerator) / mean(denominator), with a bootstrap interval.

    Paired samples (a phase and the step it belongs to) are resampled together, so their
    correlation narrows the interval as it should; independent ones are resampled separately.
    """
    num = np.asarray(numerator, dtype=float)
    den = np.asarray(denominator, dtype=float)
    if num.size == 0 or den.size == 0:
        raise ValueError("no samples")
    if den.mean() == 0:
        raise ValueError("the denominator's mean is zero")
    rng = np.random.default_rng(seed_of(num, den))
    if paired:
        if num.size != den.size:
            raise ValueError(f"paired samples differ in length ({num.size} vs {den.size})")
        idx = rng.integers(0, num.size, size=(resamples, num.size))
        draws = num[idx].sum(axis=1) / den[idx].sum(axis=1)
    else:
        num_idx = rng.integers(0, num.size, size=(resamples, num.size))
        den_idx = rng.integers(0, den.size, size=(resamples, den.size))
        draws = num[num_idx].mean(axis=1) / den[den_idx].mean(axis=1)
    return _percentiles(draws, num.mean() / den.mean(), confidence)


def loglog_slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log(y) against log(x): the exponent of a power law y ~ x^k."""
    lx, ly = np.log(np.asarray(xs, dtype=float)), np.log(np.asarray(ys, dtype=float))
    cx = lx - lx.mean()
    return float((cx * (ly - ly.mean())).sum() / (cx * cx).sum())


def slope_interval(
    xs: list[float],
    samples: list[list[float]],
    *,
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
) -> Estimate:
    """Log-log exponent over sweep points, with an interval from resampling within each point."""
    if len(xs) != len(samples):
        raise ValueError("one list of samples per x is needed")
    if len(set(xs)) < 2:
        raise ValueError("a slope needs at least two distinct x values")
    if min(xs) <= 0 or any(min(s) <= 0 for s in samples):
        raise ValueError("a log-log fit needs positive x and positive samples")
    rng = np.random.default_rng(seed_of(np.asarray(xs, dtype=float), *(np.asarray(s, dtype=float) for s in samples)))
    means = np.empty((resamples, len(xs)))
    for j, point in enumerate(samples):
        data = np.asarray(point, dtype=float)
        idx = rng.integers(0, data.size, size=(resamples, data.size))
        means[:, j] = data[idx].mean(axis=1)
    lx = np.log(np.asarray(xs, dtype=float))
    cx = lx - lx.mean()
    ly = np.log(means)
    draws = (cx * (ly - ly.mean(axis=1, keepdims=True))).sum(axis=1) / (cx * cx).sum()
    point = loglog_slope(xs, [float(np.mean(p)) for p in samples])
    return _percentiles(draws, point, confidence)


def instability(samples: list[float]) -> list[str]:
    """pyperf-style warnings about a measurement, each saying how to make it trustworthy."""
    warnings = []
    n = len(samples)
    if 0 < n < FEW_SAMPLES:
        warnings.append(f"only {n} samples; record at least {FEW_SAMPLES} (more repetitions) for a stable interval")
    if n > 1:
        s = summarize(samples)
        if s.mean != 0 and s.std / abs(s.mean) >= UNSTABLE_CV:
            warnings.append(
                f"unstable: std is {s.std / abs(s.mean):.0%} of the mean; use more repetitions or warm-up, "
                "or quiet the machine"
            )
    return warnings
