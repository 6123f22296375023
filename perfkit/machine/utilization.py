"""What the machine was doing while a probe ran: a background sampler and its plot.

A step time is easier to believe next to the CPU and GPU load it ran under (another job on the
cores, a GPU at 30% utilisation, clocks dropping under a power cap). The sampler is a daemon thread
that wakes every `interval_s` and reads, for the process tree it watches (the runner and the
notebook kernels it starts, and a server on this machine that a probe drives: `also`), CPU utilisation
(% of one core, summed) and resident memory, plus the
system-wide CPU load, and per NVIDIA GPU through NVML: utilisation, memory used, SM and memory
clocks and power. It measures its own CPU time, so its overhead is a number in every trace.

Format history (`format_version`): 1: first format (the key was `format`); 2: `format_version`;
3: what judges whether the machine was fit to measure on: `swap_bytes` (swapped in + out since
boot), `cpu_freq_mhz`, `tree_pids` (every process of the tree), and per GPU `throttle_reasons`
(NVML's bit mask), `temperature_c` and `gpu_pids` (processes using it); `cpus`: the CPUs the
execution was pinned to, whose load `system_cpu_percent` is (null: the whole machine's), and
`logical_cores` their count; 4: `foreign_processes`, the busiest processes outside the tree over the
trace (pid, name, % of one core), for saying who loaded the machine.
"""

from __future__ import annotations

import io
import os
import threading
import time
from pathlib import Path

import psutil

from perfkit.files import VERSION_KEY, write_atomic
from perfkit.machine.devices import nvml

__all__ = ["Sampler", "plot_trace", "busy_cpu_seconds", "FORMAT_VERSION"]

FORMAT_VERSION = 4


def busy_cpu_seconds(before, after) -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine, summed over its cores, between two
    `psutil.cpu_times()` reads; idle and iowait time are not busy."""
    idle = lambda t: t.idle + getattr(t, "iowait", 0.0)  # noqa: E731
    total = sum(after) - sum(before)
    return total - (idle(after) - idle(before)), total


def _cpu_by_process() -> dict[int, tuple[str, float, float]]:
    """pid -> (name, CPU seconds, create time) of every process that can be read now."""
    out = {}
    for p in psutil.process_iter(["name", "cpu_times", "create_time"]):
        times = p.info.get("cpu_times")
        if times is not None:
            out[p.pid] = (p.info.get("name") or "?", times.user + times.system, p.info.get("create_time") or 0.0)
    return out


def foreign_processes(before: dict, after: dict, *, mine: set[int], seconds: float, top: int = 5) -> list[dict]:
    """The busiest processes outside `mine` between two `_cpu_by_process` reads `seconds` apart that used
    1% of a core or more: pid, name and % of one core, busiest first (a pid reused in between counts from
    its birth)."""
    busy = []
    started = time.time() - seconds
    for pid, (name, cpu_s, created) in after.items():
        then = before.get(pid)
        if pid in mine or (then is None and created < started):  # ours, or not readable at the start
            continue
        used = cpu_s - then[1] if then is not None and then[2] == created else cpu_s
        percent = round(100.0 * used / max(seconds, 1e-9), 1)
        if percent >= 1.0:  # a per cent of a core or more: the rest is the machine's housekeeping
            busy.append({"pid": pid, "name": name, "percent": percent})
    return sorted(busy, key=lambda x: (-x["percent"], x["pid"]))[:top]


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


class _Tree:
    """CPU time and RSS of a process and its descendants, as deltas between two reads.

    Listing descendants scans every process on the machine, so it is redone only every
    `rescan_s`, but every YOUNG_RESCAN_S for the tree's first YOUNG_S seconds: a warm replicate's kernel is
    forked and measuring within a second of its launch, and its CPU must not read as foreign load
    until a rescan finds it. The known members are read on every sample.
    """

    YOUNG_S = 5.0
    YOUNG_RESCAN_S = 0.2

    def __init__(self, pid: int, *, rescan_s: float = 1.0, also: tuple[int, ...] = ()):
        # None: the process had already ended (a cancelled job, a probe that failed at once); the
        # trace still holds the machine's load, and the tree reads as empty rather than failing the run
        self.root = _process(pid)
        self.also = [p for p in (_process(pid) for pid in also) if p is not None]  # more roots: a driven server
        self.rescan_s = rescan_s
        self.born = time.time()
        self.procs: dict[int, psutil.Process] = {}
        self.ever: set[int] = set()  # every pid the tree has had
        self.cpu_s: dict[int, float] = {}
        self.last_t: float | None = None
        self.scanned_at = float("-inf")
        self.scanned_before = float("-inf")  # the scan before the last: a process born since is new to us

    def _members(self, now: float) -> list[psutil.Process]:
        if now - self.scanned_at >= (self.rescan_s if now - self.born > self.YOUNG_S else self.YOUNG_RESCAN_S):
            self.scanned_before, self.scanned_at = self.scanned_at, now
            found = []
            for root in [r for r in (self.root, *self.also) if r is not None]:
                try:
                    found += [root] + root.children(recursive=True)
                except psutil.NoSuchProcess:
                    continue
            for p in found:
                self.procs.setdefault(p.pid, p)  # keep one Process per pid (it remembers create_time)
            self.procs = {p.pid: self.procs[p.pid] for p in found}
            self.ever.update(self.procs)
        return list(self.procs.values())

    def read(self) -> tuple[float, float | None, int, int]:
        """(when, CPU % since the previous read or None on the first, RSS bytes, process count)."""
        busy = 0.0
        rss = 0
        seen: dict[int, float] = {}
        for p in self._members(time.time()):
            try:
                with p.oneshot():
                    t = p.cpu_times()
                    mem = p.memory_info().rss
                    created = p.create_time()
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                continue  # exited between listing and reading: its last interval is lost, not faked
            total = t.user + t.system
            seen[p.pid] = total
            rss += mem
            if p.pid in self.cpu_s:
                busy += max(0.0, total - self.cpu_s[p.pid])
            elif self.last_t is not None and created >= self.scanned_before:
                # born since the previous scan: all its CPU time is the tree's, counted now rather than lost
                busy += total
        now = time.time()  # when the counters were read (the thread may have waited for the GIL)
        percent = None if self.last_t is None else 100.0 * busy / max(now - self.last_t, 1e-9)
        self.cpu_s = seen
        self.last_t = now
        return now, percent, rss, len(seen)


class _MachineCpu:
    """CPU load (% of the CPUs watched: all of the machine's, or an execution's own) between two reads."""

    def __init__(self, cpus: tuple[int, ...] | None = None):
        self.cpus = cpus
        self.last = None

    def _times(self):
        if self.cpus is None:
            return [psutil.cpu_times()]
        every = psutil.cpu_times(percpu=True)
        return [every[c] for c in self.cpus if c < len(every)]

    def read(self) -> float | None:
        now = self._times()
        if self.last is None:
            self.last = now
            return None
        pairs = [busy_cpu_seconds(a, b) for a, b in zip(self.last, now)]
        self.last = now
        busy, total = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
        return 0.0 if total <= 0 else max(0.0, 100.0 * busy / total)


class Sampler:
    """Samples utilisation in a background thread between `start()` and `stop()`.

    `pid`: root of the watched process tree (default: this process); `rescan_s`: how often new
    child processes are looked for; `cpus`: the CPUs whose load is read (default: the machine's),
    an execution's own when it runs pinned to them.

    `stop()` returns the trace: a JSON-able dict with epoch-second timestamps `t` and one list
    per series, the GPUs' series under `gpus`, and the sampler's own cost under `overhead`.
    """

    def __init__(
        self,
        interval_s: float = 0.25,
        *,
        pid: int | None = None,
        rescan_s: float = 1.0,
        cpus: tuple[int, ...] | None = None,
        also: tuple[int, ...] = (),
    ):
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.interval_s = float(interval_s)
        self.rescan_s = float(rescan_s)
        self.pid = os.getpid() if pid is None else pid
        self.also = tuple(also)  # roots of more processes that are part of the measurement (a driven server)
        self.cpus = tuple(cpus) if cpus else None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._trace: dict | None = None
        self._error: BaseException | None = None
        self._times: list[float] = []

    # -- lifecycle --

    def start(self) -> Sampler:
        if self._thread is not None:
            raise RuntimeError("Sampler.start() called twice; use a new Sampler per probe execution")
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="perfkit-utilization", daemon=True)
        self._thread.start()
        self._ready.wait()  # the first sample exists before the probe starts
        return self

    def stop(self) -> dict:
        if self._thread is None:
            raise RuntimeError("Sampler.stop() without start()")
        self._stop.set()
        self._thread.join()
        if self._error is not None:
            raise RuntimeError(f"utilization sampler failed: {self._error!r}") from self._error
        return self._trace

    def times(self) -> list[float]:
        """The epoch seconds of the samples taken so far (a copy; safe to read while it runs)."""
        return list(self._times)

    # -- the thread --

    def _run(self) -> None:
        cpu0 = time.thread_time()
        wall0 = time.perf_counter()
        trace: dict = {
            VERSION_KEY: FORMAT_VERSION,
            "interval_s": self.interval_s,
            "pid": self.pid,
            "t": self._times,
            "cpu_percent": [],
            "system_cpu_percent": [],
            "rss_bytes": [],
            "processes": [],
            "swap_bytes": [],
            "cpu_freq_mhz": [],
            "tree_pids": [],
            "logical_cores": len(self.cpus) if self.cpus else psutil.cpu_count(logical=True),
            "cpus": list(self.cpus) if self.cpus else None,
            "gpus": [],
            "gpu_note": None,
            "foreign_processes": [],
        }
        try:
            processes = _cpu_by_process()
            tree = _Tree(self.pid, rescan_s=self.rescan_s, also=self.also)
            machine = _MachineCpu(self.cpus)
            with nvml() as nv:
                trace["gpu_note"] = nv.note
                gpus = [self._gpu_series(nv, i, h) for i, h in enumerate(nv.handles)]
                trace["gpus"] = [g for g, _ in gpus]

                def sample() -> None:
                    now, cpu, rss, count = tree.read()
                    trace["t"].append(now)
                    sys_cpu = machine.read()
                    trace["cpu_percent"].append(None if cpu is None else round(cpu, 2))
                    trace["system_cpu_percent"].append(None if sys_cpu is None else round(sys_cpu, 2))
                    trace["rss_bytes"].append(rss)
                    trace["processes"].append(count)
                    trace["swap_bytes"].append(_swapped())
                    trace["cpu_freq_mhz"].append(_frequency())
                    for series, handle in gpus:
                        self._gpu_sample(nv, handle, series)

                sample()
                self._ready.set()
                while not self._stop.wait(self.interval_s):
                    sample()
                sample()  # at stop: even a probe shorter than interval_s gets a start and an end
                trace["tree_pids"] = sorted(tree.ever)
                mine = tree.ever | {os.getpid()}  # the tree, and the process sampling it
                seconds = time.perf_counter() - wall0
                trace["foreign_processes"] = foreign_processes(processes, _cpu_by_process(), mine=mine, seconds=seconds)
        except BaseException as exc:  # surfaced by stop(); a dead sampler must not look like an idle machine
            self._error = exc
        finally:
            wall = time.perf_counter() - wall0
            cpu_s = time.thread_time() - cpu0
            trace["overhead"] = {
                "samples": len(trace["t"]),
                "sampler_cpu_s": round(cpu_s, 6),
                "wall_s": round(wall, 6),
                "cpu_s_per_s": round(cpu_s / wall, 6) if wall > 0 else None,
                "cpu_s_per_sample": round(cpu_s / len(trace["t"]), 6) if trace["t"] else None,
            }
            self._trace = trace
            self._ready.set()

    @staticmethod
    def _gpu_series(nv, index: int, handle) -> tuple[dict, object]:
        series = {
            "index": index,
            "name": nv.query("nvmlDeviceGetName", handle),
            "util_percent": [],
            "mem_util_percent": [],
            "memory_used_bytes": [],
            "sm_clock_mhz": [],
            "mem_clock_mhz": [],
            "power_w": [],
            "throttle_reasons": [],
            "temperature_c": [],
            "gpu_pids": [],
        }
        return series, handle

    @staticmethod
    def _gpu_sample(nv, handle, series: dict) -> None:
        m = nv.module
        util = nv.query("nvmlDeviceGetUtilizationRates", handle)
        mem = nv.query("nvmlDeviceGetMemoryInfo", handle)
        power = nv.query("nvmlDeviceGetPowerUsage", handle)
        series["util_percent"].append(None if util is None else util.gpu)
        series["mem_util_percent"].append(None if util is None else util.memory)
        series["memory_used_bytes"].append(None if mem is None else int(mem.used))
        series["sm_clock_mhz"].append(nv.query("nvmlDeviceGetClockInfo", handle, m.NVML_CLOCK_SM))
        series["mem_clock_mhz"].append(nv.query("nvmlDeviceGetClockInfo", handle, m.NVML_CLOCK_MEM))
        series["power_w"].append(None if power is None else power / 1e3)
        series["throttle_reasons"].append(nv.query("nvmlDeviceGetCurrentClocksThrottleReasons", handle))
        series["temperature_c"].append(nv.query("nvmlDeviceGetTemperature", handle, m.NVML_TEMPERATURE_GPU))
        running = nv.query("nvmlDeviceGetComputeRunningProcesses", handle)
        series["gpu_pids"].append(None if running is None else sorted(p.pid for p in running))


def _swapped() -> int | None:
    try:
        swap = psutil.swap_memory()
    except (OSError, RuntimeError):
        return None
    return int(swap.sin + swap.sout)


def _frequency() -> float | None:
    try:
        freq = psutil.cpu_freq()
    except (OSError, RuntimeError, NotImplementedError):
        return None
    return None if freq is None or not freq.current else round(float(freq.current), 1)


# --- the plot --------------------------------------------------------------------------------------


def _none_to_nan(values: list) -> list[float]:
    return [float("nan") if v is None else float(v) for v in values]


def plot_trace(trace: dict, path, *, intervals: list[tuple[str, float, float]]) -> Path:
    """Draw the trace on a time axis (seconds from its first sample) with `intervals` shaded.

    `intervals`: (label, t0, t1) in epoch seconds, e.g. each notebook cell or span. Writes a PNG at
    `path` (atomically) and returns it.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from perfkit.machine.fitness import cpu_list

    ts = trace["t"]
    starts = [t for _, t, _ in intervals]
    origin = min(ts[:1] + starts) if (ts or starts) else 0.0
    x = [t - origin for t in ts]
    gpus = trace.get("gpus", [])
    rows = 2 + (3 if gpus else 0)
    fig = Figure(figsize=(9, 1.6 * rows + 0.6), dpi=100)
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, 1, sharex=True, squeeze=False)[:, 0]

    ax = axes[0]
    ax.plot(x, _none_to_nan(trace["cpu_percent"]), label="process tree (100% = one core)", color="C0")
    pinned = trace.get("cpus")
    whose = f"CPUs {cpu_list(pinned)} (% of them)" if pinned else "whole machine (% of all cores)"
    ax.plot(x, _none_to_nan(trace["system_cpu_percent"]), label=whose, color="C7", lw=0.8)
    ax.set_ylabel("CPU %")
    ax.legend(loc="upper right", fontsize=7)
    ax = axes[1]
    ax.plot(x, [r / 2**20 for r in trace["rss_bytes"]], color="C1")
    ax.set_ylabel("RSS MiB")
    if gpus:
        for g in gpus:
            label = f"gpu {g['index']}"
            axes[2].plot(x, _none_to_nan(g["util_percent"]), label=label)
            axes[3].plot(x, [v / 2**30 for v in _none_to_nan(g["memory_used_bytes"])], label=label)
            axes[4].plot(x, _none_to_nan(g["power_w"]), label=label)
        axes[2].set_ylabel("GPU util %")
        axes[3].set_ylabel("GPU mem GiB")
        axes[4].set_ylabel("power W")
        axes[2].legend(loc="upper right", fontsize=7)

    span_total = max(x[-1:] + [t1 - origin for _, _, t1 in intervals] + [1e-9])
    for i, (label, t0, t1) in enumerate(intervals):
        for a in axes:
            a.axvspan(t0 - origin, t1 - origin, color=f"C{i % 10}", alpha=0.12, lw=0)
        if (t1 - t0) >= 0.04 * span_total:  # label only what is wide enough to read
            axes[0].text(
                (t0 + t1) / 2 - origin,
                1.02,
                label,
                transform=axes[0].get_xaxis_transform(),
                ha="center",
                va="bottom",
                fontsize=7,
                clip_on=False,
            )
    gpu_note = "" if gpus else f"  ({trace.get('gpu_note') or 'no GPU'})"
    ov = trace.get("overhead", {})
    cost = ov.get("cpu_s_per_s")
    fig.suptitle(
        f"utilization every {trace['interval_s']} s{gpu_note}"
        + ("" if cost is None else f"; sampler cost {cost * 100:.2f}% of a core"),
        fontsize=9,
    )
    axes[-1].set_xlabel("seconds")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    path = Path(path)
    write_atomic(path, buf.getvalue())
    return path
