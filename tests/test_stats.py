import numpy as np
import pytest

from perfkit import stats


def test_the_same_samples_give_the_same_interval_whoever_asks():
    data = list(np.random.default_rng(1).normal(10, 1, 30))
    a = stats.mean_interval(data)
    b = stats.mean_interval(np.array(data))  # another caller, another container: same numbers
    other = stats.mean_interval(data[:-1] + [data[-1] + 1e-9])
    assert a == b
    assert a != other
    assert a.low < a.value < a.high
    assert stats.seed_of(np.array(data)) == stats.seed_of(np.array(data)) != stats.seed_of(np.array(data[:-1]))
    # the seed covers the split between arrays, not only their concatenation
    assert stats.seed_of(np.array([1.0]), np.array([2.0, 3.0])) != stats.seed_of(np.array([1.0, 2.0]), np.array([3.0]))


def test_bootstrap_interval_covers_the_true_mean_about_95_percent():
    """Simulation: draw many samples from a known distribution and count how often the
    interval holds the true mean (2.0 for an exponential with scale 2)."""
    rng = np.random.default_rng(12345)
    trials, covered = 400, 0
    for t in range(trials):
        sample = rng.exponential(2.0, size=60)
        est = stats.mean_interval(list(sample), resamples=1000)
        covered += est.low <= 2.0 <= est.high
    assert 0.90 <= covered / trials <= 0.98


def test_paired_ratio_is_tighter_than_unpaired_for_correlated_samples():
    rng = np.random.default_rng(3)
    step = rng.normal(10, 2, 40)
    part = 0.3 * step + rng.normal(0, 0.05, 40)  # a phase that moves with its step
    paired = stats.ratio_interval(list(part), list(step), paired=True)
    unpaired = stats.ratio_interval(list(part), list(step), paired=False)
    assert paired.value == pytest.approx(part.mean() / step.mean())
    assert paired.low < 0.3 < paired.high
    assert (paired.high - paired.low) < (unpaired.high - unpaired.low) / 3


def test_ratio_refuses_zero_denominator_and_unequal_pairs():
    with pytest.raises(ValueError, match="zero"):
        stats.ratio_interval([1.0], [0.0, 0.0], paired=False)
    with pytest.raises(ValueError, match="differ in length"):
        stats.ratio_interval([1.0, 2.0], [1.0], paired=True)


def test_slope_recovers_a_known_exponent():
    rng = np.random.default_rng(7)
    xs = [1000.0, 4000.0, 16000.0, 64000.0]
    samples = [list(2e-6 * x**0.5 * rng.lognormal(0, 0.05, 20)) for x in xs]
    est = stats.slope_interval(xs, samples)
    assert est.low < 0.5 < est.high
    assert est.high - est.low < 0.1
    assert stats.loglog_slope([1, 10, 100], [3, 30, 300]) == pytest.approx(1.0)


def test_slope_needs_two_points_and_positive_values():
    with pytest.raises(ValueError, match="two distinct"):
        stats.slope_interval([5.0, 5.0], [[1.0], [2.0]])
    with pytest.raises(ValueError, match="positive"):
        stats.slope_interval([1.0, 2.0], [[1.0], [0.0]])


def test_instability_warnings():
    assert stats.instability([1.0] * 20) == []
    assert any("only 3 samples" in w for w in stats.instability([1.0, 1.0, 1.0]))
    assert any("unstable: std is" in w for w in stats.instability([1.0, 2.0] * 10))
