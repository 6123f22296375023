"""One process apart from the others (stats.apart) and the verdict warning that names it, against known truth."""

import numpy as np
import pytest

from perfkit import stats
from perfkit.experiment.records.kinds.base import apart_warning


@pytest.mark.parametrize("processes", [3, 5, 8])
def test_processes_alike_are_rarely_called_apart(processes):
    """Drawn alike, a process is called apart about as often as the level allows (5% for all R together)."""
    rng = np.random.default_rng(processes)
    trials = 4000
    called = sum(stats.apart(list(rng.normal(10.0, 1.0, processes)), log=False) is not None for _ in range(trials))
    assert called / trials <= stats.APART_LEVEL * 1.2


@pytest.mark.parametrize("processes", [5, 8])
def test_a_process_far_from_the_others_is_found_and_named(processes):
    """One process 15 standard deviations off is found nearly always, and it is that one (with five
    processes the others' spread rests on three degrees of freedom: 10 is found 93% of the time)."""
    rng = np.random.default_rng(7)
    trials, named = 500, 0
    for trial in range(trials):
        means = rng.normal(10.0, 1.0, processes)
        odd = trial % processes
        means[odd] += 15.0
        found = stats.apart(list(means), log=False)
        named += found is not None and found[0] == odd and found[1] >= stats.APART_SHRINK
    assert named / trials >= 0.95


def test_factors_are_compared_on_the_log_scale_and_too_few_processes_say_nothing():
    assert stats.apart([2.0, 2.4, 2.2, 80.0, 2.1], log=True)[0] == 3
    assert stats.apart([2.0, 2.4, 2.2, 0.05, 2.1], log=True)[0] == 3  # 40x below counts as 40x above
    assert stats.apart([1.0, 100.0], log=False) is None  # with two, which one is odd cannot be told
    assert stats.apart([8.875] * 3, log=True) is None  # no spread: nothing stands apart
    assert stats.apart([1.0, 1.0, 1.0, 5.0], log=False) == (3, float("inf"))  # the others agree exactly


def test_the_warning_says_which_process_how_far_and_what_to_do():
    (said,) = apart_warning("mean", [12.4, 1.9, 2.1, 2.0, 2.05], "ms", log=True)
    assert said.startswith("process 0's mean (12.4 ms) is 6.2x the others' (1.9 to 2.1 ms): it drives the spread")
    assert said.endswith("look at what differed in that process")
    (signed,) = apart_warning("mean", [-0.6, -1.8, -5.5, 11.2, -2.1, -1.0], "%", log=False)
    assert signed.startswith("process 3's mean (11.2%) is apart from the others' (-5.5 to -0.6%)")
    assert apart_warning("mean", [1.0, 1.1, 0.9], "ms", log=True) == ()


def test_a_small_difference_is_not_worth_a_warning_however_well_the_others_agree():
    """Two processes that agree to 0.01% make a third 6% away stand out by t alone (make run's
    vectorized-tree-build-3x-at-batch-128: 3.39, 3.39 and 3.18x); it is not named unless 10% away."""
    assert stats.apart([3.3901, 3.3899, 3.18], log=True) is None
    assert stats.apart([3.3901, 3.3899, 2.9], log=True)[0] == 2
    assert stats.apart([0.501, 0.5012, 0.48], log=False) is None
