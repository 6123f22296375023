"""The first round planned from what the ledger knows (replicates.choose, Policy.fit, priors.py),
checked against known truth by simulation: a plan decides more verdicts for the seconds it costs and
never makes a wrong one more likely than the 5% a verdict may spend."""

import math
from dataclasses import replace

import numpy as np
import pytest
from records import hypothesis, replicates

from perfkit import stats
from perfkit.experiment.records import replicates as policy
from perfkit.experiment.records.kinds import expectation
from perfkit.experiment.records.verdict import Measured, Verdict
from perfkit.experiment.run import priors
from perfkit.experiment.run.judging import judge

P = policy.Policy(first=3, most=12, budget_s=300)
COST = [policy.Cost(setup_s=1.0, measure_s=4.0, counts={"repeat": 40})]


def known(value, spread, *, edges=(None, 10.0), between=0.5, verdict="inconclusive", counts=None, log=True):
    return policy.Known(
        run_id="r1",
        verdict=verdict,
        value=value,
        spread=spread,
        log=log,
        replicates=3,
        edges=edges,
        between=between,
        counts=counts or {},
    )


def test_far_from_its_bound_a_hypothesis_gets_the_minimum_and_says_it_was_decided():
    far = policy.choose(
        P,
        known(0.57, 0.1, edges=(None, 200.0), verdict="refuted"),
        COST,
        ranges={},
        given={},
        confidence=P.confidence(),
    )
    assert far.replicates == 3 and far.decides and far.why.startswith("refuted last run at 3")
    assert far.why == "refuted last run at 3 (0.57)"  # one measurement: its own value
    median = replace(known(0.57, 0.1, edges=(None, 200.0), verdict="refuted"), measurements=3)
    said = policy.choose(P, median, COST, ranges={}, given={}, confidence=P.confidence()).why
    assert said == "refuted last run at 3 (median 0.57 of the 3 latest measurements)"  # never called the last run's


def test_near_its_bound_a_hypothesis_gets_the_replicates_its_forecast_asks_up_front():
    near = policy.choose(P, known(9.0, 0.1), COST, ranges={}, given={}, confidence=P.confidence())
    r = near.replicates
    assert 3 < r <= P.most and near.decides and "straddled 10" in near.why
    # the forecast: the fewest replicates whose interval clears the edge with MARGIN to spare
    distance = math.log(10.0 / 9.0)
    half = stats.t_quantile(0.5 + P.confidence() / 2, r - 1) * 0.1 / math.sqrt(r)
    assert half < policy.MARGIN * distance
    assert stats.t_quantile(0.5 + P.confidence() / 2, r - 2) * 0.1 / math.sqrt(r - 1) >= policy.MARGIN * distance
    assert near.seconds == pytest.approx(r * 5.0)


def test_on_its_bound_a_hypothesis_gets_the_cheapest_look_and_is_told_so():
    on = policy.choose(
        P, known(9.99, 0.2), COST, ranges={"repeat": (10, 40)}, given={"repeat": 40}, confidence=P.confidence()
    )
    assert on.replicates == 3 and not on.decides and on.counts == {"repeat": 10}
    assert "sits too close to 10" in on.why


def test_with_nothing_known_a_pilot_at_the_records_own_counts():
    pilot = policy.choose(P, None, COST, ranges={"repeat": (10, 40)}, given={"repeat": 20}, confidence=0.955)
    assert pilot.replicates == 3 and pilot.counts == {"repeat": 20} and "pilot" in pilot.why and not pilot.decides
    assert policy.pilot_counts({"repeat": (10, 40)}, {}) == {"repeat": 20}  # mid-range (geometric)


def test_the_split_of_processes_and_samples_follows_where_the_variance_is():
    """The nested design's optimum: samples per process n* = sqrt(setup/sample cost x within/between)."""
    dear_setup = [policy.Cost(setup_s=20.0, measure_s=4.0, counts={"repeat": 40})]
    cheap_setup = [policy.Cost(setup_s=0.5, measure_s=8.0, counts={"repeat": 40})]
    ranges = {"repeat": (5, 80)}
    within = policy.choose(
        P,
        known(9.0, 0.1, between=0.02, counts={"repeat": 40}),
        dear_setup,
        ranges=ranges,
        given={"repeat": 40},
        confidence=P.confidence(),
    )
    between = policy.choose(
        P,
        known(9.0, 0.1, between=0.98, counts={"repeat": 40}),
        cheap_setup,
        ranges=ranges,
        given={"repeat": 40},
        confidence=P.confidence(),
    )
    # the within-process noise dominates and a process is dear: more samples each, fewer processes
    assert within.counts["repeat"] > 40 and within.replicates <= between.replicates
    # the processes differ: samples barely help, processes do; each process as cheap as the range allows
    assert between.counts["repeat"] == 5 and between.replicates > 3
    for choice, cost, share in ((within, dear_setup, 0.02), (between, cheap_setup, 0.98)):
        as_recorded = policy.choose(
            P,
            known(9.0, 0.1, between=share, counts={"repeat": 40}),
            cost,
            ranges={"repeat": (40, 40)},
            given={"repeat": 40},
            confidence=P.confidence(),
        )
        assert choice.decides and choice.seconds < as_recorded.seconds  # the split saves seconds


def test_the_budget_leaves_out_first_what_would_not_decide_and_never_what_costs_nothing_more():
    needs = {"decides": ("a",), "sits": ("b",), "shares": ("a",), "dear": ("c",)}
    seconds = {"a": 10.0, "b": 30.0, "c": 50.0}
    have = {"a": 3, "b": 3, "c": 3}
    wanted = {"a": 6, "b": 3, "c": 3}
    decides = {"decides": True, "sits": False, "shares": False, "dear": True}
    counts, left_out, short = P.fit(policy.Ask(wanted, have, needs, seconds, decides), 200.0)
    # minimum: 30 + 90 + 150 = 270 s > 200: b goes first (none of its readers would decide); `shares`
    # would not decide either, but its execution is measured for `decides` anyway: it stays
    assert left_out == {"sits": 90.0} and counts["b"] == 0
    # 180 s spent; growing a to 6 (for both of its readers) would need 30 s more: 210 > 200, so both are
    # measured at the minimum, and say what their forecast wanted
    assert counts == {"a": 3, "b": 0, "c": 3} and short == {"decides": 30.0, "shares": 30.0}
    tight = P.fit(policy.Ask(wanted, have, needs, seconds, decides), 100.0)
    # 100 s: b (no decision), then c (one decision for 150 s) go; a's one decision for 30 s stays, and
    # the 70 s left pay for the 3 more replicates its forecast asks
    assert tight[0] == {"a": 6, "b": 0, "c": 0} and set(tight[1]) == {"sits", "dear"} and tight[2] == {}
    counts, left_out, short = P.fit(policy.Ask(wanted, have, needs, seconds, decides), 400.0)
    assert counts == {"a": 6, "b": 3, "c": 3} and left_out == {} and short == {}
    assert P.fit(policy.Ask(wanted, have, needs, seconds, decides), None)[0] == wanted


def test_a_planned_first_round_decides_more_and_is_wrong_no_more_often():
    """Known truth: 9 ms against a bound of 10 ms, 5% process offsets. Run 1 measures 3 processes and stores
    its spread; run 2 plans from it (fresh processes, its count fixed before its data). Planned, run 2
    decides more often than a second run of 3; confirmed or not, it never refutes the truth."""
    bound = expectation(kind="at_most", metric="t", unit="ms", value=10.0)
    rng = np.random.default_rng(11)
    planned_decided = plain_decided = wrong = 0
    trials = 200
    for _ in range(trials):
        first = judge(hypothesis(bound), replicates(rng, {"t": 9.0}, 3), confidence=P.confidence())
        m = first.measured
        prior = known(m.value, m.spread, edges=bound.edges(), verdict=first.verdict.value)
        r = policy.choose(P, prior, COST, ranges={}, given={}, confidence=P.confidence()).replicates
        planned = judge(hypothesis(bound), replicates(rng, {"t": 9.0}, r), confidence=P.confidence([r]))
        plain = judge(hypothesis(bound), replicates(rng, {"t": 9.0}, 3), confidence=P.confidence())
        planned_decided += planned.verdict is Verdict.CONFIRMED
        plain_decided += plain.verdict is Verdict.CONFIRMED
        wrong += planned.verdict is Verdict.REFUTED
    assert wrong == 0
    assert planned_decided > plain_decided * 1.3, (planned_decided, plain_decided)
    assert planned_decided / trials > 0.6


def test_a_stored_interval_gives_back_its_spread_in_either_format():
    """Format 9 stores the spread; an older record's is rebuilt from its interval (log or linear scale)."""
    est = stats.mean_estimate([[9.0, 9.2], [9.5, 9.4], [8.8, 8.9]])
    newer = Measured("mean", "ms", est.value, est.low, est.high, 3, 6, None, 0.95, spread=est.spread, log=est.log)
    older = Measured("mean", "ms", est.value, est.low, est.high, 3, 6, None, 0.95)
    assert priors._spread(newer) == (est.spread, True)
    rebuilt = priors._spread(older)
    assert rebuilt[1] is True and rebuilt[0] == pytest.approx(est.spread, rel=1e-9)
    diff = stats.mean_estimate([[-1.0, 2.0], [0.5, 1.5], [3.0, -0.5]])  # negative samples: linear
    linear = Measured("", "%", diff.value, diff.low, diff.high, 3, 6, None, 0.95)
    assert priors._spread(linear) == (pytest.approx(diff.spread, rel=1e-9), False)
    assert priors._spread(Measured("", "%", 1.0, 1.0, 1.0, 1, 6, None, 0.95)) is None  # one process: no spread


def test_an_execution_left_out_early_comes_back_when_a_dearer_one_left_after_it():
    """a brings 1 decision for 30 s, b 2 for 55 s, c 3 for 85 s; 90 s in all. Leaving out the fewest
    decisions per second first drops a, then c; then a fits again, and is measured."""
    needs = {"a1": ("a",), "b1": ("b",), "b2": ("b",), "c1": ("c",), "c2": ("c",), "c3": ("c",)}
    seconds = {"a": 10.0, "b": 55.0 / 3, "c": 85.0 / 3}
    have = {"a": 3, "b": 3, "c": 3}
    counts, left_out, _ = P.fit(policy.Ask(have, have, needs, seconds, dict.fromkeys(needs, True)), 90.0)
    assert counts == {"a": 3, "b": 3, "c": 0} and set(left_out) == {"c1", "c2", "c3"}


def test_the_forecast_takes_the_median_spread_of_the_last_measurements_not_one_outlier():
    """Three fit quick runs of one record: spreads 0.05, 0.9 (a run on a slowed machine), 0.06. The plan
    forecasts with 0.06 and 5.5, the medians; a full run's measurement is another mode."""
    from records import result, run_results

    from perfkit.experiment.records import history

    h = hypothesis(expectation(kind="at_most", metric="t", unit="ms", value=10.0), id="h")

    def measured(value, spread):
        return Measured("mean", "ms", value, value * 0.9, value * 1.1, 3, 30, 0.5, 0.955, spread=spread, log=True)

    runs = [
        run_results(f"r{i}", result("h", "confirmed", run_id=f"r{i}", measured=measured(v, s)), quick=quick)
        for i, (v, s, quick) in enumerate([(5.0, 0.05, True), (6.0, 0.9, True), (5.5, 0.06, True), (1.0, 0.01, False)])
    ]
    entries = history.history(runs)["h"]
    prior = priors.known(h, entries, quick=True)
    assert prior.value == 5.5 and prior.spread == 0.06 and prior.edges == (None, 10.0) and prior.run_id == "r2"
    # a last estimate that happened to sit low (9.6, against 5.0 and 6.0 before) is not the forecast's
    runs.append(run_results("r4", result("h", "confirmed", run_id="r4", measured=measured(9.6, 0.05)), quick=True))
    assert priors.known(h, history.history(runs)["h"], quick=True).value == 6.0
    assert priors.known(h, entries, quick=False).value == 1.0
    edited = hypothesis(h.expect, id="h")
    assert priors.known(type(edited)(**{**edited.__dict__, "hash": "1"}), entries, quick=True) is None  # another record


def test_an_edited_probe_is_forecast_from_its_nearest_measured_execution_not_a_flat_guess():
    """A record whose quick parameters were just edited (gen 64 -> 32) has no measurement with its key; its
    replicates are forecast from the measured execution of the same probe, by any hypothesis, sharing the
    most parameter values (the sample count scaled), not at UNKNOWN_COST_S: a flat 20 s a replicate for six
    edited records once left half a quick run's hypotheses out of its budget."""
    from types import SimpleNamespace

    from records import result, run_results

    from perfkit.experiment.records import history
    from perfkit.experiment.records.results import Execution

    def ran(notebook, wall, **params):
        return Execution(key="k", notebook=notebook, params=params, wall_s=wall, setup_s=1.0, warm=True)

    stored = [
        result("a", "confirmed", run_id="r1", executions=(ran("s.ipynb", 6.0, ctx=1024, gen=64, repeats=10),)),
        result("b", "refuted", run_id="r1", executions=(ran("s.ipynb", 11.0, ctx=32768, gen=16, repeats=5),)),
        result("c", "confirmed", run_id="r1", executions=(ran("t.ipynb", 2.0, batch=8),)),
    ]
    full = result("d", "refuted", run_id="r2", executions=(ran("s.ipynb", 40.0, ctx=32768, gen=96, repeats=5),))
    entries = history.history([run_results("r1", *stored), run_results("r2", full, quick=False)])
    edited = Execution(key="new", notebook="s.ipynb", params={"ctx": 1024, "gen": 32, "repeats": 20})
    near = priors.nearest_cost(edited, entries, {"repeats"}, warm=True)
    assert near is not None and near.setup_s == 1.0 and near.at({"repeats": 20}) == pytest.approx(1.0 + 5.0 * 2)
    assert priors.cost(edited, entries["a"], {"repeats"}, warm=True) is None  # no measurement with its own key
    never = Execution(key="u", notebook="u.ipynb", params={})
    assert priors.nearest_cost(never, entries, set(), warm=True) is None  # a probe never measured: a pilot's guess
    tie = Execution(key="t", notebook="s.ipynb", params={"text": "code"})  # as near to all three: the latest
    assert priors.nearest_cost(tie, entries, {"repeats"}, warm=True).at({"repeats": 5}) == 40.0
    quick_only = {hid: [e for e in runs if e.run.quick] for hid, runs in entries.items()}  # then the dearer
    assert priors.nearest_cost(tie, quick_only, {"repeats"}, warm=True).at({"repeats": 5}) == 11.0
    # the plan offers its own mode's runs first: a quick run is forecast at a quick run's 11 s, not 40
    setting = priors.Setting(quick=True, warm=True, fixed=set(), reusable=lambda x: 0, replan=None)
    plan = SimpleNamespace(needs={"new": ("t",)})
    assert priors._cost_of(tie, [], plan, entries, {"repeats"}, setting).at({"repeats": 5}) == 11.0
