"""Hand a probe to the heavy tools: a torch.profiler trace, and Nsight Compute metrics.

``perfkit run --profile torch`` injects ``start(trace_path)`` as the probe's first cell and
``stop()`` as its last: the whole execution is recorded, the Chrome trace (open it in Perfetto or
chrome://tracing) is saved in the run, and the top operators are printed in the notebook.

``ncu_metrics`` collects Nsight Compute metrics for a kernel through nsight-python (the optional
``perfkit[nsight]`` extra) when ``ncu``, the package and a CUDA device are all present. Otherwise
it returns a result that says "unavailable: <why>" and holds no samples, which the verdict layer
turns into *inconclusive* with that reason, never into an error or a pass.
"""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

__all__ = ["start", "stop", "active", "top_operators", "format_top", "NcuResult", "ncu_unavailable", "ncu_metrics"]

_INSTALL = "pip install 'perfkit[nsight]'"

_session: dict | None = None  # {"profile": torch.profiler.profile, "path": str}


# --- torch.profiler --------------------------------------------------------------------------------


def active() -> bool:
    """Whether a torch.profiler capture started by :func:`start` is running."""
    return _session is not None


def start(trace_path: str) -> None:
    """Start recording every operator (CPU, and CUDA kernels when present) until :func:`stop`."""
    global _session
    if _session is not None:
        raise RuntimeError(f"perfkit.probe.profiler already recording to {_session['path']}; call stop() first")
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    prof = profile(activities=activities, record_shapes=False, with_stack=False)
    prof.start()
    _session = {"profile": prof, "path": str(trace_path), "cuda": torch.cuda.is_available()}


def stop(*, limit: int = 15) -> str | None:
    """Stop recording, save the Chrome trace at the path given to start() and print the top
    operators (also saved next to it as ``<trace>.top.json``). None when nothing was recording."""
    global _session
    if _session is None:
        print("perfkit.probe.profiler.stop(): no capture was started; nothing saved")
        return None
    session, _session = _session, None
    prof = session["profile"]
    prof.stop()
    path = Path(session["path"])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    prof.export_chrome_trace(str(tmp))
    tmp.replace(path)
    rows = top_operators(prof.key_averages(), limit=limit, by_device=session["cuda"])
    from perfkit.files import write_atomic

    write_atomic(path.with_name(path.name + ".top.json"), json.dumps({"format": 1, "operators": rows}, indent=1) + "\n")
    print(f"torch.profiler trace: {path}")
    print(format_top(rows))
    return str(path)


def top_operators(averages, *, limit: int = 15, by_device: bool = False) -> list[dict]:
    """The operators with the most self time (device time on CUDA), times in microseconds.

    ``averages``: ``profile.key_averages()`` (any iterable of objects with torch's field names).
    """
    rows = []
    for ev in averages:
        device_self = getattr(ev, "self_device_time_total", None)
        if device_self is None:
            device_self = getattr(ev, "self_cuda_time_total", 0.0)
        rows.append(
            {
                "name": ev.key,
                "calls": int(ev.count),
                "self_cpu_us": float(ev.self_cpu_time_total),
                "cpu_total_us": float(ev.cpu_time_total),
                "self_device_us": float(device_self or 0.0),
            }
        )
    total_cpu = sum(r["self_cpu_us"] for r in rows)
    for r in rows:
        r["self_cpu_share"] = r["self_cpu_us"] / total_cpu if total_cpu > 0 else 0.0
    key = "self_device_us" if by_device else "self_cpu_us"
    rows.sort(key=lambda r: (-r[key], r["name"]))
    return rows[:limit]


def format_top(rows: list[dict]) -> str:
    """Aligned text table of :func:`top_operators` rows, with each one's share of all self CPU time."""
    if not rows:
        return "(no operators recorded)"
    show_dev = any(r["self_device_us"] for r in rows)
    width = min(60, max(len(r["name"]) for r in rows))
    head = f"{'operator':<{width}} {'calls':>7} {'self CPU ms':>12} {'share':>6} {'CPU total ms':>13}"
    head += f" {'self device ms':>15}" if show_dev else ""
    lines = [head]
    for r in rows:
        line = (
            f"{r['name'][:width]:<{width}} {r['calls']:>7} {r['self_cpu_us'] / 1e3:>12.3f} "
            f"{100 * r['self_cpu_share']:>5.1f}% {r['cpu_total_us'] / 1e3:>13.3f}"
        )
        line += f" {r['self_device_us'] / 1e3:>15.3f}" if show_dev else ""
        lines.append(line)
    return "\n".join(lines)


# --- Nsight Compute through nsight-python ----------------------------------------------------------


@dataclass(frozen=True)
class NcuResult:
    """Nsight Compute metrics of one annotated kernel region, or why there are none."""

    available: bool
    reason: str  # "" when available, else "unavailable: <why>"
    label: str
    metrics: dict[str, dict] = field(default_factory=dict)  # metric -> mean, std, min, max, n, unit

    def value(self, metric: str) -> float | None:
        m = self.metrics.get(metric)
        return None if m is None else m["mean"]

    def samples(self, metric: str) -> list[float]:
        """The metric's mean as one sample, or [] when unavailable (so the verdict is inconclusive)."""
        v = self.value(metric)
        return [] if v is None or not math.isfinite(v) else [v]


def ncu_unavailable() -> str | None:
    """None when Nsight Compute metrics can be collected here, else "unavailable: <why>"."""
    if importlib.util.find_spec("nsight") is None:
        return f"unavailable: nsight-python is not installed ({_INSTALL})"
    if shutil.which("ncu") is None:
        return "unavailable: Nsight Compute's `ncu` is not on PATH (install the CUDA toolkit or Nsight Compute)"
    import torch

    if not torch.cuda.is_available():
        return "unavailable: no CUDA device (Nsight Compute profiles GPU kernels)"
    return None


def ncu_metrics(fn: Callable[[], object], *, label: str,
                metrics: tuple[str, ...] = ("gpu__time_duration.sum", "dram__bytes.sum"),
                runs: int = 5) -> NcuResult:
    """Run ``fn()`` under Nsight Compute ``runs`` times and return the metrics of its kernels
    (summed over the kernels ``fn`` launches), or an unavailable result with the reason."""
    reason = ncu_unavailable()
    if reason is not None:
        return NcuResult(available=False, reason=reason, label=label)
    import nsight

    @nsight.analyze.kernel(configs=[(label,)], runs=runs, metrics=list(metrics),
                           combine_kernel_metrics=lambda a, b: a + b, output="quiet")
    def _profiled(region):
        with nsight.annotate(region):
            fn()

    try:
        frame = _profiled().to_dataframe()
    except Exception as exc:  # noqa: BLE001 - e.g. no permission for GPU counters: a reason, not a pass
        return NcuResult(available=False, reason=f"unavailable: ncu failed: {type(exc).__name__}: {exc}", label=label)
    return NcuResult(available=True, reason="", label=label, metrics=_metrics_from_rows(frame.to_dict("records")))


def _metrics_from_rows(rows: list[dict]) -> dict[str, dict]:
    """nsight-python's aggregated rows (one per metric) as plain JSON-able numbers."""
    out = {}
    for r in rows:
        out[str(r["Metric"])] = {
            "mean": float(r["AvgValue"]),
            "std": float(r.get("StdDev", float("nan"))),
            "min": float(r.get("MinValue", float("nan"))),
            "max": float(r.get("MaxValue", float("nan"))),
            "n": int(r.get("NumRuns", 0)),
            "unit": None if r.get("Unit") is None or r.get("Unit") != r.get("Unit") else str(r["Unit"]),
        }
    return out
