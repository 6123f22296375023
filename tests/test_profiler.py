"""torch.profiler capture and the Nsight Compute hand-off, on a machine without CUDA or ncu."""

from __future__ import annotations

import json
import sys
import types

import pytest

from perfkit.probe import profiler


@pytest.fixture(autouse=True)
def _no_leftover_session():
    yield
    if profiler.active():
        profiler.stop()


def test_start_stop_saves_a_chrome_trace_and_prints_top_operators(tmp_path, capsys):
    import torch

    path = tmp_path / "run" / "probe.trace.json"
    profiler.start(str(path))
    assert profiler.active()
    x = torch.randn(128, 128)
    for _ in range(5):
        (x @ x).relu_()
    assert profiler.stop() == str(path)
    assert not profiler.active()
    trace = json.loads(path.read_text())
    names = {ev.get("name") for ev in trace["traceEvents"]}
    assert "aten::mm" in names
    top = json.loads((tmp_path / "run" / "probe.trace.json.top.json").read_text())["operators"]
    mm = next(r for r in top if r["name"] == "aten::mm")
    assert mm["calls"] == 5 and mm["self_cpu_us"] > 0
    assert [r["self_cpu_us"] for r in top] == sorted((r["self_cpu_us"] for r in top), reverse=True)
    out = capsys.readouterr().out
    assert f"torch.profiler trace: {path}" in out
    assert "aten::mm" in out and "self CPU ms" in out


def test_stop_without_start_says_so_and_start_twice_raises(tmp_path, capsys):
    assert profiler.stop() is None
    assert "no capture was started" in capsys.readouterr().out
    profiler.start(str(tmp_path / "a.json"))
    with pytest.raises(RuntimeError, match="already recording"):
        profiler.start(str(tmp_path / "b.json"))
    profiler.stop()


def _ev(key, count, self_cpu, cpu_total, self_dev):
    return types.SimpleNamespace(key=key, count=count, self_cpu_time_total=self_cpu, cpu_time_total=cpu_total,
                                 self_device_time_total=self_dev)


def test_top_operators_sort_by_device_time_on_cuda_and_share_all_cpu_time():
    events = [_ev("aten::mm", 10, 100.0, 300.0, 5000.0), _ev("aten::copy_", 50, 700.0, 700.0, 10.0),
              _ev("aten::add", 10, 200.0, 200.0, 900.0)]
    by_dev = profiler.top_operators(events, limit=2, by_device=True)
    assert [r["name"] for r in by_dev] == ["aten::mm", "aten::add"]
    assert by_dev[0]["self_cpu_share"] == pytest.approx(0.1)  # of all 1000 us, not of the two shown
    by_cpu = profiler.top_operators(events, limit=3)
    assert [r["name"] for r in by_cpu] == ["aten::copy_", "aten::add", "aten::mm"]
    table = profiler.format_top(by_dev)
    assert "self device ms" in table and "5.000" in table and " 10.0%" in table
    assert profiler.format_top([]) == "(no operators recorded)"


def test_ncu_is_unavailable_here_with_the_reason_and_no_samples():
    reason = profiler.ncu_unavailable()
    assert reason is not None and reason.startswith("unavailable: ")
    ran = []
    result = profiler.ncu_metrics(lambda: ran.append(1), label="tree_build")
    assert not result.available
    assert result.reason == reason
    assert result.samples("gpu__time_duration.sum") == []  # no samples -> the verdict is inconclusive
    assert result.value("gpu__time_duration.sum") is None
    assert ran == []  # nothing is run when it cannot be measured


def test_unavailable_reasons_name_what_is_missing(monkeypatch):
    import importlib.util
    import shutil

    import torch

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "nsight" else real_find_spec(name))
    assert "pip install 'perfkit[nsight]'" in profiler.ncu_unavailable()

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name == "nsight" else real_find_spec(name))
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert "`ncu` is not on PATH" in profiler.ncu_unavailable()

    monkeypatch.setattr(shutil, "which", lambda name: "/usr/local/cuda/bin/ncu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert profiler.ncu_unavailable() == "unavailable: no CUDA device (Nsight Compute profiles GPU kernels)"


class _Frame:
    def __init__(self, rows):
        self.rows = rows

    def to_dict(self, orient):
        assert orient == "records"
        return self.rows


def _fake_nsight(rows, seen, fail=None):
    nsight = types.ModuleType("nsight")

    class annotate:  # noqa: N801
        def __init__(self, name):
            seen["annotation"] = name

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def kernel(**settings):
        seen["settings"] = settings

        def decorate(fn):
            def run():
                if fail:
                    raise fail
                for config in settings["configs"]:
                    for _ in range(settings["runs"]):
                        fn(*config)
                return types.SimpleNamespace(to_dataframe=lambda: _Frame(rows))

            return run

        return decorate

    nsight.annotate = annotate
    nsight.analyze = types.SimpleNamespace(kernel=kernel)
    return nsight


def test_ncu_metrics_through_nsight_python(monkeypatch):
    rows = [
        {"Annotation": "verify", "Metric": "gpu__time_duration.sum", "AvgValue": 1500.0, "StdDev": 20.0,
         "MinValue": 1480.0, "MaxValue": 1530.0, "NumRuns": 3, "Unit": "ns"},
        {"Annotation": "verify", "Metric": "dram__bytes.sum", "AvgValue": 4.0e6, "StdDev": float("nan"),
         "MinValue": 4.0e6, "MaxValue": 4.0e6, "NumRuns": 3, "Unit": float("nan")},
    ]
    seen: dict = {}
    monkeypatch.setitem(sys.modules, "nsight", _fake_nsight(rows, seen))
    monkeypatch.setattr(profiler, "ncu_unavailable", lambda: None)
    calls = []
    result = profiler.ncu_metrics(lambda: calls.append(1), label="verify", runs=3)
    assert result.available and result.reason == ""
    assert calls == [1, 1, 1]
    assert seen["annotation"] == "verify"
    assert seen["settings"]["metrics"] == ["gpu__time_duration.sum", "dram__bytes.sum"]
    assert seen["settings"]["combine_kernel_metrics"](2.0, 3.0) == 5.0  # kernels of one region are summed
    assert result.value("gpu__time_duration.sum") == 1500.0
    assert result.metrics["gpu__time_duration.sum"]["unit"] == "ns"
    assert result.metrics["dram__bytes.sum"]["unit"] is None
    assert result.samples("dram__bytes.sum") == [4.0e6]


def test_ncu_failure_is_unavailable_not_an_error(monkeypatch):
    seen: dict = {}
    monkeypatch.setitem(sys.modules, "nsight", _fake_nsight([], seen, fail=RuntimeError("ERR_NVGPUCTRPERM")))
    monkeypatch.setattr(profiler, "ncu_unavailable", lambda: None)
    result = profiler.ncu_metrics(lambda: None, label="verify")
    assert not result.available
    assert result.reason == "unavailable: ncu failed: RuntimeError: ERR_NVGPUCTRPERM"
    assert result.samples("gpu__time_duration.sum") == []
