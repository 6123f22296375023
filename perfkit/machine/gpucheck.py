"""`perfkit gpu-check`: does timing on this NVIDIA GPU tell the truth? One command, under 5 minutes.

It takes the NVML snapshot and the measured device bandwidth, times a few kernels three ways
(CUDA events; host clock without synchronisation, which only sees the launch; host clock with a
synchronisation per call, which adds the launch-queue drain to every call), checks that perfkit
spans time with CUDA events and appear as NVTX ranges (what `nsys profile` shows), that
torch.profiler records device kernels, times the vectorized draft-tree build on the GPU against
the per-request heapq (which pays the copy to the host), and runs the bundled engine on CUDA with
profiling on. Every clock is a `perfkit.bench` option (sync "cuda", "none" and "each"), so the
check compares the timer perfkit uses with the two common mistakes. It writes `report.md` and
`report.json`; what the report says (findings, markdown, failed sections) is `gpureport`'s job.

Without a CUDA device nothing can be checked: it says why in one line and exits 2 (a UserError),
writing no report, so a script never mistakes "nothing measured" for "checked and fine". A section
that fails is recorded with its error, the other sections still run, and the exit status is 1.

Format history (`format_version`) of report.json: 1: first format (the key was `format`); 2: `format_version`.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import statistics
import sys
import time
import traceback
from pathlib import Path

from perfkit.errors import UserError
from perfkit.files import encode_number, write_atomic, write_json
from perfkit.machine.devices import nvml
from perfkit.machine.gpureport import failed_sections, findings, render_markdown
from perfkit.probe.timing import bench

__all__ = ["main", "run", "cuda_unavailable", "time_three_ways", "nvtx_check"]

FORMAT_VERSION = 2
DEADLINE_S = 280.0  # the whole check stays under 5 minutes


def cuda_unavailable() -> str | None:
    """None when torch can use a CUDA device here, else why not (one line)."""
    import torch

    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build (see environment.yml for a CUDA build)"
    if not torch.cuda.is_available():
        with nvml() as nv:
            why = nv.note or "NVML sees a GPU but CUDA cannot use it"
        return f"torch {torch.__version__} has CUDA {torch.version.cuda} but no device is usable: {why}"
    return None


# --- timing three ways -----------------------------------------------------------------------------


def time_three_ways(fn, *, calls: int = 50, warmup: int = 5) -> dict:
    """Milliseconds per call of `fn` by CUDA events, host clock without sync, host clock with sync."""
    (events_s,) = bench(fn, warmup=warmup, repeat=1, inner=calls, sync="cuda")
    (nosync_s,) = bench(fn, warmup=0, repeat=1, inner=calls, sync="none")  # launches only: kernels still queued
    per_call = bench(fn, warmup=0, repeat=calls, inner=1, sync="each")  # its first sync drains that queue, untimed
    return {
        "calls": calls,
        "events_ms": events_s * 1e3,
        "wall_nosync_ms": nosync_s * 1e3,
        "wall_sync_ms": statistics.fmean(per_call) * 1e3,
        "wall_sync_min_ms": min(per_call) * 1e3,
    }


def kernel_timings(torch) -> list[dict]:
    """A compute-bound matmul, a bandwidth-bound add and a launch-bound tiny add, timed three ways."""
    dev = torch.device("cuda")
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    big_x = torch.randn(64 * 2**20, device=dev)
    big_y = torch.randn(64 * 2**20, device=dev)
    tiny = torch.randn(256, device=dev)
    cases = [
        ("matmul 8192^2 bf16", lambda: a @ b, 2 * 8192**3, 3 * 8192 * 8192 * 2),
        ("add 64M fp32", lambda: big_x + big_y, 64 * 2**20, 3 * 64 * 2**20 * 4),
        ("add 256 fp32 (launch-bound)", lambda: tiny + tiny, 256, 3 * 256 * 4),
    ]
    rows = []
    for name, fn, flops, nbytes in cases:
        t = time_three_ways(fn)
        t.update(
            kernel=name, tflops=flops / (t["events_ms"] * 1e-3) / 1e12, gbps=nbytes / (t["events_ms"] * 1e-3) / 1e9
        )
        rows.append(t)
    return rows


def span_check(torch) -> dict:
    """A perfkit span around an 8192^2 matmul vs the three clocks: spans must see device time."""
    from perfkit.probe import spans

    dev = torch.device("cuda")
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    ref = time_three_ways(lambda: a @ a, calls=20)
    with spans.capture() as cap:
        for _ in range(20):
            with spans.span("gpu_check_matmul"):
                a @ a
    samples = cap.samples("gpu_check_matmul")
    mean_ms = sum(samples) / len(samples) * 1e3 if samples else float("nan")
    return {
        "span_mean_ms": mean_ms,
        "span_samples": len(samples),
        "events_ms": ref["events_ms"],
        "wall_nosync_ms": ref["wall_nosync_ms"],
        "span_vs_events": mean_ms / ref["events_ms"],
    }


# --- NVTX ------------------------------------------------------------------------------------------


def nvtx_check(cuda, *, work=None) -> dict:
    """Run nested spans with `cuda` (torch.cuda) present and count the NVTX ranges they push/pop.

    `work`: what runs inside the spans (default: a one-element CUDA add).
    """
    from perfkit.probe import spans

    if not cuda.is_available():
        return {
            "ok": False,
            "pushed": [],
            "popped": 0,
            "note": "CUDA absent: spans time with the host clock and emit no NVTX ranges",
        }
    cuda.init()  # spans switch to CUDA events and NVTX once CUDA is initialised
    if work is None:
        import torch

        work = lambda: torch.ones(1, device="cuda").add_(1)  # noqa: E731
    nvtx = cuda.nvtx
    pushed: list[str] = []
    popped = [0]
    real_push, real_pop = nvtx.range_push, nvtx.range_pop

    def push(msg):
        pushed.append(msg)
        return real_push(msg)  # the real call: NVTX must also be callable

    def pop():
        popped[0] += 1
        return real_pop()

    nvtx.range_push, nvtx.range_pop = push, pop
    try:
        with spans.capture():
            with spans.span("draft"):
                with spans.span("tree_build"):
                    work()
    finally:
        nvtx.range_push, nvtx.range_pop = real_push, real_pop
    ok = pushed == ["draft", "tree_build"] and popped[0] == 2
    return {
        "ok": ok,
        "pushed": pushed,
        "popped": popped[0],
        "note": "spans emit NVTX ranges: `nsys profile -t cuda,nvtx` shows the phases by name"
        if ok
        else f"spans did not emit the expected NVTX ranges (pushed {pushed}, popped {popped[0]})",
    }


# --- the draft-tree build on the device ------------------------------------------------------------


def tree_build_check(device: str = "cuda") -> list[dict]:
    """`perfkit engine benchmarks --only tree --quick` on the device: identical trees, and the
    vectorized build against the heapq one including its device-to-host copy."""
    from perfkit.engine.benchmarks.headline import tree_build_figures

    return tree_build_figures(quick=True, device=device)


# --- torch.profiler on CUDA ------------------------------------------------------------------------


def profiler_check(torch, out_dir: Path) -> dict:
    from perfkit.probe import profiler

    a = torch.randn(2048, 2048, device="cuda")
    trace = out_dir / "profiler-check.trace.json"
    profiler.start(str(trace))
    for _ in range(5):
        a @ a
    torch.cuda.synchronize()
    profiler.stop(limit=5)
    top = json.loads(profiler.top_path(trace).read_text())["operators"]
    device_us = sum(r["self_device_us"] for r in top)
    return {"ok": device_us > 0, "trace": trace.name, "top": top[:5], "device_us": device_us}


# --- the engine on CUDA ----------------------------------------------------------------------------


def _timed_generate(engine, prompts, *, cuda: bool, **options):
    """One generation under a span capture, timed by the host clock with the device synchronised
    before and after it: (result, capture, seconds)."""
    from perfkit.probe.spans import capture

    runs = []
    with capture() as cap:
        (wall,) = bench(
            lambda: runs.append(engine.generate(prompts, **options)),
            warmup=0,
            repeat=1,
            sync="each" if cuda else "none",
        )
    return runs[0], cap, wall


def engine_check(
    *,
    device: str = "cuda",
    preset: str | None = None,
    context: int = 4096,
    new_tokens: int = 64,
    budget: int = 32,
    hardware=None,
) -> list[dict]:
    """The bundled engine on `device` (bf16 on CUDA), spec and AR: per-phase time from perfkit
    spans (CUDA events on a GPU) against the synchronised wall clock, and the verify forward
    against its roofline floor on `hardware` (default: measured for that device)."""
    from perfkit.engine import checkpoints, data, load_engine
    from perfkit.machine import roofline
    from perfkit.phases import BREAKDOWN, STEP

    if preset is None:
        preset = "shipped" if (checkpoints.CHECKPOINT_DIR / "target.safetensors").exists() else "tiny-random"
    cuda = device.startswith("cuda")
    engine = load_engine(preset, device=device, dtype="bf16" if cuda else "fp32")
    prompts = data.sample_prompts(1, min(256, context))
    if hardware is None:
        hardware = roofline.Hardware.measured(device="cuda:0" if cuda else "cpu")
    rows = []
    for mode in ("spec", "ar"):
        engine.generate(prompts, max_new_tokens=8, mode=mode, budget=budget, context=context)  # warm-up
        result, cap, wall = _timed_generate(
            engine, prompts, cuda=cuda, max_new_tokens=new_tokens, mode=mode, budget=budget, context=context
        )
        steps = cap.steps()
        n = max(1, len(steps))
        per_step_ms = {k: 1e3 * sum(s.get(k, 0.0) for s in steps) / n for k in (STEP,) + BREAKDOWN}
        verify_floor = roofline.floor(
            roofline.step_cost(
                engine.target_config,
                batch=1,
                context=context,
                q_tokens=budget if mode == "spec" else 1,
                dtype_bytes=2 if cuda else 4,
            ),
            hardware,
        )
        verify = cap.samples("verify_forward")
        rows.append(
            {
                "mode": mode,
                "device": device,
                "preset": preset,
                "context": context,
                "steps": len(steps),
                "decode_tok_s": result.decode_tok_s,
                "mean_accept_length": result.mean_accept_length,
                "wall_s_synchronised": wall,
                "engine_decode_s": result.decode_s,
                "spans_step_total_s": sum(s[STEP] for s in steps),
                "per_step_ms": per_step_ms,
                "verify_forward_ms": 1e3 * statistics.fmean(verify) if verify else math.nan,
                "verify_floor_ms": verify_floor.seconds * 1e3,
                "verify_floor_note": verify_floor.note(),
            }
        )
    return rows


def _section(report: dict, name: str, fn, deadline: float) -> None:
    if time.perf_counter() > deadline:
        report[name] = {"error": "skipped: the 5-minute budget was spent", "traceback": ""}
        return
    t0 = time.perf_counter()
    try:
        report[name] = {"value": fn()}
    except Exception as exc:  # noqa: BLE001 - recorded, reported, and turned into exit status 1
        report[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    report[name]["seconds"] = round(time.perf_counter() - t0, 2)


def _plain(value):
    """`value` as JSON holds it: NaN and infinities as "nan", "inf", "-inf"; other objects as text."""
    if isinstance(value, float):
        return encode_number(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value if value is None or isinstance(value, (bool, int, str)) else str(value)


def run(out_dir: Path, *, refresh_bandwidth: bool = False, engine: bool = True) -> dict:
    """Every check, in order, into `out_dir`; returns the report dict (also written as JSON/markdown)."""
    reason = cuda_unavailable()
    if reason is not None:
        raise UserError(f"gpu-check: no CUDA device, nothing measured: {reason}")
    import torch

    from perfkit.machine import bandwidth, snapshot

    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    deadline = started + DEADLINE_S
    report: dict = {"meta": {"started_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"), "seconds": 0.0}}
    torch.cuda.init()

    def bw():
        m = bandwidth.measured(refresh=refresh_bandwidth)
        dev = m.main_device()
        snap_gpus = report["environment"].get("value", {}).get("gpus", [])
        return {
            "device": dev,
            "cached": m.cached,
            "triad_bytes_per_s": m.rate("triad", dev).mean,
            "triad_interval": [m.rate("triad", dev).low, m.rate("triad", dev).high],
            "copy_bytes_per_s": m.rate("copy", dev).mean,
            "matmul_flops": m.rate("matmul", dev).mean,
            "peak_bytes_per_s": snap_gpus[0]["peak_dram_bytes_per_s"] if snap_gpus else None,
            "lines": bandwidth.describe(m),
        }

    _section(report, "environment", lambda: snapshot.snapshot(bandwidth=False), deadline)
    _section(report, "bandwidth", bw, deadline)
    _section(report, "kernels", lambda: kernel_timings(torch), deadline)
    _section(report, "spans", lambda: span_check(torch), deadline)
    _section(report, "nvtx", lambda: nvtx_check(torch.cuda), deadline)
    _section(report, "profiler", lambda: profiler_check(torch, out_dir), deadline)
    _section(report, "tree_build", tree_build_check, deadline)
    if engine:
        _section(report, "engine", engine_check, deadline)
    report["meta"]["seconds"] = round(time.perf_counter() - started, 1)
    write_json(out_dir / "report.json", _plain(report), version=FORMAT_VERSION)
    write_atomic(out_dir / "report.md", render_markdown(report))
    return report


def main(argv: list[str]) -> int:
    """`perfkit gpu-check [--out DIR] [--refresh] [--no-engine]`."""
    p = argparse.ArgumentParser(prog="perfkit gpu-check", description=__doc__.split("\n\n")[0])
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    p.add_argument("--out", type=Path, default=Path("runs") / f"gpu-check-{stamp}", help="report directory")
    p.add_argument("--refresh", action="store_true", help="remeasure the bandwidth instead of using the cache")
    p.add_argument("--no-engine", action="store_true", help="skip the engine runs")
    a = p.parse_args(argv)
    report = run(a.out, refresh_bandwidth=a.refresh, engine=not a.no_engine)
    for line in findings(report):
        print(line)
    print(f"report: {a.out / 'report.md'} ({report['meta']['seconds']:.0f} s)")
    bad = failed_sections(report)
    if bad:
        print(f"gpu-check: FAILED: {', '.join(bad)}")
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except UserError as exc:
        print(exc, file=sys.stderr)
        sys.exit(2)
