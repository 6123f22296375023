"""Verdicts on measurements of known truth, by simulation: per-process offsets, slow drift inside a
process, heavy tails, and machine load. A confirmed or refuted verdict that contradicts the truth
is the worst bug perfkit can have; inconclusive is the honest answer when the evidence is thin."""

import math
from pathlib import Path

import numpy as np
import pytest

from perfkit.experiment import runner
from perfkit.experiment.hypothesis import Hypothesis, Probe
from perfkit.experiment.kinds import expectation
from perfkit.experiment.results import Execution, HypothesisResult, Measured
from perfkit.experiment.verdict import Judgement, Verdict, judge
from perfkit.samples import MetricRecord


def hypothesis(expect):
    return Hypothesis(
        id="h",
        claim="c",
        rationale="r",
        expect=expect,
        probe=Probe(notebook="p.ipynb"),
        tags=(),
        path=Path("h.yaml"),
        hash="0",
    )


def process(rng, mean, n=40, *, offset_sd=0.05, rho=0.6, df=4):
    """One kernel process: an offset for the whole process, AR(1) drift and Student-t noise around it."""
    noise = rng.standard_t(df, n) / math.sqrt(df / (df - 2))
    drift = np.empty(n)
    drift[0] = noise[0]
    for i in range(1, n):
        drift[i] = rho * drift[i - 1] + math.sqrt(1 - rho * rho) * noise[i]
    return mean * (1 + rng.normal(0, offset_sd)) * (1 + 0.05 * drift)


def replicates(rng, metrics: dict[str, float], r: int, **shape) -> list[Execution]:
    return [
        Execution(
            key="k",
            notebook="p.ipynb",
            params={},
            status="ok",
            wall_s=1.0,
            run_id="run",
            replicate=i,
            records=tuple(
                MetricRecord(name=n, unit="ms", samples=tuple(process(rng, m, **shape))) for n, m in metrics.items()
            ),
        )
        for i in range(r)
    ]


def tally(expect, draw, trials=300):
    rng = np.random.default_rng(7)
    counts = {v: 0 for v in Verdict}
    for _ in range(trials):
        counts[judge(hypothesis(expect), draw(rng)).verdict] += 1
    return {v: n / trials for v, n in counts.items()}


def test_a_bound_that_holds_is_never_refuted_and_one_that_fails_never_confirmed():
    bound = expectation(kind="at_most", metric="t", unit="ms", value=10.0)
    for r, power in ((3, 0.25), (5, 0.75)):  # 3 processes decide a 10% effect at 5% offsets now and then; 5 mostly
        holds = tally(bound, lambda rng, r=r: replicates(rng, {"t": 9.0}, r))  # 10% inside the bound
        fails = tally(bound, lambda rng, r=r: replicates(rng, {"t": 11.0}, r))  # 10% outside
        assert holds[Verdict.REFUTED] <= 0.01 and fails[Verdict.CONFIRMED] <= 0.01, (r, holds, fails)
        assert holds[Verdict.CONFIRMED] > power and fails[Verdict.REFUTED] > power, (r, holds, fails)


def test_at_the_bound_it_mostly_says_inconclusive():
    bound = expectation(kind="at_least", metric="t", unit="ms", value=10.0)
    edge = tally(bound, lambda rng: replicates(rng, {"t": 10.0}, 3))
    assert edge[Verdict.CONFIRMED] + edge[Verdict.REFUTED] <= 0.06
    assert edge[Verdict.INCONCLUSIVE] >= 0.94


def test_speedups_of_known_truth():
    claim = expectation(kind="speedup", baseline="slow", candidate="fast", at_least=3.0)
    true = tally(claim, lambda rng: replicates(rng, {"slow": 10.0, "fast": 10.0 / 3.6}, 3))  # 3.6x
    false = tally(claim, lambda rng: replicates(rng, {"slow": 10.0, "fast": 10.0 / 2.5}, 3))  # 2.5x
    assert true[Verdict.REFUTED] <= 0.01 and false[Verdict.CONFIRMED] <= 0.01
    assert true[Verdict.CONFIRMED] > 0.5 and false[Verdict.REFUTED] > 0.5


def test_one_process_with_a_big_offset_is_not_taken_for_the_truth():
    """One process 8% slow (its allocator, its layout): a single replicate's tight interval would
    refute a true 'at most' claim; three processes say inconclusive or confirm, never refute."""
    bound = expectation(kind="at_most", metric="t", unit="ms", value=10.0)
    rng = np.random.default_rng(3)
    slow_process = [process(rng, 9.5 * 1.08, offset_sd=0.0, rho=0.0) for _ in range(1)]
    one = Execution(
        key="k",
        notebook="p.ipynb",
        params={},
        status="ok",
        wall_s=1.0,
        run_id="r",
        records=(MetricRecord(name="t", unit="ms", samples=tuple(slow_process[0])),),
    )
    assert judge(hypothesis(bound), [one]).verdict is Verdict.REFUTED  # what one process says
    others = replicates(rng, {"t": 9.5}, 2, offset_sd=0.0, rho=0.0)
    with_others = [one, *(Execution(**{**x.__dict__, "replicate": i + 1}) for i, x in enumerate(others))]
    assert judge(hypothesis(bound), with_others).verdict is not Verdict.REFUTED


def test_a_busy_machine_makes_the_verdict_inconclusive_or_leaves_the_replicate_out():
    bound = expectation(kind="at_most", metric="t", unit="ms", value=10.0)
    rng = np.random.default_rng(5)
    reps = replicates(rng, {"t": 9.0}, 3)
    busy = "machine busy: 1.1 cores used by other processes on average"
    loaded = [Execution(**{**reps[0].__dict__, "unfit": busy}), *reps[1:]]
    j = judge(hypothesis(bound), loaded)
    assert j.verdict is not Verdict.REFUTED and j.warnings[0].startswith("left out 1 of 3 replicates: machine busy")
    mostly = [Execution(**{**x.__dict__, "unfit": busy}) for x in reps[:2]] + reps[2:]
    j = judge(hypothesis(bound), mostly)
    assert j.verdict is Verdict.INCONCLUSIVE and j.reason.startswith("the machine was not fit to measure on")


def test_an_inconclusive_verdict_says_what_would_decide_it():
    bound = expectation(kind="at_most", metric="t", unit="ms", value=10.0)
    rng = np.random.default_rng(9)
    j = judge(hypothesis(bound), replicates(rng, {"t": 9.7}, 3, offset_sd=0.02))
    if j.verdict is Verdict.INCONCLUSIVE:
        assert "replicates would likely decide it" in j.reason or "too close to it" in j.reason
    tight = judge(hypothesis(bound), replicates(rng, {"t": 10.0}, 3, offset_sd=0.05))
    assert tight.verdict is Verdict.INCONCLUSIVE
    assert tight.needed is None or tight.needed > 3


def test_growing_a_plan_follows_what_would_decide_and_stops_at_the_most():
    plan = runner.Plan(
        executions=(Execution(key="k", notebook="p.ipynb", params={}),), needs={"h": ("k",)}, replicates={"k": 3}
    )
    item = runner.Judged(
        hypothesis=hypothesis(expectation(kind="at_most", metric="t", unit="ms", value=1.0)),
        judgement=Judgement(verdict=Verdict.INCONCLUSIVE, reason="straddles", expected="", needed=7),
        executions=(),
        points=(),
    )
    assert runner._grow(plan, [item], most=15).replicates == {"k": 7}
    assert runner._grow(plan, [item], most=5).replicates == {"k": 5}
    decided = runner.Judged(
        **{**item.__dict__, "judgement": Judgement(verdict=Verdict.CONFIRMED, reason=None, expected="")}
    )
    assert runner._grow(plan, [decided], most=15) is None


def test_not_reproduced_only_when_nothing_changed_and_the_intervals_are_disjoint():
    def result(low, high, key="k", hash="0"):
        return HypothesisResult(
            id="h",
            hash=hash,
            claim="c",
            kind="at_most",
            expected="",
            verdict="confirmed",
            reason=None,
            measured=Measured(label="mean", unit="ms", value=(low + high) / 2, low=low, high=high),
            off_by=None,
            executions=(Execution(key=key, notebook="p.ipynb", params={}),),
        )

    assert runner.not_reproduced(result(1.0, 2.0), result(2.5, 3.0), "r1").startswith("run r1 measured")
    assert runner.not_reproduced(result(1.0, 2.0), result(1.5, 3.0), "r1") is None  # overlapping
    assert runner.not_reproduced(result(1.0, 2.0), result(2.5, 3.0, key="other"), "r1") is None  # code changed
    assert runner.not_reproduced(result(1.0, 2.0), result(2.5, 3.0, hash="1"), "r1") is None  # record changed
    assert runner.not_reproduced(result(1.0, 2.0), None, "r1") is None


def test_a_run_that_may_look_again_spends_its_error_rate_across_the_looks():
    quick = runner.RunOptions(quick=True)
    full = runner.RunOptions(quick=False)
    assert quick.confidence() == 0.95 and quick.replicates_most() == 3
    assert full.replicates_most() == 15 and full.confidence() == pytest.approx(1 - 0.05 / 3)  # wider
    bound = expectation(kind="at_most", metric="t", unit="ms", value=10.0)
    reps = replicates(np.random.default_rng(4), {"t": 9.0}, 5)
    wide = judge(hypothesis(bound), reps, confidence=full.confidence())
    narrow = judge(hypothesis(bound), reps)
    assert wide.measured.high - wide.measured.low > narrow.measured.high - narrow.measured.low
    assert "the run looked more than once" in wide.measured.evidence()


def test_a_forecast_picks_the_edge_the_estimate_must_clear():
    claim = expectation(kind="cost", metric="t", unit="ms", value=10.0, factor=1.2)  # 8.33 .. 12
    rng = np.random.default_rng(8)
    j = judge(hypothesis(claim), replicates(rng, {"t": 12.6}, 3, offset_sd=0.05))
    if j.verdict is Verdict.INCONCLUSIVE:
        assert "straddles 12" in j.reason  # the upper edge, not the lower one
