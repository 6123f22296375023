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


# ---------------------------------------------------------------- a pool simulated on this host


SLEEPER = """import os, time
import perfkit

slowdown = float(os.environ.get("PERFKIT_SIMULATED_SLOWDOWN", "1"))  # what the simulated machine is told
samples = []
for _ in range(n):
    t0 = time.perf_counter()
    time.sleep(0.020 * slowdown)
    samples.append((time.perf_counter() - t0) * 1000)
perfkit.record("nap", samples, unit="ms")
"""

RECORD = """id: {id}
claim: A nap takes at most 25 ms.
rationale: It sleeps 20 ms; machine sim1 of the simulated pool is 50% slower.
expect:
  kind: at_most
  metric: nap
  value: 25
  unit: ms
probe:
  notebook: sleeper.ipynb
  params: {{n: 12}}
{extra}"""


#: docs/cluster.md's "Many machines" runs this pool: naps of 20 and 30 ms, each 5 ms from the bounds below, so the
#: sleeps' overshoot on a loaded machine (a fraction of a millisecond) never moves a verdict
POOL = "local:2x1:slowdown=1,1.5"
REPLICATES = 6


#: the simulated pool's machines differ by a factor of 1.5 in naps of 20 ms, checked to a few per cent against
#: docs/cluster.md's figures: a neighbour's load on the suite's two cores delays a wake-up by as much (scheduler
#: latency), so these run in the `alone` group, one at a time, after the parallel one
ALONE = pytest.mark.alone


@pytest.fixture(scope="module")
def pooled(tmp_path_factory):
    """The same claim about the pool and about every machine, measured on `local:2x1` with machine sim1
    50% slower than sim0: 3 replicates on each."""
    import nbformat
    from records import quiet_or_skip, run, shared_machine

    from perfkit.experiment.run.scaffold import probe_notebook
    from perfkit.paths import Project

    quiet_or_skip()  # naps timed to a few per cent: beside another job's busy core, not a check to make
    root = tmp_path_factory.mktemp("pool")
    (root / "hypotheses").mkdir()
    (root / "notebooks").mkdir()
    nbformat.write(probe_notebook("n: int = 5  # naps", SLEEPER), str(root / "notebooks" / "sleeper.ipynb"))
    (root / "hypotheses" / "nap-pool.yaml").write_text(RECORD.format(id="nap-pool", extra=""))
    (root / "hypotheses" / "nap-every.yaml").write_text(RECORD.format(id="nap-every", extra="machines: every\n"))
    held = RECORD.format(id="nap-every-35", extra="machines: every\n").replace("value: 25\n", "value: 35\n")
    (root / "hypotheses" / "nap-every-35.yaml").write_text(held.replace("at most 25 ms", "at most 35 ms"))
    project = Project(root)
    lines: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        shared_machine(mp)
        report = run(
            project,
            all=True,
            replicates=REPLICATES,
            budget_s=0,
            timeout_s=120,
            cluster=POOL,
            out=lines.append,
        )
    return project, report, lines


@ALONE
def test_replicates_on_a_simulated_pool_name_their_machines_evenly(pooled):
    project, report, lines = pooled
    assert any("2 workers on 2 machines simulated on this host (sim0, sim1)" in line for line in lines), lines[:5]
    executions = [x for h in report.results.hypotheses for x in h.executions]
    by_machine = {}
    for x in executions:
        by_machine.setdefault(x.machine_id, set()).add(x.replicate)
    assert len(by_machine) == 2 and all(i.endswith(("/sim0", "/sim1")) for i in by_machine)
    assert sorted(len(r) for r in by_machine.values()) == [3, 3]  # each machine a share of every execution
    assert by_machine[min(by_machine)] | by_machine[max(by_machine)] == set(range(6))


@ALONE
def test_the_pool_claim_reports_the_machines_apart_and_a_row_per_machine(pooled):
    project, report, _ = pooled
    result = {h.id: h for h in report.results.hypotheses}["nap-pool"]
    m = result.measured
    assert m.machines == 2 and m.replicates == 6
    assert 0.28 < m.between_machines < 0.38, m  # 20 against 30 ms: the two machine means 33% apart (sd)
    assert "on 2 machines" in m.evidence()
    rows = {row.machine.rsplit("/", 1)[1]: row for row in result.per_machine}
    assert set(rows) == {"sim0", "sim1"}
    slow, fast = rows["sim1"].measured.value, rows["sim0"].measured.value
    assert 1.42 < slow / fast < 1.52, (slow, fast)  # the 50% the simulation put there (less the sleeps' overshoot)
    ledger = (project.root / "hypotheses" / "LEDGER.md").read_text()
    assert "per machine" in ledger and "/sim1" in ledger


@ALONE
def test_a_claim_that_holds_on_every_machine_is_confirmed_though_the_pools_interval_is_wide(pooled):
    _, report, _ = pooled
    result = {h.id: h for h in report.results.hypotheses}["nap-every-35"]
    assert {row.verdict for row in result.per_machine} == {"confirmed"}
    assert result.verdict == "confirmed" and result.off_by == "confirmed on each of the 2 machines"
    assert result.measured.high > 35  # the pool's own interval (two machines) straddles the bound


@ALONE
def test_a_claim_about_every_machine_is_decided_by_the_worst(pooled):
    _, report, _ = pooled
    result = {h.id: h for h in report.results.hypotheses}["nap-every"]
    verdicts = {row.machine.rsplit("/", 1)[1]: row.verdict for row in result.per_machine}
    assert verdicts == {"sim0": "confirmed", "sim1": "refuted"}, result.per_machine
    assert result.verdict == "refuted" and "on every machine" in result.reason and "/sim1" in result.reason


def test_a_pool_spec_is_checked_before_anything_starts():
    from perfkit.errors import UserError
    from perfkit.experiment.run.cluster import Simulated

    assert Simulated.parse("local:3") == Simulated(1, 3, (1.0,))
    assert Simulated.parse("local:2x2:slowdown=1,1.5") == Simulated(2, 2, (1.0, 1.5))
    for bad in ("local:0", "local:2x", "local:2x1:slowdown=1", "local:2x1:speed=1,2", "local:2x1:slowdown=1,-2"):
        with pytest.raises(UserError, match="local:MxN"):
            Simulated.parse(bad)


# ---------------------------------------------------------------- judged from executions of known truth


def _on(machine: str, replicate: int, mean: float, seed: int):
    from records import execution, metric

    return execution(
        metric("t", mean, seed=seed),
        replicate=replicate,
        machine={"id": machine, "host": f"node-{machine}", "cpu": "EPYC", "gpus": []},
    )


def test_a_machine_apart_from_the_pool_is_named_and_every_machine_has_its_row():
    from records import hypothesis

    from perfkit.experiment.records.kinds import expectation
    from perfkit.experiment.run.judging import judge

    h = hypothesis(expectation(kind="cost", metric="t", unit="ms", value=10.0, factor=2.0))
    means = {"a": 10.0, "b": 10.1, "c": 9.9, "d": 13.0}  # node d is 30% slow
    executions = [_on(m, i * 2 + k, mean, seed=i * 2 + k) for i, (m, mean) in enumerate(means.items()) for k in (0, 1)]
    judgement = judge(h, executions)
    assert [m.machine for m in judgement.per_machine] == ["a", "b", "c", "d"]
    assert judgement.measured.machines == 4
    said = [w for w in judgement.warnings if w.startswith("machine ")]
    assert len(said) == 1 and "node-d (EPYC) (d) measured 13" in said[0], judgement.warnings


def test_replicates_of_one_machine_keep_the_single_machine_path():
    from records import hypothesis

    from perfkit.experiment.records.kinds import expectation
    from perfkit.experiment.run.judging import judge

    h = hypothesis(expectation(kind="cost", metric="t", unit="ms", value=10.0, factor=2.0))
    judgement = judge(h, [_on("a", r, 10.0, seed=r) for r in range(3)])
    assert judgement.per_machine == () and judgement.measured.machines is None
    assert judgement.verdict.value == "confirmed"


@ALONE
def test_per_machine_on_the_command_line_makes_every_claim_one_about_every_machine(pooled):
    """`--per-machine` judges the pool claim as `machines: every` does: the measurements are reused."""
    import argparse

    from records import run, shared_machine

    from perfkit.experiment.run import options

    parser = argparse.ArgumentParser()
    options.add_arguments(parser)
    assert options.from_args(parser.parse_args(["--all", "--per-machine"]), command="run").per_machine
    project, _, _ = pooled
    with pytest.MonkeyPatch.context() as mp:
        shared_machine(mp)
        again = run(
            project,
            ids=["nap-pool"],
            replicates=6,
            budget_s=0,
            cluster=POOL,
            per_machine=True,
            out=lambda line: None,
        )
    (result,) = again.results.hypotheses
    assert again.executed == 0 and result.verdict == "refuted" and "on every machine" in result.reason


@ALONE
def test_show_lists_each_machine_and_where_each_replicate_ran(pooled):
    from perfkit.experiment.outputs.show import describe

    project, _, _ = pooled
    text = describe(project, "nap-every")
    assert "== per machine (2)" in text
    assert "/sim1]: refuted, 30." in text and "/sim0]: confirmed, 20." in text
    assert text.count("/sim0, run ") == 3 and text.count("/sim1, run ") == 3  # each replicate says its machine


@ALONE
def test_the_readme_runs_this_pool_and_says_what_it_measured(pooled):
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "docs" / "cluster.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- example many-machines[^>]*-->\n\s*```sh\n\s*(.*?)\n\s*```", readme, re.S)
    assert block, "docs/cluster.md lost its 'Many machines' block"
    assert block.group(1).split() == ["perfkit", "run", "--all", "--replicates", str(REPLICATES), "--cluster", POOL]
    _, report, _ = pooled
    results = {h.id: h for h in report.results.hypotheses}
    rows = {row.machine.rsplit("/", 1)[1]: row.measured.value for row in results["nap-pool"].per_machine}
    said = re.search(r"at ([\d.]+) ms on sim0 and ([\d.]+) ms on sim1", readme)
    assert said, "the section no longer says what each machine measured"
    for name, value in zip(("sim0", "sim1"), said.groups()):
        assert abs(float(value) / rows[name] - 1) < 0.03, (name, value, rows)  # this machine's figures, give or take
    assert "machines: every" in readme and "--per-machine" in readme


# ---------------------------------------------------------------- comparisons across machines


def _measured_on(machine: str, value: float, *, width: float = 0.02, spread: float | None = None):
    from records import result

    from perfkit.experiment.records.results import Execution
    from perfkit.experiment.records.verdict import Measured

    measured = Measured(
        "mean", "ms", value, value * (1 - width), value * (1 + width), replicates=3, between_machines=spread
    )
    execution = Execution(
        key="same-key", notebook="p.ipynb", params={}, status="ok", run_id="r", machine={"id": machine, "host": machine}
    )
    return result("h", "confirmed", value, measured=measured, executions=(execution,))


def test_another_machine_of_the_same_kind_is_a_machine_change_not_a_failure_to_reproduce():
    from perfkit.experiment.run.judging import changed, not_reproduced

    then, now = _measured_on("node-a", 10.0), _measured_on("node-b", 10.6)  # 6% apart, intervals disjoint
    assert not_reproduced(now, then, "r0") is None  # the keys are equal, but the machine is another
    note = changed(now, then, "r0", [])
    assert note.startswith("the machine changed (node-a -> node-b, another of the same kind)")
    assert "how much machines of this kind differ is not known yet" in note and "6% higher than 10 ms" in note


def test_a_gap_beyond_the_pools_spread_is_not_reproduced_even_across_machines():
    from perfkit.experiment.run.judging import changed, not_reproduced

    then = _measured_on("node-a", 10.0, spread=0.02)  # a pool run found machines 2% apart
    assert not_reproduced(_measured_on("node-b", 10.3), then, "r0") is None  # 3%: within twice the spread
    far = not_reproduced(_measured_on("node-b", 13.0), then, "r0")  # 30%
    assert far and "farther apart than the pool's machines are (2% sd)" in far
    assert "the pool's machines differ by 2% (sd)" in changed(_measured_on("node-b", 13.0), then, "r0", [])
    same = not_reproduced(_measured_on("node-a", 13.0), then, "r0")  # the same machine: as before
    assert same and "equal execution keys" in same


def test_the_fixture_hypotheses_on_two_simulated_machines_name_both_and_get_a_row_each(tmp_path):
    """The project's fixture hypotheses (a cost, a scaling, a speedup) on `local:2x1`: every
    replicate names its machine, each measured figure carries the machines' spread, the ledger a row each."""
    from records import fixture_project, run, shared_machine

    ids = ["fx-cost-confirmed", "fx-scaling", "fx-speedup"]  # a mean, an exponent over a sweep, a ratio
    project = fixture_project(tmp_path / "p", *ids)
    with pytest.MonkeyPatch.context() as mp:
        shared_machine(mp)
        report = run(project, ids=ids, quick=True, replicates=2, budget_s=0, cluster="local:2x1", out=lambda _: None)
    for h in report.results.hypotheses:
        assert len({x.machine_id for x in h.executions}) == 2, h.id
        assert h.measured.machines == 2 and h.measured.between_machines is not None, (h.id, h.measured)
        assert len(h.per_machine) == 2 and all(row.measured for row in h.per_machine), h.id
    ledger = (project.root / "hypotheses" / "LEDGER.md").read_text()
    assert ledger.count("<details><summary>per machine: 2 machines</summary>") == len(ids)
