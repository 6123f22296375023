"""Hand a probe to torch.profiler: a Chrome trace of the whole execution and its top operators.

`perfkit run --profile torch` injects `start(trace_path)` as the probe's first cell and
`stop()` as its last: the whole execution is recorded, the Chrome trace (open it in Perfetto,
chrome://tracing or TensorBoard; `.json.gz` in a run) is saved in the run with its own path as
`traceName`, and the top operators are printed in the notebook and saved next to the trace as
`<trace>.top.json`.

Format history (`format_version`) of `<trace>.top.json`: 1: first format (the key was `format`); 2: `format_version`.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from perfkit.files import write_atomic, write_json

__all__ = ["start", "stop", "active", "top_operators", "top_path", "format_top", "FORMAT_VERSION"]

FORMAT_VERSION = 2

_session: dict | None = None  # {"profile": torch.profiler.profile, "path": str}


# --- torch.profiler --------------------------------------------------------------------------------


def active() -> bool:
    """Whether a torch.profiler capture started by `start` is running."""
    return _session is not None


def start(trace_path: str) -> None:
    """Start recording every operator (CPU, and CUDA kernels when present) until `stop`."""
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
    operators (also saved next to it as `<trace>.top.json`). None when nothing was recording."""
    global _session
    if _session is None:
        print("perfkit.probe.profiler.stop(): no capture was started; nothing saved")
        return None
    session, _session = _session, None
    prof = session["profile"]
    prof.stop()
    path = Path(session["path"])
    with tempfile.TemporaryDirectory() as scratch:  # torch writes the trace to a path; write_atomic publishes it
        exported = Path(scratch) / "trace.json"
        prof.export_chrome_trace(str(exported))
        data = exported.read_bytes()
    write_atomic(path, _published(data, path))
    rows = top_operators(prof.key_averages(), limit=limit, by_device=session["cuda"])
    write_json(top_path(path), {"operators": rows}, version=FORMAT_VERSION)
    print(f"torch.profiler trace: {path}")
    print(format_top(rows))
    return str(path)


def top_path(trace: Path) -> Path:
    """Where the top operators of a trace are saved: `<trace>.top.json`, a `.gz` left out of the name."""
    name = trace.name[:-3] if trace.name.endswith(".gz") else trace.name
    return trace.with_name(name + ".top.json")


def _published(exported: bytes, path: Path) -> bytes:
    """The trace as it is kept: its `traceName` the path it is kept at (torch wrote the scratch file's),
    gzip-compressed (mtime 0: the same trace, the same bytes) when the path ends in `.gz`, which Perfetto,
    chrome://tracing and TensorBoard open as they are."""
    import gzip
    import json

    try:
        trace = json.loads(exported)
    except ValueError:
        trace = None
    if isinstance(trace, dict):
        trace["traceName"] = str(path)
        exported = json.dumps(trace).encode()
    return gzip.compress(exported, mtime=0) if path.name.endswith(".gz") else exported


def top_operators(averages, *, limit: int = 15, by_device: bool = False) -> list[dict]:
    """The operators with the most self time (device time on CUDA), times in microseconds.

    `averages`: `profile.key_averages()` (any iterable of objects with torch's field names).
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
    """Aligned text table of `top_operators` rows, with each one's share of all self CPU time."""
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
