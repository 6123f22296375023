"""bench(inner="auto"): how many calls a sample averages, chosen after the warm-up by the sample's own clock.

Counts and structure only, on stand-in clocks whose time the timed function itself moves (no threshold
on this machine's real timings). `python tests/test_bench_calibration.py` prints what the target
constant rests on: each host clock's cost per read and the smallest step seen between two reads.
"""

from __future__ import annotations

import sys
import time
import types

import pytest

from perfkit import interleave
from perfkit.probe import timing
from perfkit.probe.timing import CALIBRATION_MAX_S, MAX_INNER, TARGET_SAMPLE_S, Samples, bench


class FakeClock:
    """A clock that reads `t`, and costs `read_s` a read (the read's own time falls inside a sample)."""

    def __init__(self, read_s: float = 50e-9):
        self.t = 0.0
        self.read_s = read_s

    def __call__(self) -> float:
        now = self.t
        self.t += self.read_s
        return now


class Work:
    """A call that costs `cost_s` (each clock in `clocks` moves that far) and counts itself."""

    def __init__(self, cost_s: float, *clocks: FakeClock):
        self.cost_s = cost_s
        self.clocks = clocks
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1
        for clock in self.clocks:
            clock.t += self.cost_s


@pytest.fixture
def wall(monkeypatch):
    clock = FakeClock()
    monkeypatch.setitem(timing.CLOCKS, "wall", clock)
    monkeypatch.setitem(sys.modules, "torch", None)  # no CUDA: the host clock, whatever this machine has
    return clock


def doubled_up_to(n: int) -> int:
    """Calls a calibration that ends at count n made: 1 + 2 + 4 + ... + n."""
    return 2 * n - 1


def test_a_sub_microsecond_call_is_calibrated_to_samples_of_at_least_the_target(wall, capsys):
    fn = Work(0.2e-6, wall)
    samples = bench(fn, warmup=3, repeat=5)
    assert isinstance(samples, Samples) and isinstance(samples, list)
    assert samples.inner == 8192  # 4096 calls take 0.82 ms by this clock, 8192 take 1.6 ms
    assert len(samples) == 5 and all(isinstance(s, float) for s in samples)
    assert all(s * samples.inner >= TARGET_SAMPLE_S for s in samples)  # each sample's batch, by the clock
    assert all(s == pytest.approx(0.2e-6, rel=1e-3) for s in samples)  # seconds per call, as before
    assert fn.calls == 3 + doubled_up_to(8192) + 5 * 8192
    err = capsys.readouterr().err
    assert err.splitlines() == ["bench: 8192 calls per sample (one call takes about 0.2 us; a sample at least 1 ms)"]


def test_a_call_longer_than_the_target_keeps_one_call_and_is_timed_as_before(wall, capsys):
    fn = Work(5e-3, wall)
    samples = bench(fn, warmup=2, repeat=4)
    assert samples.inner == 1 and len(samples) == 4
    assert fn.calls == 2 + 4  # the calibration's one timed call is the first sample: no call added
    assert all(s == pytest.approx(5e-3, rel=1e-4) for s in samples)  # and the clock's one read
    assert capsys.readouterr().err == ""


def test_a_real_sleep_keeps_one_call_per_sample(capsys):
    samples = bench(lambda: time.sleep(0.002), warmup=0, repeat=2)  # sleeps at least 2 ms: over the target
    assert samples.inner == 1 and len(samples) == 2
    assert capsys.readouterr().err == ""


def test_an_explicit_inner_is_never_changed(wall, capsys):
    for inner in (1, 7):
        fn = Work(0.2e-6, wall)
        samples = bench(fn, warmup=1, repeat=3, inner=inner)
        assert samples.inner == inner and len(samples) == 3
        assert fn.calls == 1 + 3 * inner  # nothing timed to calibrate
    slow = Work(5e-3, wall)
    assert bench(slow, warmup=0, repeat=2, inner=4).inner == 4  # nor lowered for a long call
    assert slow.calls == 8
    assert capsys.readouterr().err == ""


def test_min_time_and_max_samples_mean_what_they_did(wall):
    fn = Work(0.2e-6, wall)
    samples = bench(fn, warmup=0, repeat=2, min_time_s=0.0101)  # by the clock: 1.64 ms a sample
    assert samples.inner == 8192 and len(samples) == 7  # more samples until the measured time passes 10.1 ms
    capped = bench(Work(0.2e-6, wall), warmup=0, repeat=2, min_time_s=60.0, max_samples=9)
    assert len(capped) == 9
    slow = Work(4e-3, wall)
    got = bench(slow, warmup=0, repeat=2, min_time_s=0.0199)  # the first sample (the calibration's) counts
    assert len(got) == 5 and slow.calls == 5


def test_calibration_is_bounded_by_the_count_cap(wall, monkeypatch, capsys):
    monkeypatch.setattr(timing, "MAX_INNER", 64)
    free = Work(0.0)  # costs nothing by the clock: only the clock's reads move it
    samples = bench(free, warmup=0, repeat=2)
    assert samples.inner == 64 and free.calls == doubled_up_to(64) + 2 * 64
    assert "bench: 64 calls per sample" in capsys.readouterr().err
    assert MAX_INNER == 1 << 20


def test_calibration_is_bounded_in_wall_time_when_the_cpu_clock_barely_moves(monkeypatch, capsys):
    """A call that waits (a sleep, by the CPU clock): doubling for the CPU clock's sake would run for long."""
    wall, cpu = FakeClock(), FakeClock()
    monkeypatch.setitem(timing.CLOCKS, "wall", wall)
    monkeypatch.setitem(timing.CLOCKS, "cpu", cpu)
    fn = Work(0.02, wall)  # 20 ms of waiting a call; the CPU clock moves only by its reads
    samples = bench(fn, warmup=0, repeat=2, clock="cpu")
    # 1 call (20 ms), 2 calls (60 ms in all); 4 more would pass CALIBRATION_MAX_S (0.1 s): it stops at 2
    assert CALIBRATION_MAX_S == 0.1
    assert samples.inner == 2 and fn.calls == doubled_up_to(2) + 2 * 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("bench: 2 calls per sample (") and "0.1 s bound" in err[0]


class FakeCudaEvent:
    def __init__(self, device: FakeClock, enable_timing: bool = False):
        assert enable_timing
        self.device = device
        self.at = None

    def record(self):
        self.at = self.device()

    def elapsed_time(self, end) -> float:
        return (end.at - self.at) * 1e3  # ms, as torch's


def fake_torch(device: FakeClock, synced: list):
    cuda = types.SimpleNamespace(
        is_available=lambda: True,
        is_initialized=lambda: True,
        Event=lambda enable_timing=False: FakeCudaEvent(device, enable_timing),
        synchronize=lambda: synced.append(1),
    )
    return types.SimpleNamespace(cuda=cuda)


def test_the_cuda_events_path_calibrates_by_the_events(monkeypatch, capsys):
    device, synced = FakeClock(read_s=1e-6), []  # 1 us to record an event
    monkeypatch.setitem(sys.modules, "torch", fake_torch(device, synced))
    kernel = Work(2e-6, device)  # 2 us of device time a call; the host clock is not moved
    samples = bench(kernel, warmup=1, repeat=3, sync="cuda")
    assert samples.inner == 512  # 256 calls: 0.513 ms between the events; 512: 1.025 ms
    assert kernel.calls == 1 + doubled_up_to(512) + 3 * 512
    assert all(s * samples.inner >= TARGET_SAMPLE_S for s in samples)
    assert "bench: 512 calls per sample" in capsys.readouterr().err
    long_kernel = Work(3e-3, device)
    got = bench(long_kernel, warmup=0, repeat=3, sync="cuda")
    assert got.inner == 1 and len(got) == 3 and long_kernel.calls == 3
    assert got == pytest.approx([3.001e-3] * 3)
    assert capsys.readouterr().err == ""


def test_interleave_calibrates_each_arm_once_and_keeps_its_count(wall, monkeypatch, capsys):
    asked = []
    real = timing.bench

    def spy(fn, **options):
        asked.append((fn, options["inner"]))
        return real(fn, **options)

    monkeypatch.setattr(timing, "bench", spy)
    fast, slow = Work(0.2e-6, wall), Work(0.5e-6, wall)
    got = interleave({"fast": fast, "slow": slow}, turns=4, repeat=8, warmup=1)
    assert [len(got["fast"]), len(got["slow"])] == [8, 8]
    assert got["fast"].inner == 8192 and got["slow"].inner == 2048  # 0.5 us: 2048 calls take 1.02 ms
    by_arm = {"fast": [i for f, i in asked if f is fast], "slow": [i for f, i in asked if f is slow]}
    assert by_arm == {"fast": ["auto", 8192, 8192, 8192], "slow": ["auto", 2048, 2048, 2048]}
    assert fast.calls == 1 + doubled_up_to(8192) + 8 * 8192  # calibrated once, on the first turn
    assert slow.calls == 1 + doubled_up_to(2048) + 8 * 2048
    assert capsys.readouterr().err.splitlines() == [
        "bench: 8192 calls per sample (one call takes about 0.2 us; a sample at least 1 ms)",
        "bench: 2048 calls per sample (one call takes about 0.5 us; a sample at least 1 ms)",
    ]


def test_interleave_passes_an_explicit_inner_to_every_turn(wall, capsys):
    fn = Work(0.2e-6, wall)
    got = interleave({"a": fn}, turns=3, repeat=3, warmup=0, inner=5)
    assert got["a"].inner == 5 and fn.calls == 3 * 5
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("bad", [0, -1, 2.0, "4", "AUTO", None, True])
def test_bad_inner_values_raise(bad):
    with pytest.raises(ValueError, match=r'inner must be "auto" or an int >= 1, got '):
        bench(lambda: None, warmup=0, repeat=1, inner=bad)
    with pytest.raises(ValueError, match=r'inner must be "auto" or an int >= 1, got '):
        interleave({"a": lambda: None}, turns=1, repeat=1, warmup=0, inner=bad)


def clock_costs(reads: int = 200_000) -> None:
    """Print each host clock's cost per read and the smallest step seen between two reads."""
    for name in ("perf_counter", "process_time"):
        clock = getattr(time, name)
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(reads):
                clock()
            best = min(best, (time.perf_counter() - t0) / reads)
        steps, prev = [], clock()
        while len(steps) < 20_000:
            now = clock()
            if now != prev:
                steps.append(now - prev)
            prev = now
        info = time.get_clock_info(name)
        print(
            f"{name} ({info.implementation}): {best * 1e9:.0f} ns a read, smallest step {min(steps) * 1e9:.0f} ns,"
            f" median step {sorted(steps)[len(steps) // 2] * 1e9:.0f} ns"
        )


if __name__ == "__main__":
    clock_costs()
