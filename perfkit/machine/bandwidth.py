"""Measured memory bandwidth (and matmul throughput) of this machine, cached per machine.

A roofline floor is only as good as the bandwidth it divides by, and spec sheets are optimistic,
so perfkit measures it: STREAM-style `copy` (a = b) and `triad` (a = b + s*c) over arrays
several times larger than the last-level cache, on the CPU and, when CUDA is present, device to
device on each GPU (CUDA events). Bytes are counted the STREAM way (2 arrays for copy, 3 for triad,
no write-allocate traffic). A short fp32 (CPU) / bf16 (GPU) matmul gives the compute ceiling for
the roofline.

Each kernel is timed by `perfkit.bench` (warm-up calls discarded, each repetition one sample),
and every rate carries a 95% interval of the mean (perfkit.stats; batch means, one process). The
result is stored as versioned JSON under `$PERFKIT_CACHE_DIR` (default `~/.cache/perfkit`), keyed
by a fingerprint of the CPU model, core count, memory size and GPU names, so later runs reuse it;
`refresh=True` remeasures, and so does a cache of another format version.

Format history (`format_version`): 1: first format (key `format`, rates under `figures`); 2: `format_version`, `rates`.
"""

from __future__ import annotations

import datetime as _dt
import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import psutil

from perfkit import paths
from perfkit.errors import RecordError, UserError
from perfkit.files import VERSION_KEY, read_versioned, write_json
from perfkit.machine.devices import fingerprint, fingerprint_inputs
from perfkit.machine.utilization import busy_cpu_seconds
from perfkit.probe.timing import bench
from perfkit.stats import mean_interval

__all__ = [
    "Rate",
    "Measurement",
    "measure",
    "rates_on",
    "measured",
    "fingerprint",
    "cache_path",
    "describe",
    "FORMAT_VERSION",
]

FORMAT_VERSION = 2
_MIB = 2**20
_KERNELS = ("copy", "triad", "matmul")
BUSY = 0.25  # above this share of the CPUs used by other processes, a rate is flagged


@dataclass(frozen=True)
class Rate:
    """One measured rate: mean over repetitions with its 95% interval, in `unit` (B/s or FLOP/s)."""

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
    """Every rate measured on one machine, with the fingerprint it is cached under."""

    fingerprint: str
    machine: dict
    measured_at: str
    seconds: float
    rates: tuple[Rate, ...]
    busy: float | None = None  # share of all cores other processes used while measuring
    cached: bool = field(default=False, compare=False)
    path: str | None = field(default=None, compare=False)

    def rate(self, kernel: str, device: str | None = None) -> Rate:
        """The `kernel` rate on `device` (default: the first GPU when there is one, else cpu)."""
        device = device or self.main_device()
        for r in self.rates:
            if r.kernel == kernel and r.device == device:
                return r
        raise UserError(f"no {kernel} bandwidth figure for {device} in {self.path or 'this measurement'}")

    def main_device(self) -> str:
        devices = [r.device for r in self.rates]
        return next((d for d in devices if d.startswith("cuda")), "cpu")

    def to_dict(self) -> dict:
        """The fields as JSON-able values (the cache file adds its `format_version`)."""
        d = asdict(self)
        d["rates"] = [dict(asdict(r), samples=list(r.samples)) for r in self.rates]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Measurement:
        rates = tuple(Rate(**dict(r, samples=tuple(r["samples"]))) for r in d["rates"])
        return cls(
            fingerprint=d["fingerprint"],
            machine=d["machine"],
            measured_at=d["measured_at"],
            seconds=float(d["seconds"]),
            rates=rates,
            busy=d.get("busy"),
            cached=bool(d.get("cached", False)),
            path=d.get("path"),
        )


# --- statistics ------------------------------------------------------------------------------------


def _rate(kernel: str, device: str, unit: str, values: list[float], size: int) -> Rate:
    est = mean_interval(values)
    low, high = min(est.low, est.value), max(est.high, est.value)
    return Rate(kernel, device, unit, est.value, low, high, max(values), tuple(values), size)


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


def _seconds(fn, device, *, warmup: int, repeat: int, best_of: int = 1) -> list[float]:
    """Seconds per call of `fn`: CUDA events on a GPU, the host clock on the CPU. With `best_of` > 1 each
    of the `repeat` values is the fastest of that many calls in a row: the rate the hardware reaches."""
    secs = bench(fn, warmup=warmup, repeat=repeat * best_of, sync="cuda" if device.type == "cuda" else "none")
    return [min(secs[i : i + best_of]) for i in range(0, repeat * best_of, best_of)]


def _stream(
    torch, device: str, *, array_bytes: int, warmup: int, repeat: int, copy: bool = True, best_of: int = 1
) -> list[Rate]:
    """Copy (unless `copy` is False) and triad over arrays of `array_bytes` each."""
    n = array_bytes // 4
    dev = torch.device(device)
    a = torch.empty(n, dtype=torch.float32, device=dev)
    b = torch.full((n,), 1.0, dtype=torch.float32, device=dev)
    c = torch.full((n,), 2.0, dtype=torch.float32, device=dev)
    copy_s = _seconds(lambda: a.copy_(b), dev, warmup=warmup, repeat=repeat, best_of=best_of) if copy else None
    triad_s = _seconds(lambda: torch.add(b, c, alpha=3.0, out=a), dev, warmup=warmup, repeat=repeat, best_of=best_of)
    if float(a[n // 2]) != 7.0:  # the triad really ran over the arrays
        raise RuntimeError(f"triad on {device} produced {float(a[n // 2])}, expected 7.0")
    nbytes = n * 4
    triad = _rate("triad", device, "B/s", [3 * nbytes / s for s in triad_s], nbytes)
    return (
        [triad] if copy_s is None else [_rate("copy", device, "B/s", [2 * nbytes / s for s in copy_s], nbytes), triad]
    )


def _matmul(torch, device: str, *, side: int, warmup: int, repeat: int, best_of: int = 1) -> Rate:
    dev = torch.device(device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    x = torch.randn(side, side, dtype=dtype, device=dev)
    y = torch.randn(side, side, dtype=dtype, device=dev)
    out = torch.empty(side, side, dtype=dtype, device=dev)
    secs = _seconds(lambda: torch.matmul(x, y, out=out), dev, warmup=warmup, repeat=repeat, best_of=best_of)
    return _rate("matmul", device, "FLOP/s", [2 * side**3 / s for s in secs], side)


class _OtherWork:
    """How much of the machine's CPU other processes used from now until `share()`."""

    def __init__(self):
        self.me = psutil.Process()
        self.wall = time.perf_counter()
        self.mine = self._mine()
        self.machine = psutil.cpu_times()

    def _mine(self) -> float:
        t = self.me.cpu_times()
        return t.user + t.system

    def share(self) -> float:
        busy, _ = busy_cpu_seconds(self.machine, psutil.cpu_times())
        elapsed = (time.perf_counter() - self.wall) * (psutil.cpu_count() or 1)
        others = busy - (self._mine() - self.mine)
        return round(min(1.0, max(0.0, others / elapsed)), 3) if elapsed > 0 else 0.0


KERNELS = ("copy", "triad", "matmul")


def rates_on(
    device: str,
    *,
    array_bytes: int | None = None,
    warmup: int = 2,
    repeat: int = 10,
    kernels: tuple[str, ...] = KERNELS,
    matmul_repeat: int | None = None,
    best_of: int = 1,
) -> list[Rate]:
    """Copy, triad and matmul (or those of `kernels`) on one device ("cpu" or "cuda:N"), now, in this
    process and its threads. `repeat`: timed calls of each streaming kernel (x5 on a GPU); `matmul_repeat`:
    of the matmul (default: half of `repeat`, at least 3, on the CPU; 2 x `repeat` on a GPU). `best_of`:
    each value the fastest of that many calls in a row (a floor's peak rate; 1: every call a value)."""
    import torch

    unknown = set(kernels) - set(KERNELS)
    if unknown or not kernels:
        raise ValueError(f"kernels must be some of {KERNELS}, got {kernels}")
    streaming = "copy" in kernels or "triad" in kernels
    if device == "cpu":
        size = array_bytes or _cpu_array_bytes()
        rates = (
            _stream(
                torch, "cpu", array_bytes=size, warmup=warmup, repeat=repeat, copy="copy" in kernels, best_of=best_of
            )
            if streaming
            else []
        )
        if "matmul" in kernels:
            mm_repeat = matmul_repeat or max(3, repeat // 2)
            rates.append(_matmul(torch, "cpu", side=1024, warmup=1, repeat=mm_repeat, best_of=best_of))
        return [r for r in rates if r.kernel in kernels]
    index = torch.device(device).index or 0
    l2 = getattr(torch.cuda.get_device_properties(index), "L2_cache_size", 0) or 0
    size = array_bytes or max(512 * _MIB, 8 * l2)
    with torch.cuda.device(index):
        rates = (
            _stream(
                torch,
                device,
                array_bytes=size,
                warmup=warmup,
                repeat=repeat * 5,
                copy="copy" in kernels,
                best_of=best_of,
            )
            if streaming
            else []
        )
        if "matmul" in kernels:
            rates.append(
                _matmul(torch, device, side=8192, warmup=3, repeat=matmul_repeat or repeat * 2, best_of=best_of)
            )
    torch.cuda.empty_cache()
    return [r for r in rates if r.kernel in kernels]


def measure(
    *, cpu: bool = True, cuda: bool = True, array_bytes: int | None = None, warmup: int = 2, repeat: int = 10
) -> Measurement:
    """Measure copy, triad and matmul now on the CPU and on every CUDA device (a few seconds)."""
    import torch

    t0 = time.perf_counter()
    others = _OtherWork()
    devices = (["cpu"] if cpu else []) + (
        [f"cuda:{i}" for i in range(torch.cuda.device_count())] if cuda and torch.cuda.is_available() else []
    )
    rates = [r for d in devices for r in rates_on(d, array_bytes=array_bytes, warmup=warmup, repeat=repeat)]
    if not rates:
        raise UserError("nothing to measure: both cpu and cuda are off (or no CUDA device)")
    inputs = fingerprint_inputs()
    return Measurement(
        fingerprint=fingerprint(inputs),
        machine=inputs,
        measured_at=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        seconds=round(time.perf_counter() - t0, 3),
        rates=tuple(rates),
        busy=others.share(),
    )


# --- the cache -------------------------------------------------------------------------------------


def cache_dir() -> Path:
    return paths.cache_dir()


def cache_path(fp: str | None = None) -> Path:
    return cache_dir() / f"bandwidth-{fp or fingerprint()}.json"


def _load(path: Path) -> Measurement | None:
    """The cached measurement at `path`; None when absent or of another format version (remeasure)."""
    if not path.exists():
        return None
    try:
        data = read_versioned(path, current=FORMAT_VERSION)
    except RecordError as exc:
        if exc.field == VERSION_KEY:
            return None  # another perfkit wrote it (an old one spelled the key `format`): remeasure, not guess
        raise UserError(f"corrupt bandwidth cache ({exc}); delete it or run `perfkit env --refresh`") from None
    try:
        return replace(Measurement.from_dict(data), cached=True, path=str(path))
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"{path}: invalid bandwidth cache ({exc}); delete it or run `perfkit env --refresh`") from None


def measured(*, refresh: bool = False) -> Measurement:
    """This machine's measurement: from the cache when there is one (`.cached` says so), else now."""
    path = cache_path()
    if not refresh:
        hit = _load(path)
        if hit is not None:
            return hit
    fresh = measure()
    stored = {k: v for k, v in fresh.to_dict().items() if k not in ("cached", "path")}
    write_json(path, stored, version=FORMAT_VERSION)
    return replace(fresh, path=str(path))


def describe(m: Measurement | dict) -> list[str]:
    """Lines for `perfkit env`: every rate with its interval, then where it came from."""
    if isinstance(m, dict):
        m = Measurement.from_dict(m)
    lines = [r.text() for r in m.rates]
    if m.busy is not None and m.busy > BUSY:
        lines.append(
            f"WARNING: other processes used {m.busy:.0%} of the CPUs while this was measured, so the "
            "figures may be low; rerun `perfkit env --refresh` on a quiet machine"
        )
    if m.cached:
        lines.append(f"(cached {m.measured_at} in {m.path}; `perfkit env --refresh` remeasures)")
    else:
        lines.append(f"(measured now in {m.seconds:.1f} s; cached in {m.path} for later runs)")
    return lines
