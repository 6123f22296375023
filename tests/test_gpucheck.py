"""gpu-check without a GPU: the refusal, the timing logic on a simulated device, NVTX, the report."""

from __future__ import annotations

import sys
import time
import types

import pytest

from perfkit.errors import UserError
from perfkit.machine import gpucheck, gpureport
from perfkit.probe import spans
from perfkit.probe.timing import bench


def test_without_cuda_it_refuses_in_one_line_and_writes_nothing(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.version, "cuda", None)  # a CPU-only build, even on a machine that has a GPU
    out = tmp_path / "report"
    with pytest.raises(UserError) as err:
        gpucheck.main(["--out", str(out)])
    message = str(err.value)
    assert message.startswith("gpu-check: no CUDA device, nothing measured: ")
    assert "CPU-only build" in message and "\n" not in message
    assert not out.exists()


class SimulatedGPU:
    """An asynchronous device: launches return at once, kernels run back to back in device time,
    events are stamped when the stream reaches them, synchronize waits (plus a fixed latency)."""

    def __init__(self, kernel_s: float, sync_latency_s: float = 0.0):
        self.kernel_s = kernel_s
        self.sync_latency_s = sync_latency_s
        self.busy_until = time.perf_counter()
        gpu = self

        class Event:
            def __init__(self, enable_timing=False):
                self.at = None

            def record(self):
                self.at = max(time.perf_counter(), gpu.busy_until)

            def elapsed_time(self, end):
                return (end.at - self.at) * 1e3

        self.cuda = types.SimpleNamespace(Event=Event, synchronize=self.synchronize, is_available=lambda: True)
        self.torch = types.SimpleNamespace(cuda=self.cuda)

    def launch(self):
        self.busy_until = max(time.perf_counter(), self.busy_until) + self.kernel_s

    def synchronize(self):
        wait = self.busy_until - time.perf_counter()
        time.sleep(max(0.0, wait) + self.sync_latency_s)


@pytest.fixture
def simulated(monkeypatch):
    """A SimulatedGPU that bench finds as torch.cuda."""

    def make(**kw):
        gpu = SimulatedGPU(**kw)
        monkeypatch.setitem(sys.modules, "torch", gpu.torch)
        return gpu

    return make


def test_three_clocks_on_a_long_kernel_no_sync_sees_only_the_launch(simulated):
    gpu = simulated(kernel_s=0.004)
    t = gpucheck.time_three_ways(gpu.launch, calls=10, warmup=1)
    assert t["events_ms"] == pytest.approx(4.0, rel=0.05)
    assert t["wall_nosync_ms"] < 0.5  # the host only queued the work
    assert t["wall_sync_ms"] >= 3.9
    said = gpureport.findings({"kernels": {"value": [dict(t, kernel="matmul")]}})
    assert any(s.startswith("matmul: host clock without sync says") and "below the kernel's" in s for s in said)


def test_three_clocks_on_a_tiny_kernel_sync_per_call_inflates_it(simulated):
    gpu = simulated(kernel_s=0.0001, sync_latency_s=0.002)
    t = gpucheck.time_three_ways(gpu.launch, calls=10, warmup=1)
    assert t["events_ms"] == pytest.approx(0.1, rel=0.2)
    assert t["wall_sync_ms"] > 10 * t["events_ms"]
    said = gpureport.findings({"kernels": {"value": [dict(t, kernel="add 256")]}})
    assert any(s.startswith("add 256: a sync per call says") for s in said)


def test_bench_each_waits_for_the_queued_work_outside_the_sample_and_for_its_own_inside(simulated):
    gpu = simulated(kernel_s=0.003)
    for _ in range(5):
        gpu.launch()  # 15 ms already queued: not the sample's
    (sample,) = bench(gpu.launch, warmup=0, repeat=1, sync="each")
    assert 0.0029 < sample < 0.012  # its own 3 ms, not the 15 ms queued before it


def test_bench_cuda_clocks_need_a_cuda_device(monkeypatch):
    no_device = types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: False))
    monkeypatch.setitem(sys.modules, "torch", no_device)
    for sync in ("cuda", "each"):
        with pytest.raises(ValueError, match="needs torch with a CUDA device"):
            bench(lambda: None, sync=sync)


def test_nvtx_check_with_cuda_absent_reports_it_and_spans_push_nothing(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # absent, even on a machine that has one
    monkeypatch.setattr(spans, "_cuda_available", False)
    pushed = []
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda msg: pushed.append(msg))
    result = gpucheck.nvtx_check(torch.cuda)
    assert result == {
        "ok": False,
        "pushed": [],
        "popped": 0,
        "note": "CUDA absent: spans time with the host clock and emit no NVTX ranges",
    }
    with spans.capture() as cap:
        with spans.span("draft"):
            pass
    assert pushed == []  # the CUDA-absent code path of spans never touches NVTX
    assert len(cap.samples("draft")) == 1


class _FakeCuda:
    """torch.cuda as spans see it on a GPU machine: events and NVTX (host-clock events here)."""

    def __init__(self):
        self.log = []
        outer = self

        class Event:
            def __init__(self, enable_timing=False):
                self.t = None

            def record(self):
                self.t = time.perf_counter()

            def query(self):
                return True

            def synchronize(self):
                pass

            def elapsed_time(self, end):
                return (end.t - self.t) * 1e3

        self.Event = Event
        self.nvtx = types.SimpleNamespace(
            range_push=lambda m: outer.log.append(("push", m)), range_pop=lambda: outer.log.append(("pop",))
        )
        self.initialised = False

    def is_available(self):
        return True

    def init(self):
        self.initialised = True


def test_nvtx_check_counts_the_ranges_spans_emit_on_cuda(monkeypatch):
    fake = _FakeCuda()
    monkeypatch.setattr(spans, "_cuda", lambda: fake)
    monkeypatch.setattr(spans, "_cuda_available", True)  # a CUDA machine: spans ask for the device
    result = gpucheck.nvtx_check(fake, work=lambda: None)
    assert fake.initialised
    assert result["ok"] and result["pushed"] == ["draft", "tree_build"] and result["popped"] == 2
    assert fake.log == [("push", "draft"), ("push", "tree_build"), ("pop",), ("pop",)]  # the real calls ran
    assert "nsys" in result["note"]
    assert fake.nvtx.range_push.__name__ == "<lambda>"  # restored afterwards


def test_nvtx_check_fails_when_spans_do_not_emit(monkeypatch):
    fake = _FakeCuda()
    monkeypatch.setattr(spans, "_cuda", lambda: None)  # spans that ignore CUDA
    result = gpucheck.nvtx_check(fake, work=lambda: None)
    assert not result["ok"]
    assert "did not emit" in result["note"]


def _report():
    return {
        "meta": {"started_at": "2025-01-01T00:00:00+00:00", "seconds": 42.0},
        "environment": {
            "value": {
                "nvidia_driver": "550.54.15",
                "gpus": [
                    {
                        "index": 0,
                        "name": "NVIDIA H200",
                        "memory_total_bytes": 150 * 2**30,
                        "peak_dram_bytes_per_s": 4.8e12,
                    }
                ],
            }
        },
        "bandwidth": {"value": {"triad_bytes_per_s": 4.0e12, "peak_bytes_per_s": 4.8e12}},
        "kernels": {
            "value": [
                {
                    "kernel": "matmul 8192^2 bf16",
                    "events_ms": 1.5,
                    "wall_nosync_ms": 0.02,
                    "wall_sync_ms": 1.55,
                    "tflops": 733.0,
                    "gbps": 268.0,
                }
            ]
        },
        "spans": {"value": {"span_mean_ms": 1.52, "events_ms": 1.5, "wall_nosync_ms": 0.02, "span_vs_events": 1.013}},
        "nvtx": {"value": {"ok": True, "note": "spans emit NVTX ranges: ..."}},
        "profiler": {"error": "RuntimeError: boom", "traceback": "Traceback ...\nRuntimeError: boom"},
        "tree_build": {
            "value": [
                {
                    "batch": 1,
                    "budget": 64,
                    "heap_ms": 0.2,
                    "vectorized_ms": 0.4,
                    "speedup": 0.5,
                    "speedup_low": 0.45,
                    "speedup_high": 0.55,
                    "same_trees": True,
                },
                {
                    "batch": 128,
                    "budget": 64,
                    "heap_ms": 9.0,
                    "vectorized_ms": 0.45,
                    "speedup": 20.0,
                    "speedup_low": 18.0,
                    "speedup_high": 22.0,
                    "same_trees": True,
                },
            ]
        },
        "engine": {
            "value": [
                {
                    "mode": "spec",
                    "context": 4096,
                    "decode_tok_s": 250.0,
                    "spans_step_total_s": 0.25,
                    "wall_s_synchronised": 0.26,
                    "verify_forward_ms": 0.5,
                    "verify_floor_ms": 0.01,
                    "verify_floor_note": "memory-bound floor ...",
                }
            ]
        },
    }


def test_findings_and_markdown_from_a_report():
    report = _report()
    said = gpureport.findings(report)
    assert "measured device triad 4 TB/s = 83% of the NVML-derived peak 4.8 TB/s" in said
    assert any(s.startswith("perfkit spans agree with CUDA events: 1.52 ms vs 1.5 ms") for s in said)
    assert said[-1] == "FAILED sections: profiler (see their errors below)"
    assert (
        "engine spec at 4096 context: 250 tok/s; spans' steps sum to 0.25 s of 0.26 s synchronised wall; "
        "verify_forward 0.5 ms = 50x its floor (memory-bound floor ...)"
    ) in said
    md = gpureport.render_markdown(report)
    assert md.startswith("# perfkit gpu-check (2025-01-01T00:00:00+00:00)")
    assert "- GPU 0: NVIDIA H200, driver 550.54.15, 150 GiB, peak DRAM 4.8 TB/s" in md
    assert "| matmul 8192^2 bf16 | 1.5 | 0.02 | 1.55 | 733 | 268 |" in md
    assert "FAILED: RuntimeError: boom" in md
    assert (
        "tree build, batch 128, budget 64: vectorized 0.45 ms vs heapq 9 ms with its copy to the host: 20x "
        "[18, 22], identical trees"
    ) in said
    assert gpureport.failed_sections(report) == ["profiler"]
    report["nvtx"]["value"]["ok"] = False
    assert gpureport.failed_sections(report) == ["profiler", "nvtx"]
    report["tree_build"]["value"][0]["same_trees"] = False
    assert gpureport.failed_sections(report) == ["profiler", "nvtx", "tree_build"]
    assert any("batch 1, budget 64" in s and s.endswith("DIFFERENT TREES") for s in gpureport.findings(report))


def test_spans_that_disagree_with_events_are_called_out():
    report = _report()
    report["spans"]["value"].update(span_mean_ms=0.02, span_vs_events=0.013)
    assert any(s.startswith("perfkit spans DISAGREE with CUDA events") for s in gpureport.findings(report))


def test_engine_check_runs_the_engine_and_compares_verify_with_its_floor():
    """The same code the GPU check runs, on the CPU with the small random engine."""
    from perfkit.machine.roofline import Hardware

    hardware = Hardware("test machine", 10e9, 50e9)
    rows = gpucheck.engine_check(
        device="cpu", preset="tiny-random", context=128, new_tokens=8, budget=8, hardware=hardware
    )
    assert [r["mode"] for r in rows] == ["spec", "ar"]
    for r in rows:
        assert r["steps"] >= 1 and r["decode_tok_s"] > 0
        assert 0 < r["spans_step_total_s"] <= r["wall_s_synchronised"]
        assert r["per_step_ms"]["step"] > 0 and "unattributed" in r["per_step_ms"]
        assert r["verify_forward_ms"] > 0 and r["verify_floor_ms"] > 0
        assert "test machine" in r["verify_floor_note"]
    said = gpureport.findings({"engine": {"value": rows}})
    assert said[0].startswith("engine spec at 128 context: ") and "x its floor" in said[0]


def test_run_writes_the_report_and_a_failed_section_fails_the_command(tmp_path, monkeypatch, capsys):
    """The orchestration, with each device measurement replaced by a stand-in."""
    import json

    import fake_nvml
    import torch

    from perfkit.machine import bandwidth

    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml.make())
    monkeypatch.setattr(gpucheck, "cuda_unavailable", lambda: None)
    monkeypatch.setattr(torch.cuda, "init", lambda: None)

    def rate(kernel, device, value):
        unit = "FLOP/s" if kernel == "matmul" else "B/s"
        return bandwidth.Rate(kernel, device, unit, value, value * 0.99, value * 1.01, value, (value,), 1)

    measurement = bandwidth.Measurement(
        fingerprint="f",
        machine={"gpus": ["NVIDIA H100 80GB HBM3"]},
        measured_at="now",
        seconds=1.0,
        rates=(rate("copy", "cuda:0", 2.9e12), rate("triad", "cuda:0", 3.0e12), rate("matmul", "cuda:0", 7e14)),
    )
    monkeypatch.setattr(bandwidth, "measured", lambda refresh=False: measurement)
    kernels = [
        {
            "kernel": "matmul 8192^2 bf16",
            "events_ms": 1.5,
            "wall_nosync_ms": 0.02,
            "wall_sync_ms": 1.6,
            "tflops": 733.0,
            "gbps": 268.0,
        }
    ]
    monkeypatch.setattr(gpucheck, "kernel_timings", lambda t: kernels)
    monkeypatch.setattr(
        gpucheck,
        "span_check",
        lambda t: {"span_mean_ms": float("nan"), "events_ms": 1.5, "wall_nosync_ms": 0.02, "span_vs_events": 1.0},
    )
    monkeypatch.setattr(gpucheck, "nvtx_check", lambda cuda: {"ok": True, "note": "spans emit NVTX ranges"})
    monkeypatch.setattr(gpucheck, "profiler_check", lambda t, out: {"ok": True})
    monkeypatch.setattr(gpucheck, "tree_build_check", lambda: [])

    def broken_engine():
        raise RuntimeError("CUDA error: out of memory")

    monkeypatch.setattr(gpucheck, "engine_check", broken_engine)
    out = tmp_path / "check"
    assert gpucheck.main(["--out", str(out)]) == 1
    printed = capsys.readouterr().out
    assert "measured device triad 3 TB/s = 89% of the NVML-derived peak 3.35 TB/s" in printed
    assert "gpu-check: FAILED: engine" in printed
    report = json.loads((out / "report.json").read_text())
    assert report["format_version"] == gpucheck.FORMAT_VERSION
    assert report["engine"]["error"] == "RuntimeError: CUDA error: out of memory"
    assert report["spans"]["value"]["span_mean_ms"] == "nan"  # JSON has no NaN: stored as perfkit stores it
    assert report["environment"]["value"]["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
    md = (out / "report.md").read_text()
    assert "| matmul 8192^2 bf16 | 1.5 | 0.02 | 1.6 | 733 | 268 |" in md and "FAILED: RuntimeError" in md

    monkeypatch.setattr(gpucheck, "engine_check", lambda: [])
    assert gpucheck.main(["--out", str(tmp_path / "again")]) == 0


def test_tree_build_check_is_the_tree_benchmark_on_a_device():
    rows = gpucheck.tree_build_check(device="cpu")
    assert {(r["batch"], r["budget"]) for r in rows} >= {(1, 64), (128, 64)}
    assert all(r["same_trees"] for r in rows)
    assert len([s for s in gpureport.findings({"tree_build": {"value": rows}}) if s.startswith("tree build")]) == 2
