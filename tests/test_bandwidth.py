"""Bandwidth measurement: STREAM byte counting, intervals, and the per-machine cache."""

from __future__ import annotations

import json
import time

import pytest

from perfkit.errors import UserError
from perfkit.files import VERSION_KEY, write_json
from perfkit.machine import bandwidth

MIB = 2**20


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PERFKIT_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_stream_counts_two_arrays_for_copy_and_three_for_triad(monkeypatch):
    import torch

    durations = iter([[0.01, 0.02], [0.03, 0.03]])  # copy, then triad
    seen = []

    def fake_bench(fn, *, warmup, repeat, sync):
        seen.append(sync)
        fn()
        return next(durations)

    monkeypatch.setattr(bandwidth, "bench", fake_bench)
    copy, triad = bandwidth._stream(torch, "cpu", array_bytes=4 * MIB, warmup=0, repeat=2)
    nbytes = 4 * MIB
    assert copy.samples == (2 * nbytes / 0.01, 2 * nbytes / 0.02)
    assert copy.best == 2 * nbytes / 0.01
    assert copy.mean == pytest.approx((2 * nbytes / 0.01 + 2 * nbytes / 0.02) / 2)
    assert triad.samples == (3 * nbytes / 0.03,) * 2
    assert triad.low == triad.mean == triad.high  # identical samples: a zero-width interval
    assert (copy.unit, triad.unit, copy.size) == ("B/s", "B/s", nbytes)
    assert seen == ["none", "none"]  # the host clock on the CPU (CUDA events on a GPU)


def test_measure_on_cpu_gives_figures_with_intervals(monkeypatch):
    m = bandwidth.measure(cuda=False, array_bytes=8 * MIB, warmup=1, repeat=5)
    kernels = {(r.kernel, r.device) for r in m.rates}
    assert kernels == {("copy", "cpu"), ("triad", "cpu"), ("matmul", "cpu")}
    for r in m.rates:
        assert r.low <= r.mean <= r.high
        assert r.best >= r.mean > 0
        assert len(r.samples) >= 3
    assert m.rate("triad").size == 8 * MIB
    assert m.main_device() == "cpu"
    assert m.fingerprint == bandwidth.fingerprint()
    line = m.rate("triad").text()
    assert line.startswith("cpu triad ") and "95% CI, 5 reps, 8 MiB arrays" in line


def test_interval_is_reproducible_and_holds_the_mean():
    rates = [10.0, 12.0, 11.0, 9.0, 13.0, 10.5]
    a = bandwidth._rate("copy", "cpu", "B/s", rates, 1)
    b = bandwidth._rate("copy", "cpu", "B/s", rates, 1)
    assert a == b
    assert a.low < a.mean < a.high
    assert a.mean == pytest.approx(sum(rates) / len(rates))


def test_rate_rejects_bad_samples():
    with pytest.raises(ValueError, match="finite and positive"):
        bandwidth.Rate("copy", "cpu", "B/s", 1.0, 1.0, 1.0, 1.0, (1.0, float("nan")), 1)
    with pytest.raises(ValueError, match="unknown kernel"):
        bandwidth.Rate("scale", "cpu", "B/s", 1.0, 1.0, 1.0, 1.0, (1.0,), 1)


def _fake_measurement(value: float = 20e9) -> bandwidth.Measurement:
    inputs = bandwidth.fingerprint_inputs()
    rates = tuple(
        bandwidth.Rate(
            k,
            "cpu",
            "B/s" if k != "matmul" else "FLOP/s",
            value,
            value * 0.95,
            value * 1.05,
            value,
            (value * 0.95, value * 1.05),
            64 * MIB,
        )
        for k in ("copy", "triad", "matmul")
    )
    return bandwidth.Measurement(
        fingerprint=bandwidth.fingerprint(inputs),
        machine=inputs,
        measured_at="2025-01-01T00:00:00+00:00",
        seconds=0.5,
        rates=rates,
    )


def test_second_call_reuses_the_cache_and_refresh_remeasures(cache, monkeypatch):
    calls = []

    def fake_measure(**kw):
        calls.append(kw)
        return _fake_measurement(20e9 + len(calls))

    monkeypatch.setattr(bandwidth, "measure", fake_measure)
    first = bandwidth.measured()
    assert not first.cached and len(calls) == 1
    assert first.path == str(bandwidth.cache_path())
    assert json.loads(bandwidth.cache_path().read_text())[VERSION_KEY] == bandwidth.FORMAT_VERSION

    second = bandwidth.measured()
    assert second.cached and len(calls) == 1
    assert second.rates == first.rates
    assert any("cached" in line and "--refresh" in line for line in bandwidth.describe(second))

    third = bandwidth.measured(refresh=True)
    assert len(calls) == 2 and not third.cached
    assert third.rate("triad").mean == 20e9 + 2
    assert bandwidth.measured().rate("triad").mean == 20e9 + 2


def test_cache_is_keyed_by_the_machine_fingerprint(cache, monkeypatch):
    base = {"cpu_model": "X", "logical_cores": 2, "memory_gib": 8, "gpus": []}
    with_gpu = dict(base, gpus=["NVIDIA H100 80GB HBM3"])
    assert bandwidth.fingerprint(base) == bandwidth.fingerprint(dict(base))
    assert bandwidth.fingerprint(base) != bandwidth.fingerprint(with_gpu)
    assert bandwidth.cache_path(bandwidth.fingerprint(base)).parent == cache


def test_corrupt_cache_is_a_user_error_naming_the_file(cache):
    path = bandwidth.cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{not json")
    with pytest.raises(UserError, match="corrupt bandwidth cache.*--refresh") as err:
        bandwidth.measured()
    assert str(path) in str(err.value)


@pytest.mark.parametrize(
    "old",
    [
        {"format": 1, "figures": []},  # the first format spelled its version key `format`
        {VERSION_KEY: 1},
        {VERSION_KEY: bandwidth.FORMAT_VERSION + 1},  # a newer perfkit's
    ],
)
def test_cache_from_another_format_version_is_remeasured(cache, monkeypatch, old):
    path = bandwidth.cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(old))
    monkeypatch.setattr(bandwidth, "measure", lambda **kw: _fake_measurement())
    m = bandwidth.measured()
    assert not m.cached
    assert json.loads(path.read_text())[VERSION_KEY] == bandwidth.FORMAT_VERSION


def test_a_cache_of_this_version_missing_a_field_is_a_user_error(cache):
    write_json(bandwidth.cache_path(), {"fingerprint": "f"}, version=bandwidth.FORMAT_VERSION)
    with pytest.raises(UserError, match="invalid bandwidth cache"):
        bandwidth.measured()


def test_missing_figure_is_a_user_error():
    with pytest.raises(UserError, match="no triad bandwidth figure for cuda:0"):
        _fake_measurement().rate("triad", "cuda:0")


def test_a_figure_measured_on_a_busy_machine_carries_a_warning():
    from dataclasses import replace

    m = _fake_measurement()
    assert not any("WARNING" in line for line in bandwidth.describe(replace(m, busy=0.05)))
    busy = bandwidth.describe(replace(m, busy=0.6))
    assert any(line.startswith("WARNING: other processes used 60% of the CPUs") for line in busy)
    # the warning survives the round trip through the cache format
    assert bandwidth.Measurement.from_dict(replace(m, busy=0.6).to_dict()).busy == 0.6


def test_measure_records_how_busy_the_machine_was():
    import subprocess
    import sys

    code = "import time\nend = time.perf_counter() + 60.0\nwhile time.perf_counter() < end: pass\n"
    burner = subprocess.Popen([sys.executable, "-c", code])  # busy for the whole measurement, then stopped
    try:
        time.sleep(0.1)
        m = bandwidth.measure(cuda=False, array_bytes=8 * MIB, warmup=1, repeat=3)
    finally:
        burner.kill()
        burner.wait()
    assert m.busy is not None and m.busy > 0.15  # one busy core of this machine's cores


def test_a_sampled_floor_runs_only_the_kernels_it_reads_as_many_times_as_it_has_samples(monkeypatch):
    """roofline.Hardware.sampled pairs triad with matmul, one pair per sample: no copy kernel, no unpaired
    calls (on the CPU they cost whole seconds in a replicate of a probe, for nothing)."""
    from perfkit.machine import roofline

    calls = []
    real = bandwidth.bench

    def counting(fn, *, warmup, repeat, sync):
        calls.append(repeat)
        return real(fn, warmup=warmup, repeat=repeat, sync=sync)

    monkeypatch.setattr(bandwidth, "bench", counting)
    monkeypatch.setattr(bandwidth, "_cpu_array_bytes", lambda: 4 * MIB)
    floors = roofline.Hardware.sampled(device="cpu", repeat=4)
    best = roofline.BEST_OF
    assert calls == [4 * best, 4 * best]  # triad, then matmul: four values each, each the fastest of `best` calls
    assert len(floors) == 4 and all(h.dram_bytes_per_s > 0 and h.peak_flops > 0 for h in floors)
    assert [r.kernel for r in bandwidth.rates_on("cpu", array_bytes=4 * MIB, repeat=3, kernels=("matmul",))] == [
        "matmul"
    ]
    with pytest.raises(ValueError, match="kernels must be some of"):
        bandwidth.rates_on("cpu", kernels=("stream",))


def test_a_value_that_is_the_best_of_several_calls_is_the_fastest_of_its_own_calls(monkeypatch):
    """best_of=3: each value the fastest of three calls in a row, never of a neighbour's."""
    times = iter([0.3, 0.1, 0.2, 0.5, 0.4, 0.6])
    monkeypatch.setattr(bandwidth, "bench", lambda fn, *, warmup, repeat, sync: [next(times) for _ in range(repeat)])
    import torch

    assert bandwidth._seconds(lambda: None, torch.device("cpu"), warmup=0, repeat=2, best_of=3) == [0.1, 0.4]
