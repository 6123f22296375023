"""Verdicts of known truth measured through foreign load, by simulation: what `fitness = "shared"` (the
default) must get right. Each simulated replicate is one process with its own offset and slow drift,
timing its arms interleaved in turns, as the shipped probes do, while a neighbour loads the machine:

- steady: a busy loop on another core the whole time. The probe's one thread keeps its core; caches
  and memory bandwidth it shares cost each process a little (0 to 6%, a process's own draw).
- bursty: a neighbour 3 s on, 3 s off. Now and then a burst lands on the probe's core (the scheduler
  moves a thread), and every sample in it is 1.3 to 2.5x slower.
- unequal: the same, but bursts as short as one arm's stretch of a turn: they hit one arm and not the
  other, so interleaving cannot cancel them within the turn.

The truth is what a quiet machine would measure. A wrong confirmation or refutation must stay at or below
5%, and a speedup's interval must cover its true value about 95% of the time, with the load present. An
absolute time measured under load is the loaded machine's (what a whole run slowed alike cannot be told
from the code): its verdict is decided against the claim only with the load's share to spare.
"""

from dataclasses import replace

import numpy as np
import pytest
from records import execution, hypothesis

from perfkit.experiment.records.kinds import expectation
from perfkit.experiment.records.verdict import Verdict
from perfkit.experiment.run.judging import gather, judge, judged
from perfkit.samples import MetricRecord

LOADS = ("quiet", "steady", "bursty", "unequal")


def _slowdowns(rng, load: str, n: int, block: int) -> tuple[np.ndarray, float]:
    """Per sample, how much slower the neighbour made it, and the foreign cores the replicate records."""
    slow = np.ones(n)
    if load == "quiet":
        return slow, float(rng.uniform(0.0, 0.05))
    if load == "steady":
        return slow * (1 + rng.uniform(0.0, 0.06)), float(rng.uniform(0.9, 1.05))
    length = block if load == "unequal" else 4 * block  # a burst: one arm's stretch, or two whole turns
    phase = int(rng.integers(0, 2 * length))
    on = 0
    for start in range(-phase, n, 2 * length):
        on += 1
        if rng.random() < 0.3:  # this burst shares the probe's core
            slow[max(0, start) : max(0, start + length)] *= rng.uniform(1.3, 2.5)
    return slow, float(np.clip(rng.normal(0.5, 0.1), 0.0, 2.0))


def probe(rng, arms: dict[str, float], r: int, *, load: str, per_turn: int = 5, turns: int = 8, offset_sd=0.04):
    """`r` replicates timing `arms` (name -> true mean, ms) in `turns` turns of `per_turn` calls each, the
    arms' order alternating from turn to turn, under `load`; each replicate records the load it ran under."""
    out = []
    names = list(arms)
    n = per_turn * turns * len(names)
    for i in range(r):
        offset = 1 + rng.normal(0, offset_sd)  # the process's own: allocator, layout, page faults
        own = {a: 1 + rng.normal(0, offset_sd / 2) for a in names}  # and what differs between its arms
        slow, cores = _slowdowns(rng, load, n, per_turn)
        drift = np.cumsum(rng.normal(0, 0.004, n))  # slow drift inside the process
        samples: dict[str, list[float]] = {a: [] for a in names}
        t = 0
        for turn in range(turns):
            for a in names if turn % 2 == 0 else names[::-1]:
                for _ in range(per_turn):
                    noise = 1 + 0.05 * float(np.clip(rng.standard_t(4), -6, 6)) / np.sqrt(2)  # t(4): heavy tails
                    samples[a].append(arms[a] * offset * own[a] * (1 + drift[t]) * noise * slow[t])
                    t += 1
        records = [MetricRecord(name=a, unit="ms", samples=tuple(float(s) for s in samples[a])) for a in names]
        top = [{"pid": 99, "name": "busy", "percent": 100 * cores}]
        out.append(
            execution(*records, replicate=i, load={"cores": round(cores, 3), "of": 2, "busy_share": 0.0, "top": top})
        )
    return out


def tally(expect, draw, trials=300, seed=7):
    rng = np.random.default_rng(seed)
    counts = {v: 0 for v in Verdict}
    for _ in range(trials):
        counts[judge(hypothesis(expect), draw(rng)).verdict] += 1
    return {v: n / trials for v, n in counts.items()}


@pytest.mark.parametrize("load", LOADS)
def test_a_speedup_measured_through_load_is_never_wrongly_decided_and_its_interval_covers_the_truth(load):
    claim = expectation(kind="speedup", baseline="slow", candidate="fast", at_least=3.0)
    true = tally(claim, lambda rng: probe(rng, {"slow": 10.0, "fast": 10.0 / 3.6}, 5, load=load))  # 20% clear
    false = tally(claim, lambda rng: probe(rng, {"slow": 10.0, "fast": 10.0 / 2.5}, 5, load=load))
    assert true[Verdict.REFUTED] <= 0.05 and false[Verdict.CONFIRMED] <= 0.05, (true, false)
    assert true[Verdict.CONFIRMED] >= 0.5 and false[Verdict.REFUTED] >= 0.5, (true, false)
    rng = np.random.default_rng(13)
    covered = 0
    trials = 300
    for _ in range(trials):
        m = judge(hypothesis(claim), probe(rng, {"slow": 10.0, "fast": 10.0 / 3.6}, 5, load=load)).measured
        covered += m.low <= 3.6 <= m.high
    assert 0.9 <= covered / trials <= 0.995, covered / trials


@pytest.mark.parametrize("load", LOADS)
def test_a_bound_measured_through_load_is_never_wrongly_decided(load):
    bound = expectation(kind="at_most", metric="t", unit="ms", value=10.0)
    holds = tally(bound, lambda rng: probe(rng, {"t": 8.5}, 5, load=load))  # 15% inside the bound
    fails = tally(bound, lambda rng: probe(rng, {"t": 11.5}, 5, load=load))  # 15% outside
    assert holds[Verdict.REFUTED] <= 0.05 and fails[Verdict.CONFIRMED] <= 0.05, (holds, fails)
    assert fails[Verdict.REFUTED] >= 0.5, fails  # load only slows: a bound that fails is refuted through it
    if load in ("quiet", "steady"):
        assert holds[Verdict.CONFIRMED] >= 0.5, holds  # what a quiet machine decides, one core taken decides too


def test_a_refutation_the_load_could_explain_is_inconclusive_and_says_what_would_decide():
    bound = expectation(kind="at_most", metric="t", unit="ms", value=10.0)
    rng = np.random.default_rng(3)
    quiet = probe(rng, {"t": 11.0}, 5, load="quiet", offset_sd=0.01)
    assert judge(hypothesis(bound), quiet).verdict is Verdict.REFUTED  # 10% over, on a quiet machine
    busy = [replace(x, load={**x.load, "cores": 1.0}) for x in quiet]  # the same figures under one core of load
    j = judge(hypothesis(bound), busy)
    assert j.verdict is Verdict.INCONCLUSIVE and j.off_by is None
    assert (
        "while other processes used 1.0 of 2 cores (pid 99 busy, " in j.reason
        and "during 5 of 5 replicates" in j.reason
    )
    assert "by up to 1.1x at that load" in j.reason and "A quieter machine would" in j.reason
    far = [replace(x, load={**x.load, "cores": 1.0}) for x in probe(rng, {"t": 20.0}, 5, load="quiet")]
    assert judge(hypothesis(bound), far).verdict is Verdict.REFUTED  # 2x over: more than the load can explain
    speedup = expectation(kind="speedup", baseline="t", candidate="u", at_most=1.05)
    pair = [
        replace(x, load={**x.load, "cores": 1.0})
        for x in probe(rng, {"t": 12.0, "u": 10.0}, 5, load="quiet", offset_sd=0.01)
    ]
    assert judge(hypothesis(speedup), pair).verdict is Verdict.REFUTED  # a comparison within the process stands


def test_an_undecided_verdict_under_load_names_the_load_and_the_replicates_that_would_decide_it():
    bound = expectation(kind="at_most", metric="t", unit="ms", value=10.0)
    rng = np.random.default_rng(21)
    for _ in range(50):
        j = judge(hypothesis(bound), probe(rng, {"t": 9.6}, 3, load="steady"))
        if j.needed:
            break
    assert j.verdict is Verdict.INCONCLUSIVE and j.needed
    assert f"about {j.needed} replicates would likely decide it (3 ran); other processes used " in j.reason
    assert j.reason.endswith(
        "during 3 of 3 replicates: that forecast is at this load, and a quieter machine would narrow it"
    )


def test_a_replicate_apart_is_left_out_only_when_its_load_explains_it():
    rng = np.random.default_rng(5)
    reps = probe(rng, {"t": 10.0}, 6, load="quiet", offset_sd=0.01)
    slowed = MetricRecord(name="t", unit="ms", samples=tuple(2.2 * s for s in reps[2].records[0].samples))
    hit = replace(reps[2], records=(slowed,), load={**reps[2].load, "cores": 1.0})
    evidence = gather([*reps[:2], hit, *reps[3:]], None)
    assert [len(p.replicates) for p in evidence.points] == [5]
    assert evidence.left_out.startswith("left out, as the load explains it: replicate 2 of p.ipynb: its t was 2.2")
    assert "while other processes used 1.0 of 2 cores (the others: 0.0 to 0.0)" in evidence.left_out
    unexplained = replace(hit, load=reps[2].load)  # as far off, but nothing else ran: it stays, and widens it
    evidence = gather([*reps[:2], unexplained, *reps[3:]], None)
    assert evidence.left_out is None and [len(p.replicates) for p in evidence.points] == [6]


def test_strict_refuses_loaded_replicates_and_says_what_measuring_through_would_give():
    bound = expectation(kind="at_most", metric="t", unit="ms", value=10.0)
    rng = np.random.default_rng(8)
    busy = "machine busy: 1.0 of 2 cores used by other processes on average"
    reps = [replace(x, unfit=busy) for x in probe(rng, {"t": 5.0}, 3, load="steady")]
    j = judged(hypothesis(bound), reps).judgement
    assert j.verdict is Verdict.INCONCLUSIVE and j.reason.startswith(
        "the machine was not fit to measure on: machine busy"
    )
    assert "measured through the load, these replicates give 5" in j.reason and ": confirmed;" in j.reason
    assert 'fitness = "shared" in [tool.perfkit] (the default) measures through load' in j.reason
