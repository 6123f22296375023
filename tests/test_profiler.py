"""torch.profiler capture: the Chrome trace, the top operators and their table, on a machine without CUDA."""

from __future__ import annotations

import json
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
    assert "aten::mm" in names and trace["traceName"] == str(path)
    saved = json.loads((tmp_path / "run" / "probe.trace.json.top.json").read_text())
    assert saved["format_version"] == profiler.FORMAT_VERSION
    top = saved["operators"]
    mm = next(r for r in top if r["name"] == "aten::mm")
    assert mm["calls"] == 5 and mm["self_cpu_us"] > 0
    assert [r["self_cpu_us"] for r in top] == sorted((r["self_cpu_us"] for r in top), reverse=True)
    out = capsys.readouterr().out
    assert f"torch.profiler trace: {path}" in out
    assert "aten::mm" in out and "self CPU ms" in out
    assert sorted(p.name for p in path.parent.iterdir()) == ["probe.trace.json", "probe.trace.json.top.json"]


def test_stop_without_start_says_so_and_start_twice_raises(tmp_path, capsys):
    assert profiler.stop() is None
    assert "no capture was started" in capsys.readouterr().out
    profiler.start(str(tmp_path / "a.json"))
    with pytest.raises(RuntimeError, match="already recording"):
        profiler.start(str(tmp_path / "b.json"))
    profiler.stop()


def _ev(key, count, self_cpu, cpu_total, self_dev):
    return types.SimpleNamespace(
        key=key, count=count, self_cpu_time_total=self_cpu, cpu_time_total=cpu_total, self_device_time_total=self_dev
    )


def test_top_operators_sort_by_device_time_on_cuda_and_share_all_cpu_time():
    events = [
        _ev("aten::mm", 10, 100.0, 300.0, 5000.0),
        _ev("aten::copy_", 50, 700.0, 700.0, 10.0),
        _ev("aten::add", 10, 200.0, 200.0, 900.0),
    ]
    by_dev = profiler.top_operators(events, limit=2, by_device=True)
    assert [r["name"] for r in by_dev] == ["aten::mm", "aten::add"]
    assert by_dev[0]["self_cpu_share"] == pytest.approx(0.1)  # of all 1000 us, not of the two shown
    by_cpu = profiler.top_operators(events, limit=3)
    assert [r["name"] for r in by_cpu] == ["aten::copy_", "aten::add", "aten::mm"]
    table = profiler.format_top(by_dev)
    assert "self device ms" in table and "5.000" in table and " 10.0%" in table
    assert profiler.format_top([]) == "(no operators recorded)"


def test_a_gz_trace_is_compressed_names_itself_and_is_the_same_bytes_for_the_same_trace(tmp_path):
    import gzip

    import torch

    path = tmp_path / "run" / "torch_trace.json.gz"
    profiler.start(str(path))
    (torch.randn(64, 64) @ torch.randn(64, 64)).relu_()
    assert profiler.stop() == str(path)
    trace = json.loads(gzip.decompress(path.read_bytes()))
    assert trace["traceName"] == str(path)  # not the scratch file torch wrote it to
    assert "aten::mm" in {ev.get("name") for ev in trace["traceEvents"]}
    assert profiler.top_path(path).name == "torch_trace.json.top.json" and profiler.top_path(path).is_file()
    assert profiler._published(b'{"a": 1}', path) == profiler._published(b'{"a": 1}', path)  # no time inside
