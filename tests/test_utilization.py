"""The utilization sampler: what it records, what it costs, and its plot."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import namedtuple

import fake_nvml
import psutil
import pytest

from perfkit.machine import utilization
from perfkit.machine.utilization import Sampler, plot_trace

CpuTimes = namedtuple("CpuTimes", "user system idle iowait")


def _burn(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_sampler_sees_this_process_working_then_idle():
    alone = not psutil.Process().children(recursive=True)  # an earlier test's straggler would be in the tree
    s = Sampler(0.05).start()
    cpu0 = time.process_time()
    t0 = time.time()
    # busy, then idle, each until the sampler has taken a few samples inside it: a loaded machine may not
    # schedule the sampler's thread for a while, and a fixed half second would then see no busy sample
    while sum(t0 + 0.1 < ts for ts in s.times()) < 4 and time.time() < t0 + 30:
        _burn(0.1)
    t1 = time.time()
    time.sleep(0.4)
    while sum(t1 + 0.15 < ts for ts in s.times()) < 3 and time.time() < t1 + 30:
        time.sleep(0.1)
    spent = time.process_time() - cpu0
    trace = s.stop()
    json.dumps(trace)  # JSON-able as stored in the run
    assert trace["format_version"] == utilization.FORMAT_VERSION
    t, cpu = trace["t"], trace["cpu_percent"]
    assert len(t) >= 6 and t == sorted(t)
    assert cpu[0] is None  # no interval before the first sample
    # what the trace says this process spent is what the OS says it spent (the sampler's own thread in
    # both), however much of a core a loaded machine gave the busy loop
    seen = sum(c / 100 * (b - a) for a, b, c in zip(t, t[1:], cpu[1:]))
    assert seen > 0.75 * spent, (seen, spent)  # none of it missed
    if alone:  # and nothing counted twice
        assert seen < 1.25 * spent + 0.02, (seen, spent)
    busy = [c for ts, c in zip(t, cpu) if c is not None and t0 + 0.1 < ts <= t1]
    idle = [c for ts, c in zip(t, cpu) if c is not None and ts > t1 + 0.15]
    assert busy and idle
    median_idle = sorted(idle)[len(idle) // 2]  # the median: one sample can catch another thread's work
    assert median_idle < 30 and max(busy) > 2 * median_idle + 10
    assert all(r > 10 * 2**20 for r in trace["rss_bytes"])
    assert trace["gpus"] == [] or trace["gpu_note"] is None


def test_machine_cpu_busy_counts_everything_but_idle_and_iowait():
    before, after = CpuTimes(10, 5, 80, 5), CpuTimes(14, 6, 95, 5)  # as psutil.cpu_times() gives them
    assert utilization.busy_cpu_seconds(before, after) == (5, 20)  # 4 user + 1 system of 20 seconds in all


def test_sampler_follows_child_processes():
    s = Sampler(0.05, rescan_s=0.05).start()
    code = "import time\nend = time.perf_counter() + 0.6\nwhile time.perf_counter() < end: pass\n"
    subprocess.run([sys.executable, "-c", code], check=True)
    trace = s.stop()
    base = trace["processes"][0]  # this process, and helpers an earlier test may have left (a forkserver)
    assert max(trace["processes"]) >= base + 1
    assert trace["processes"][-1] == base  # the child is gone at the end


def test_sampler_reports_its_own_cost():
    s = Sampler(0.02).start()
    time.sleep(0.3)
    trace = s.stop()
    ov = trace["overhead"]
    assert ov["samples"] == len(trace["t"]) >= 5
    assert 0 < ov["sampler_cpu_s"] < ov["wall_s"]
    assert ov["cpu_s_per_s"] == pytest.approx(ov["sampler_cpu_s"] / ov["wall_s"], rel=1e-3)
    assert ov["cpu_s_per_s"] < 0.25  # even at 50 Hz it must stay far below a core


def test_a_short_probe_still_gets_a_start_and_an_end_sample():
    s = Sampler(10.0).start()
    trace = s.stop()
    assert len(trace["t"]) == 2


def test_a_failed_sampler_raises_instead_of_looking_idle(monkeypatch):
    def broken(*args, **kwargs):
        raise OSError("no /proc/stat")

    monkeypatch.setattr(utilization.psutil, "cpu_times", broken)
    s = Sampler(0.05).start()
    with pytest.raises(RuntimeError, match="utilization sampler failed.*no /proc/stat"):
        s.stop()


def test_a_process_that_ended_before_sampling_gives_an_empty_tree_not_a_failure():
    # the race CI met: a Slurm job cancelled, or a probe failing at once, before its sampler started
    s = Sampler(0.05, pid=2**22 + 12345).start()  # no such process
    trace = s.stop()
    assert len(trace["t"]) >= 2 and set(trace["processes"]) == {0} and set(trace["rss_bytes"]) == {0}
    assert trace["tree_pids"] == [] and trace["system_cpu_percent"][-1] is not None


def test_misuse_is_reported():
    with pytest.raises(RuntimeError, match="without start"):
        Sampler().stop()
    s = Sampler(0.05).start()
    with pytest.raises(RuntimeError, match="twice"):
        s.start()
    s.stop()
    with pytest.raises(ValueError):
        Sampler(0)


def test_gpu_series_come_from_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml.make(unsupported=("nvmlDeviceGetPowerUsage",)))
    s = Sampler(0.02).start()
    time.sleep(0.1)
    trace = s.stop()
    (g,) = trace["gpus"]
    n = len(trace["t"])
    assert g["name"] == "NVIDIA H100 80GB HBM3"
    assert g["util_percent"] == [87] * n
    assert g["mem_util_percent"] == [55] * n
    assert g["memory_used_bytes"] == [1_048_576_000] * n
    assert g["sm_clock_mhz"] == [1980] * n and g["mem_clock_mhz"] == [2619] * n
    assert g["power_w"] == [None] * n  # not supported on this GPU: recorded as missing, not zero
    assert trace["gpu_note"] is None


def _png(path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_trace_draws_cells_on_the_same_time_axis(tmp_path):
    s = Sampler(0.05).start()
    t0 = time.time()
    _burn(0.2)
    t1 = time.time()
    time.sleep(0.1)
    trace = s.stop()
    out = plot_trace(trace, tmp_path / "util.png", intervals=[("cell 1", t0, t1), ("cell 2", t1, time.time())])
    assert out == tmp_path / "util.png" and _png(out)


def test_plot_trace_with_gpus_and_no_intervals(tmp_path):
    n = 4
    trace = {
        "format_version": utilization.FORMAT_VERSION,
        "interval_s": 0.25,
        "t": [100.0 + i / 4 for i in range(n)],
        "cpu_percent": [None, 50.0, 60.0, 10.0],
        "system_cpu_percent": [None, 30.0, 35.0, 5.0],
        "rss_bytes": [2**30] * n,
        "processes": [2] * n,
        "gpu_note": None,
        "gpus": [
            {
                "index": 0,
                "name": "GPU",
                "util_percent": [0, 90, None, 10],
                "mem_util_percent": [0] * n,
                "memory_used_bytes": [2**33] * n,
                "sm_clock_mhz": [1980] * n,
                "mem_clock_mhz": [2619] * n,
                "power_w": [100.0, 600.0, 650.0, 120.0],
            }
        ],
        "overhead": {"cpu_s_per_s": 0.004},
    }
    out = plot_trace(trace, tmp_path / "sub" / "gpu.png", intervals=[])
    assert _png(out)
