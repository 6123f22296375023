"""Measured memory bandwidth (and matmul throughput) of this machine, cached per machine.

A roofline floor is only as good as the bandwidth it divides by, and spec sheets are optimistic,
so perfkit measures it: STREAM-style ``copy`` (a = b) and ``triad`` (a = b + s*c) over arrays
several times larger than the last-level cache, on the CPU and, when CUDA is present, device to
device on each GPU (CUDA events). Bytes are counted the STREAM way (2 arrays for copy, 3 for triad,
no write-allocate traffic). A short fp32 (CPU) / bf16 (GPU) matmul gives the compute ceiling for
the roofline.

Warm-up calls are discarded, each repetition is one sample, and every figure carries a 95%
bootstrap interval of the mean. The result is stored as versioned JSON under
``$PERFKIT_CACHE_DIR`` (default ``~/.cache/perfkit``), keyed by a fingerprint of the CPU model,
core count, memory size and GPU names, so later runs reuse it; ``refresh=True`` remeasures.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import psutil

from perfkit.errors import UserError
from perfkit.stats import mean_interval

__all__ = ["Figure", "Measurement", "measure", "measured", "fingerprint", "cache_path", "describe"]

FORMAT = 1
_MIB = 2**20
_KERNELS = ("copy", "triad", "matmul")
BUSY = 0.25  # above this share of the CPUs used by other processes, a figure is flagged


@dataclass(frozen=True)
class Figure:
    """One measured rate: mean over repetitions with its 95% interval, in ``unit`` (B/s or FLOP/s)."""

    kernel: str
    device: str
    unit: str
    mean: float
    low: float
    high: float
    best: float
    samples: tuple[float, ...]
    size: int  # bytes per array (copy/triad) or the square matrix side (matmul)

    def __post_init__(self):
        if self.kernel not in _KERNELS:
            raise ValueError(f"unknown kernel {self.kernel!r}")
        if not self.samples or not all(math.isfinite(s) and s > 0 for s in self.samples):
            raise ValueError(f"{self.kernel} on {self.device}: samples must be finite and positive")
        if not self.low <= self.mean <= self.high:
            raise ValueError(f"{self.kernel} on {self.device}: interval does not hold the mean")

    def text(self) -> str:
        scale, prefix = (1e9, "GB/s") if self.unit == "B/s" else (1e9, "GFLOP/s")
        if self.mean >= 1e12:
            scale, prefix = (1e12, "TB/s") if self.unit == "B/s" else (1e12, "TFLOP/s")
        what = f"{self.size // _MIB} MiB arrays" if self.kernel != "matmul" else f"{self.size}^2 matmul"
        return (
            f"{self.device} {self.kernel} {self.mean / scale:.3g} {prefix} "
            f"[{self.low / scale:.3g}, {self.high / scale:.3g}] (95% CI, {len(self.samples)} reps, {what})"
        )


@dataclass(frozen=True)
class Measurement:
    """Every figure measured on one machine, with the fingerprint it is cached under."""

    fingerprint: str
    machine: dict
    measured_at: str
    seconds: float
    figures: tuple[Figure, ...]
    busy: float | None = None  # share of all cores other processes used while measuring
    cached: bool = field(default=False, compare=False)
    path: str | None = field(default=None, compare=False)

    def figure(self, kernel: str, device: str | None = None) -> Figure:
        """The ``kernel`` figure on ``device`` (default: the first GPU when there is one, else cpu)."""
        device = device or self.main_device()
        for f in self.figures:
            if f.kernel == kernel and f.device == device:
                return f
        raise UserError(f"no {kernel} bandwidth figure for {device} in {self.path or 'this measurement'}")

    def main_device(self) -> str:
        devices = [f.device for f in self.figures]
        return next((d for d in devices if d.startswith("cuda")), "cpu")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["format"] = FORMAT
        d["figures"] = [dict(asdict(f), samples=list(f.samples)) for f in self.figures]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Measurement":
        if d.get("format") != FORMAT:
            raise ValueError(f"bandwidth cache format {d.get('format')!r}, expected {FORMAT}")
        figures = tuple(Figure(**dict(f, samples=tuple(f["samples"]))) for f in d["figures"])
        return cls(
            fingerprint=d["fingerprint"],
            machine=d["machine"],
            measured_at=d["measured_at"],
            seconds=float(d["seconds"]),
            figures=figures,
            busy=d.get("busy"),
            cached=bool(d.get("cached", False)),
            path=d.get("path"),
        )


# --- statistics ------------------------------------------------------------------------------------


def _figure(kernel: str, device: str, unit: str, rates: list[float], size: int) -> Figure:
    est = mean_interval(rates)
    low, high = min(est.low, est.value), max(est.high, est.value)
    return Figure(kernel, device, unit, est.value, low, high, max(rates), tuple(rates), size)


# --- the measurement -------------------------------------------------------------------------------


def _largest_cpu_cache() -> int:
    """Bytes of the largest CPU cache level sysfs reports (0 when unknown)."""
    largest = 0
    for size_file in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = size_file.read_text().strip().upper()
        mult = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            largest = max(largest, int(digits) * mult)
    return largest


def _cpu_array_bytes() -> int:
    """STREAM's rule: each array at least 4x the last-level cache; never more than 1/16 of free RAM."""
    want = max(128 * _MIB, 4 * _largest_cpu_cache())
    cap = psutil.virtual_memory().available // 16
    return int(max(16 * _MIB, min(want, cap)))


def _time_cpu(fn, *, warmup: int, repeat: int) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def _time_cuda(torch, fn, *, warmup: int, repeat: int) -> list[float]:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    pairs = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        pairs.append((start, end))
    torch.cuda.synchronize()
    return [s.elapsed_time(e) / 1e3 for s, e in pairs]


def _stream(torch, device: str, *, array_bytes: int, warmup: int, repeat: int) -> list[Figure]:
    n = array_bytes // 4
    dev = torch.device(device)
    a = torch.empty(n, dtype=torch.float32, device=dev)
    b = torch.full((n,), 1.0, dtype=torch.float32, device=dev)
    c = torch.full((n,), 2.0, dtype=torch.float32, device=dev)
    time_it = (lambda fn: _time_cuda(torch, fn, warmup=warmup, repeat=repeat)) if dev.type == "cuda" else (
        lambda fn: _time_cpu(fn, warmup=warmup, repeat=repeat)
    )
    copy_s = time_it(lambda: a.copy_(b))
    triad_s = time_it(lambda: torch.add(b, c, alpha=3.0, out=a))
    if float(a[n // 2]) != 7.0:  # the triad really ran over the arrays
        raise RuntimeError(f"triad on {device} produced {float(a[n // 2])}, expected 7.0")
    nbytes = n * 4
    return [
        _figure("copy", device, "B/s", [2 * nbytes / s for s in copy_s], nbytes),
        _figure("triad", device, "B/s", [3 * nbytes / s for s in triad_s], nbytes),
    ]


def _matmul(torch, device: str, *, side: int, warmup: int, repeat: int) -> Figure:
    dev = torch.device(device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    x = torch.randn(side, side, dtype=dtype, device=dev)
    y = torch.randn(side, side, dtype=dtype, device=dev)
    out = torch.empty(side, side, dtype=dtype, device=dev)
    fn = lambda: torch.matmul(x, y, out=out)  # noqa: E731
    secs = _time_cuda(torch, fn, warmup=warmup, repeat=repeat) if dev.type == "cuda" else _time_cpu(
        fn, warmup=warmup, repeat=repeat
    )
    return _figure("matmul", device, "FLOP/s", [2 * side**3 / s for s in secs], side)


class _OtherWork:
    """How much of the machine's CPU other processes used from now until ``share()``."""

    def __init__(self):
        self.me = psutil.Process()
        self.wall = time.perf_counter()
        self.mine = self._mine()
        self.machine = psutil.cpu_times()

    def _mine(self) -> float:
        t = self.me.cpu_times()
        return t.user + t.system

    def share(self) -> float:
        now = psutil.cpu_times()
        idle = lambda t: t.idle + getattr(t, "iowait", 0.0)  # noqa: E731
        busy = (sum(now) - sum(self.machine)) - (idle(now) - idle(self.machine))
        elapsed = (time.perf_counter() - self.wall) * (psutil.cpu_count() or 1)
        others = busy - (self._mine() - self.mine)
        return round(min(1.0, max(0.0, others / elapsed)), 3) if elapsed > 0 else 0.0


def measure(*, cpu: bool = True, cuda: bool = True, array_bytes: int | None = None,
            warmup: int = 2, repeat: int = 10) -> Measurement:
    """Measure copy, triad and matmul now on the CPU and on every CUDA device (a few seconds)."""
    import torch

    t0 = time.perf_counter()
    others = _OtherWork()
    figures: list[Figure] = []
    if cpu:
        size = array_bytes or _cpu_array_bytes()
        figures += _stream(torch, "cpu", array_bytes=size, warmup=warmup, repeat=repeat)
        figures.append(_matmul(torch, "cpu", side=1024, warmup=1, repeat=max(3, repeat // 2)))
    if cuda and torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            dev = f"cuda:{i}"
            l2 = getattr(torch.cuda.get_device_properties(i), "L2_cache_size", 0) or 0
            size = array_bytes or max(512 * _MIB, 8 * l2)
            with torch.cuda.device(i):
                figures += _stream(torch, dev, array_bytes=size, warmup=warmup, repeat=repeat * 5)
                figures.append(_matmul(torch, dev, side=8192, warmup=3, repeat=repeat * 2))
            torch.cuda.empty_cache()
    if not figures:
        raise UserError("nothing to measure: both cpu and cuda are off (or no CUDA device)")
    inputs = fingerprint_inputs()
    return Measurement(
        fingerprint=fingerprint(inputs),
        machine=inputs,
        measured_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        seconds=round(time.perf_counter() - t0, 3),
        figures=tuple(figures),
        busy=others.share(),
    )


# --- the cache -------------------------------------------------------------------------------------


def fingerprint_inputs() -> dict:
    """What identifies a machine for the cache: CPU model, cores, memory (GiB) and GPU names."""
    from perfkit.machine.snapshot import cpu_model, gpu_names

    return {
        "cpu_model": cpu_model(),
        "logical_cores": psutil.cpu_count(logical=True),
        "memory_gib": round(psutil.virtual_memory().total / 2**30),
        "gpus": gpu_names(),
    }


def fingerprint(inputs: dict | None = None) -> str:
    """A short stable hash of :func:`fingerprint_inputs`."""
    inputs = fingerprint_inputs() if inputs is None else inputs
    text = json.dumps(inputs, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_dir() -> Path:
    return Path(os.environ.get("PERFKIT_CACHE_DIR") or Path.home() / ".cache" / "perfkit")


def cache_path(fp: str | None = None) -> Path:
    return cache_dir() / f"bandwidth-{fp or fingerprint()}.json"


def _load(path: Path) -> Measurement | None:
    """The cached measurement at ``path``; None when absent or written by another format version."""
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: corrupt bandwidth cache ({exc}); delete it or run `perfkit env --refresh`")
    if data.get("format") != FORMAT:
        return None  # an older perfkit wrote it: remeasure rather than guess
    try:
        return replace(Measurement.from_dict(data), cached=True, path=str(path))
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"{path}: invalid bandwidth cache ({exc}); delete it or run `perfkit env --refresh`")


def measured(*, refresh: bool = False) -> Measurement:
    """This machine's measurement: from the cache when there is one (``.cached`` says so), else now."""
    from perfkit.files import write_atomic

    path = cache_path()
    if not refresh:
        hit = _load(path)
        if hit is not None:
            return hit
    fresh = measure()
    stored = {k: v for k, v in fresh.to_dict().items() if k not in ("cached", "path")}
    write_atomic(path, json.dumps(stored, indent=1, sort_keys=True) + "\n")
    return replace(fresh, path=str(path))


def describe(m: Measurement | dict) -> list[str]:
    """Lines for `perfkit env`: every figure with its interval, then where it came from."""
    if isinstance(m, dict):
        m = Measurement.from_dict(m)
    lines = [f.text() for f in m.figures]
    if m.busy is not None and m.busy > BUSY:
        lines.append(f"WARNING: other processes used {m.busy:.0%} of the CPUs while this was measured, so the "
                     "figures may be low; rerun `perfkit env --refresh` on a quiet machine")
    if m.cached:
        lines.append(f"(cached {m.measured_at} in {m.path}; `perfkit env --refresh` remeasures)")
    else:
        lines.append(f"(measured now in {m.seconds:.1f} s; cached in {m.path} for later runs)")
    return lines
