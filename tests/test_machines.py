"""The machine as a level of the design (perfkit/stats.py), against known truth by simulation.

A pool of machines of one kind: each machine draws its own offset (the between-machine spread),
each process on it its own (allocator, layout), and each sample is noise around the process's mean,
autocorrelated and with a heavy tail. The truth a claim about the pool is judged against is the
pool's mean. An interval that pools the processes as if they were all of one machine covers it far
less often than it says; the nested interval (machine means, M - 1 degrees of freedom) covers it.
"""

from __future__ import annotations

import numpy as np
import pytest

from perfkit import stats

TRIALS = 1000


def pool(rng, machines: int, per_machine: int, *, machine_sd: float, process_sd: float = 0.02, mean: float = 1.0):
    """(replicates, their machine labels): `per_machine` processes on each of `machines` machines."""
    replicates, labels = [], []
    for m in range(machines):
        machine = mean * (1 + machine_sd * rng.standard_normal())
        for _ in range(per_machine):
            process = machine * (1 + process_sd * rng.standard_normal())
            noise = np.empty(30)
            noise[0] = rng.standard_normal()
            for i in range(1, 30):  # lag-1 autocorrelation 0.6, as measured in one process here
                noise[i] = 0.6 * noise[i - 1] + 0.8 * rng.standard_normal()
            heavy = rng.standard_t(3, 30) * 0.002  # a heavy tail on top
            replicates.append(list(process * (1 + 0.01 * noise + heavy)))
            labels.append(f"machine-{m}")
    return replicates, labels


def coverage(machines: int, per_machine: int, *, nested: bool, machine_sd: float = 0.08, seed: int = 1) -> float:
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(TRIALS):
        replicates, labels = pool(rng, machines, per_machine, machine_sd=machine_sd)
        est = stats.mean_estimate(replicates, machines=labels if nested else None)
        hits += est.low <= 1.0 <= est.high
    return hits / TRIALS


@pytest.mark.parametrize("machines, per_machine", [(2, 2), (3, 2), (4, 3)])
def test_the_nested_interval_covers_the_pools_mean_about_95_percent_of_the_time(machines, per_machine):
    got = coverage(machines, per_machine, nested=True)
    assert 0.93 <= got <= 0.975, got  # 1,000 trials: the binomial's 95% band around 0.95 is about +-0.014


def test_pooling_processes_of_several_machines_as_one_is_false_precision():
    """The same data, the machine labels ignored: processes of one machine share its offset, so they
    are not independent draws of the pool, and the interval is far too narrow."""
    assert coverage(4, 3, nested=False) < 0.8


def test_one_machine_takes_the_same_path_as_before():
    rng = np.random.default_rng(2)
    replicates, _ = pool(rng, 1, 4, machine_sd=0.1)
    alone = stats.mean_estimate(replicates)
    labelled = stats.mean_estimate(replicates, machines=["only"] * 4)
    assert labelled == alone and alone.machines == 1 and alone.between_machines is None


def test_a_ten_percent_offset_on_one_of_two_machines_is_reported_as_the_between_machine_spread():
    """Known truth: machine B is 10% slower than A, each with 3 processes. The two machine means differ
    by 10%, so their standard deviation is 10% / sqrt(2) of the mean: about 7%."""
    rng = np.random.default_rng(3)
    shares = []
    for _ in range(200):
        replicates, labels = [], []
        for name, factor in (("A", 1.0), ("B", 1.1)):
            for _ in range(3):
                process = factor * (1 + 0.01 * rng.standard_normal())
                replicates.append(list(process * (1 + 0.01 * rng.standard_normal(30))))
                labels.append(name)
        est = stats.mean_estimate(replicates, machines=labels)
        assert est.machines == 2 and est.units == 2 and est.replicates == 6
        assert est.low < 1.0 < 1.1 < est.high  # two machines: the pool's mean is barely known
        shares.append(est.between_machines)
    assert 0.06 < float(np.median(shares)) < 0.08, np.median(shares)


def test_machines_with_no_offset_report_a_small_spread_and_a_narrow_interval():
    rng = np.random.default_rng(4)
    replicates, labels = pool(rng, 4, 3, machine_sd=0.0)
    est = stats.mean_estimate(replicates, machines=labels)
    assert est.machines == 4 and est.between_machines < 0.03
    assert est.high / est.low < 1.1


def test_ratios_and_exponents_nest_over_machines_too():
    rng = np.random.default_rng(5)
    fast, slow, labels = [], [], []
    for m, offset in enumerate((1.0, 1.2, 0.9)):  # the machines differ in speed; the speedup (2x) does not
        for _ in range(2):
            base = offset * (1 + 0.02 * rng.standard_normal())
            slow.append(list(2 * base * (1 + 0.01 * rng.standard_normal(20))))
            fast.append(list(base * (1 + 0.01 * rng.standard_normal(20))))
            labels.append(str(m))
    ratio = stats.ratio_estimate(slow, fast, paired=False, machines=labels)
    assert ratio.machines == 3 and ratio.low < 2.0 < ratio.high and ratio.between_machines < 0.05
    xs = [1.0, 2.0, 4.0]
    points = [[[x * s for s in rep] for rep in fast] for x in xs]  # linear in x on every machine
    slope = stats.slope_estimate(xs, points, machines=labels)
    assert slope.machines == 3 and slope.low <= 1.0 <= slope.high


def test_machine_labels_must_match_the_replicates():
    with pytest.raises(ValueError, match="2 machine labels for 3 replicates"):
        stats.mean_estimate([[1.0, 1.1], [1.0, 1.2], [0.9, 1.0]], machines=["a", "b"])
