"""Units load cannot move: the CPU time of the probe's process (`clock="cpu"`, unit `cpu_ms`), each its own
dimension so that a claim in ms is never judged with it; and arms timed in turns (`perfkit.interleave`)."""

import shutil
import threading
import time

import numpy as np
import pytest
from records import execution, hypothesis

import perfkit
from perfkit import interleave, units
from perfkit.errors import UserError
from perfkit.experiment.records.kinds import expectation
from perfkit.experiment.records.verdict import Verdict
from perfkit.experiment.run.judging import judge
from perfkit.probe.timing import bench
from perfkit.samples import MetricRecord


def test_cpu_time_does_not_count_waiting_and_wall_time_does():
    wall = bench(lambda: time.sleep(0.02), warmup=0, repeat=3)
    cpu = bench(lambda: time.sleep(0.02), warmup=0, repeat=3, clock="cpu")
    assert min(wall) >= 0.019 and max(cpu) < 0.005, (wall, cpu)  # a sleeping process spends no CPU
    spin = bench(lambda: sum(range(200_000)), warmup=1, repeat=3, clock="cpu")
    assert min(spin) > 0
    with pytest.raises(ValueError, match="clock must be one of wall, cpu, got 'gpu'"):
        bench(lambda: None, clock="gpu")


def test_cpu_time_and_instructions_are_dimensions_of_their_own():
    assert units.dimension("cpu_ms") == "cpu_time" and units.dimension("Minstr") == "instructions"
    assert units.convert([1500.0], "cpu_us", "cpu_ms") == [1.5] and units.convert([2.0], "Ginstr", "Minstr") == [2000.0]
    with pytest.raises(UserError, match=r"cannot convert cpu_ms \(cpu_time\) to ms \(time\)"):
        units.factor("cpu_ms", "ms")
    bound = expectation(kind="at_most", metric="t", unit="ms", value=10.0)  # a claim in wall milliseconds
    cpu = [
        execution(MetricRecord(name="t", unit="cpu_ms", samples=(5.0, 5.1, 4.9, 5.0, 5.2)), replicate=i)
        for i in range(3)
    ]
    j = judge(hypothesis(bound), cpu)
    assert j.verdict is Verdict.ERROR and "cpu_ms" in j.reason  # never judged in another clock's unit


def test_a_claim_in_cpu_time_is_decided_under_load_that_would_leave_wall_time_undecided():
    rng = np.random.default_rng(2)
    starved = {"cores": 1.6, "of": 2, "busy_share": 0.9, "top": []}  # its one thread waited for a core

    def reps(unit):
        return [
            execution(MetricRecord(name="t", unit=unit, samples=tuple(12.5 * (1 + 0.01 * rng.standard_normal(30)))),
                      replicate=i, threads=1, load=starved)
            for i in range(3)
        ]  # fmt: skip

    wall = judge(hypothesis(expectation(kind="at_most", metric="t", unit="ms", value=10.0)), reps("ms"))
    cpu = judge(hypothesis(expectation(kind="at_most", metric="t", unit="cpu_ms", value=10.0)), reps("cpu_ms"))
    assert wall.verdict is Verdict.INCONCLUSIVE and "by up to 1.8x at that load" in wall.reason
    assert cpu.verdict is Verdict.REFUTED  # the wait for a core is not in CPU time
    counted = judge(hypothesis(expectation(kind="at_most", metric="t", unit="Minstr", value=10.0)), reps("Minstr"))
    assert counted.verdict is Verdict.REFUTED  # nor is anything else load does in instructions


def test_interleave_takes_the_arms_in_turns_in_alternating_order_from_either_end():
    calls = []
    arms = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    got = interleave(arms, turns=4, repeat=8, warmup=1, inner=1)
    assert [len(got["a"]), len(got["b"])] == [8, 8]
    runs = [c for i, c in enumerate(calls) if i == 0 or calls[i - 1] != c]
    assert runs == ["a", "b", "a", "b", "a"]  # a a a b b b (warm-up + 2 each), then b b a a, a a b b, b b a a
    assert calls[:3] == ["a"] * 3 and calls[3:6] == ["b"] * 3 and calls[6:8] == ["b"] * 2
    calls.clear()
    interleave(arms, turns=2, repeat=2, warmup=0, replicate=1, inner=1)
    assert calls == ["b", "a", "a", "b"]  # an odd replicate starts from the other end
    with pytest.raises(ValueError, match="at least one arm"):
        interleave({})


def test_a_slow_spell_falls_on_both_interleaved_arms_and_the_speedup_says_how_it_was_paired():
    """A neighbour's burst for the middle of the measurement: taken one arm after the other, the second
    arm bears it all; taken in turns, both arms share it and their ratio stays near the truth (2x)."""
    slow = threading.Event()

    def work(ms):
        return lambda: time.sleep(ms / 1e3 * (3 if slow.is_set() else 1))

    def spell(start, length):
        timer = threading.Timer(start, slow.set)
        timer.start()
        threading.Timer(start + length, slow.clear).start()

    arms = {"slow": work(4.0), "fast": work(2.0)}
    spell(0.25, 0.35)
    paired = interleave(arms, turns=10, repeat=40, warmup=0)
    time.sleep(0.4)
    ratio = np.mean(paired["slow"]) / np.mean(paired["fast"])
    assert 1.5 < ratio < 2.7, ratio
    claim = expectation(kind="speedup", baseline="slow", candidate="fast", at_least=1.2)
    rec = [execution(MetricRecord(name=n, unit="s", samples=tuple(v)) for n, v in paired.items())]
    measured = judge(
        hypothesis(claim),
        [execution(*[MetricRecord(name=n, unit="s", samples=tuple(v)) for n, v in paired.items()], replicate=0)],
    ).measured
    assert (
        measured.paired
        == "arms paired within one process (each one's ratio of its arms' means, over batches of its samples)"
    )
    assert rec


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="needs valgrind (.ci/run installs it)")
def test_instructions_counted_under_cachegrind_scale_with_the_work_and_name_a_failure():
    """Twice the additions, about twice the instructions per call, whatever else the machine is doing
    (the suite's other worker runs beside this test): the count is the simulator's, not the clock's."""
    once = perfkit.instructions("sum(range(n))", setup="n = 1000", number=100, samples=1)
    twice = perfkit.instructions("sum(range(n))", setup="n = 2000", number=100, samples=1)
    assert 1.8 < twice[0] / once[0] < 2.5 and once[0] > 10_000, (once, twice)
    with pytest.raises(RuntimeError, match="(?s)the statement failed under valgrind.*ZeroDivisionError"):
        perfkit.instructions("1 / 0", number=1, samples=1)
    with pytest.raises(SyntaxError):
        perfkit.instructions("def (", number=1)
