import math
import re

import numpy as np
import pytest
from records import execution as run
from records import hypothesis as hyp
from records import metric

from perfkit.experiment.records.kinds import expectation
from perfkit.experiment.records.probe import Sweep
from perfkit.experiment.records.verdict import Verdict
from perfkit.experiment.run.judging import judge
from perfkit.phases import BREAKDOWN, STEP
from perfkit.samples import MetricRecord

COST = expectation(kind="cost", metric="mask", unit="ms", value=200.0, factor=3.0)


def test_cost_refuted_says_how_far_off():
    samples = tuple([0.17e-3, 0.18e-3, 0.19e-3] * 10)
    j = judge(hyp(COST), [run(MetricRecord(name="mask", unit="s", samples=samples))])
    assert j.verdict is Verdict.REFUTED
    assert j.measured.unit == "ms" and j.measured.value == pytest.approx(0.18, rel=0.02)
    assert j.off_by == "1,100x below the expected 200 ms"
    assert j.line().startswith("measured 0.18 ms [")


def test_cost_confirmed_within_factor_and_inconclusive_when_straddling():
    assert judge(hyp(COST), [run(metric("mask", 150))]).verdict is Verdict.CONFIRMED
    wide = MetricRecord(name="mask", unit="ms", samples=tuple([10.0, 1200.0] * 10))
    j = judge(hyp(COST), [run(wide)])
    assert j.verdict is Verdict.INCONCLUSIVE and "straddles" in j.reason


@pytest.mark.parametrize(
    "samples, reason",
    [
        ((), "probe recorded no samples for mask"),
        ((1.0, math.nan, 2.0, 3.0, 4.0), "1 of 5 samples of mask are NaN"),
        ((1.0, 2.0), "has 2 samples, fewer than the 5 needed"),
    ],
)
def test_bad_evidence_is_inconclusive_with_the_reason(samples, reason):
    j = judge(hyp(COST), [run(MetricRecord(name="mask", unit="ms", samples=samples))])
    assert j.verdict is Verdict.INCONCLUSIVE
    assert reason in j.reason


def test_metric_never_recorded_lists_what_was():
    j = judge(hyp(COST), [run(metric("other", 1.0))])
    assert j.verdict is Verdict.INCONCLUSIVE
    assert j.reason == "probe recorded no samples for mask (it recorded: other)"


def test_failed_execution_is_an_error_with_where():
    j = judge(hyp(COST), [run(status="error", reason="p.ipynb cell 4: ValueError: boom")])
    assert j.verdict is Verdict.ERROR and j.reason == "p.ipynb cell 4: ValueError: boom"


def test_unit_mismatch_is_an_error_not_evidence():
    j = judge(hyp(COST), [run(metric("mask", 5.0, unit="B"))])
    assert j.verdict is Verdict.ERROR and "cannot convert B" in j.reason


def test_bounds_and_floor():
    at_most = expectation(kind="at_most", metric="t", unit="ms", value=2.0)
    assert judge(hyp(at_most), [run(metric("t", 1.0))]).verdict is Verdict.CONFIRMED
    assert judge(hyp(at_most), [run(metric("t", 3.0))]).verdict is Verdict.REFUTED
    at_least = expectation(kind="at_least", metric="t", unit="tok/s", value=5.0)
    assert judge(hyp(at_least), [run(metric("t", 4.0, unit="tok/s"))]).verdict is Verdict.REFUTED
    floored = expectation(kind="at_most", metric="t", unit="ms", floor="roof", factor=2.0)
    floor = MetricRecord(name="roof", unit="s", samples=(0.001,), note="bytes / bandwidth")
    j = judge(hyp(floored), [run(metric("t", 2.5), floor)])
    assert j.verdict is Verdict.REFUTED
    assert j.floor.value == pytest.approx(1.0) and j.floor.note == "bytes / bandwidth"
    assert j.expected == "≤ 2 × 1 ms (roof) = 2 ms"


def test_selector_chooses_among_points():
    records = [metric("t", 1.0, at={"ctx": 1024}), metric("t", 50.0, at={"ctx": 65536})]
    many = judge(hyp(expectation(kind="at_most", metric="t", unit="ms", value=10.0)), [run(*records)])
    assert many.verdict is Verdict.INCONCLUSIVE and "add expect.at" in many.reason
    chosen = expectation(kind="at_most", metric="t", unit="ms", value=10.0, at={"ctx": 65536})
    assert judge(hyp(chosen), [run(*records)]).verdict is Verdict.REFUTED


def breakdown(step_ms, parts, n=30):
    records = []
    rng = np.random.default_rng(0)
    noise = 1 + 0.02 * rng.standard_normal(n)
    for name in (STEP,) + BREAKDOWN:
        value = step_ms if name == STEP else parts.get(name, 0.0)
        records.append(
            MetricRecord(name=name, unit="ms", samples=tuple(float(x) for x in value * noise), breakdown=STEP)
        )
    return records


def test_share_of_step_paired():
    records = breakdown(190.0, {"prepare_for_verify": 0.18, "verify_forward": 150.0, "unattributed": 39.82})
    dominates = expectation(kind="share", metric="prepare_for_verify", of=STEP, at_least=0.5)
    j = judge(hyp(dominates), [run(*records)])
    assert j.verdict is Verdict.REFUTED
    assert j.measured.value == pytest.approx(100 * 0.18 / 190, rel=1e-6)
    assert j.measured.high - j.measured.low < 1e-6  # paired: the phase moves with its step
    small = expectation(kind="share", metric="unattributed", of=STEP, at_most=0.1)
    assert judge(hyp(small), [run(*records)]).verdict is Verdict.REFUTED


def test_scaling_over_a_sweep():
    sweep = Sweep(param="ctx", values=(1024, 4096, 16384))
    expect = expectation(kind="scaling", metric="mask", over="ctx", exponent=1.0, tolerance=0.25)
    linear = [run(metric("mask", 1e-4 * c), params={"ctx": c}) for c in sweep.values]
    j = judge(hyp(expect, sweep), linear)
    assert j.verdict is Verdict.CONFIRMED and j.measured.value == pytest.approx(1.0, abs=0.05)
    flat = [run(metric("mask", 0.05), params={"ctx": c}) for c in sweep.values]
    j = judge(hyp(expect, sweep), flat)
    assert j.verdict is Verdict.REFUTED and "below the expected exponent 1 ± 0.25" in j.off_by
    one = judge(hyp(expect, sweep), linear[:1])
    assert one.verdict is Verdict.INCONCLUSIVE and "at least two values of ctx" in one.reason


def test_speedup_for_times_and_rates():
    expect = expectation(kind="speedup", baseline="heap", candidate="vec", at_least=100.0)
    j = judge(hyp(expect), [run(metric("heap", 47.4), metric("vec", 0.1))])
    assert j.verdict is Verdict.CONFIRMED and j.measured.value == pytest.approx(474, rel=0.05)
    slow = judge(hyp(expect), [run(metric("heap", 1.0), metric("vec", 0.5))])
    assert slow.verdict is Verdict.REFUTED and re.fullmatch(
        r"(49|50|51)x below the claimed minimum speedup 100x", slow.off_by
    )
    rates = expectation(kind="speedup", baseline="ar", candidate="spec", at_least=1.5)
    j = judge(hyp(rates), [run(metric("ar", 10.0, unit="tok/s"), metric("spec", 25.0, unit="tok/s"))])
    assert j.verdict is Verdict.CONFIRMED and j.measured.value == pytest.approx(2.5, rel=0.05)


def test_a_floor_measured_in_each_replicate_is_judged_as_the_ratio_with_its_own_interval():
    """Replicates of 2.5 ms and 2.6 ms against floors of 1.0 and 1.3 ms measured in those processes:
    the verdict judges 2.5/1.0 and 2.6/1.3 (2.5x and 2x), not 2.55 ms against a 1.15 ms number."""
    floored = expectation(kind="at_most", metric="t", unit="ms", floor="roof", factor=3.0)
    reps = [
        run(metric("t", t, seed=i), MetricRecord(name="roof", unit="ms", samples=(f * 0.99, f, f * 1.01)), replicate=i)
        for i, (t, f) in enumerate([(2.5, 1.0), (2.6, 1.3), (2.4, 1.1)])
    ]
    j = judge(hyp(floored), reps)
    expected_ratio = math.exp(np.mean(np.log([2.5 / 1.0, 2.6 / 1.3, 2.4 / 1.1])))
    assert j.measured.unit == "x" and j.measured.label == "ratio to roof" and j.measured.replicates == 3
    assert j.measured.value == pytest.approx(expected_ratio, rel=0.02)
    assert j.floor.value == pytest.approx(1.133, rel=0.01) and j.floor.replicates == 3
    assert j.floor.low < 1.0 and j.floor.high > 1.3  # the floor's own spread, over the three processes
    assert j.expected.startswith("≤ 3 × 1.13 ms [") and "(roof)" in j.expected
    assert j.verdict is Verdict.CONFIRMED and j.measured.high < 3.0  # three ratios of 2x..2.5x, all under 3x
    assert j.off_by.endswith("below the bound 3 × roof")


def test_a_floor_recorded_in_some_replicates_only_is_not_judged():
    floored = expectation(kind="at_most", metric="t", unit="ms", floor="roof", factor=3.0)
    roof = MetricRecord(name="roof", unit="ms", samples=(1.0, 1.1))
    j = judge(hyp(floored), [run(metric("t", 2.0), roof, replicate=0), run(metric("t", 2.0, seed=1), replicate=1)])
    assert j.verdict is Verdict.INCONCLUSIVE and "different numbers of replicates" in j.reason


def test_a_warning_true_at_several_points_is_one_line_with_its_count():
    import random

    from perfkit.experiment.records.kinds.base import warnings_for

    rng = random.Random(0)

    def offsets(spread):  # three processes of 20 samples, each process shifted by its own offset
        shifted = [10 * (1 + rng.gauss(0, spread)) for _ in range(3)]
        return [[mean + rng.gauss(0, 0.01) for _ in range(20)] for mean in shifted]

    labelled = [(f"m at ctx={c}", offsets(0.2 if i < 4 else 0.0)) for i, c in enumerate((1, 2, 4, 8, 16, 32))]
    said = warnings_for(labelled)
    assert len(said) == 1, said  # not four lines of the same warning
    assert said[0].startswith("between-process spread dominates") and "more processes, not more samples" in said[0]
    assert said[0].endswith("(at 4 of 6: m at ctx=1, m at ctx=2, m at ctx=4, m at ctx=8)")
    (one,) = warnings_for(labelled[:1])
    assert one.startswith("m at ctx=1: between-process spread dominates (") and "% of a replicate mean's" in one


def test_in_a_notebook_the_one_process_warning_is_said_at_the_first_record_only(monkeypatch):
    from perfkit.probe import recording

    monkeypatch.setattr(recording, "_said", set())
    payloads = [recording.make_record(name, [1.0 + 0.01 * i for i in range(30)], unit="ms") for name in ("a", "b")]
    first, second = (recording.summary_line(p) for p in payloads)
    assert "warning: one process:" in first and "said once per notebook" in first
    assert "one process" not in second


def test_every_printed_line_says_its_interval_level():
    j = judge(hyp(COST), [run(metric("mask", 150))])
    assert "(95% interval)" in j.line()  # a run's verdict line has no header to say it
    assert j.measured.text() == j.measured.text(level=True).removesuffix(" (95% interval)")  # the ledger's cells
