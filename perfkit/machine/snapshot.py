"""The machine a measurement ran on: an environment snapshot and `perfkit env`.

A measured cost means little without the hardware, software and commit it came from, so every run
stores this snapshot in its manifest. NVIDIA GPUs are read through NVML (perfkit.machine.devices);
a machine without a driver gets one line saying why, never a traceback. Peak DRAM bandwidth is
derived from NVML's maximum memory clock and bus width (double data rate), e.g. H100 SXM:
2619 MHz x 2 x 5120 bit / 8 = 3.35 TB/s.

Format history (`format_version`): 1: first format (the key was `format`); 2: `format_version`.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import platform
import socket
import sys
from pathlib import Path

import psutil

import perfkit
from perfkit.errors import UserError
from perfkit.files import VERSION_KEY
from perfkit.machine import devices, fitness
from perfkit.machine.devices import cpu_model, nvml
from perfkit.paths import PACKAGE_HOME, git_state

__all__ = ["snapshot", "main", "peak_dram_bytes_per_s", "format_snapshot", "FORMAT_VERSION"]

FORMAT_VERSION = 2
_PERFKIT_CHECKOUT = PACKAGE_HOME


# --- CPU and memory --------------------------------------------------------------------------------


def _cpu() -> dict:
    freq = None
    try:
        freq = psutil.cpu_freq()
    except (OSError, NotImplementedError, FileNotFoundError):
        freq = None  # some VMs expose no frequency at all
    return {
        "model": cpu_model(),
        "physical_cores": psutil.cpu_count(logical=False),
        "logical_cores": psutil.cpu_count(logical=True),
        "freq_mhz": {
            "current": round(freq.current, 1) if freq and freq.current else None,
            "max": round(freq.max, 1) if freq and freq.max else None,
        },
        "governor": devices.governor(),  # as pyperf records it: "performance" holds the clock, others may not
        "affinity": fitness.cpu_list(fitness.cpus()),  # the CPUs the run may use (taskset, a container)
    }


def _memory() -> dict:
    vm = psutil.virtual_memory()
    return {"total_bytes": int(vm.total), "available_bytes": int(vm.available)}


# --- software --------------------------------------------------------------------------------------


def _git(root: Path) -> dict:
    """Commit and dirty state of the checkout holding `root`, or a note saying there is none."""
    commit, dirty = git_state(root)
    if commit is None:
        return {"commit": None, "dirty": None, "note": f"not a git checkout, or no git: {root}"}
    return {"commit": commit, "dirty": dirty}


def _torch_from_metadata(gpus: list) -> dict:
    """torch's version and CUDA build from its installed files, without the 2-3 s of importing it: what a
    run records when nothing it does needs torch in its own process (its probes import it themselves)."""
    import importlib.util
    import re
    from importlib import metadata

    try:
        version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return {"version": None, "note": "torch not installed"}
    spec = importlib.util.find_spec("torch")
    cuda = None
    if spec is not None and spec.submodule_search_locations:
        found = Path(next(iter(spec.submodule_search_locations))) / "version.py"
        text = found.read_text(encoding="utf-8") if found.is_file() else ""
        match = re.search(r"^cuda(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
        cuda = match.group(1) if match else None
    return {
        "version": version,
        "cuda": cuda,
        "cudnn": None,
        "cuda_available": bool(cuda and gpus),
        "threads": None,
        "note": "read from its installed files, not imported",
    }


def _torch(*, imported: bool = True, gpus: list | None = None) -> dict:
    if not imported and "torch" not in sys.modules:
        return _torch_from_metadata(gpus or [])
    try:
        import torch
    except ImportError as exc:
        return {"version": None, "note": f"torch not importable: {exc}"}
    info = {
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": None,
        "cuda_available": bool(torch.cuda.is_available()),
        "threads": torch.get_num_threads(),
    }
    if info["cuda_available"]:
        info["cudnn"] = torch.backends.cudnn.version()
        info["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


# --- NVIDIA GPUs through NVML ----------------------------------------------------------------------


def peak_dram_bytes_per_s(max_mem_clock_mhz: float | None, bus_width_bits: int | None) -> float | None:
    """Theoretical DRAM bandwidth from NVML's max memory clock and bus width (two transfers/clock)."""
    if not max_mem_clock_mhz or not bus_width_bits:
        return None
    return max_mem_clock_mhz * 1e6 * 2 * bus_width_bits / 8


def _gpu(nv: nvml, index: int, handle) -> dict:
    m = nv.module
    q = nv.query
    mem = q("nvmlDeviceGetMemoryInfo", handle)
    sm_max = q("nvmlDeviceGetMaxClockInfo", handle, m.NVML_CLOCK_SM)
    mem_max = q("nvmlDeviceGetMaxClockInfo", handle, m.NVML_CLOCK_MEM)
    bus = q("nvmlDeviceGetMemoryBusWidth", handle)
    power = q("nvmlDeviceGetPowerUsage", handle)
    limit = q("nvmlDeviceGetEnforcedPowerLimit", handle)
    return {
        "index": index,
        "name": q("nvmlDeviceGetName", handle),
        "memory_total_bytes": int(mem.total) if mem is not None else None,
        "memory_used_bytes": int(mem.used) if mem is not None else None,
        "sm_clock_mhz": {"current": q("nvmlDeviceGetClockInfo", handle, m.NVML_CLOCK_SM), "max": sm_max},
        "mem_clock_mhz": {"current": q("nvmlDeviceGetClockInfo", handle, m.NVML_CLOCK_MEM), "max": mem_max},
        "memory_bus_width_bits": bus,
        "peak_dram_bytes_per_s": peak_dram_bytes_per_s(mem_max, bus),
        "power_w": power / 1e3 if power is not None else None,
        "power_limit_w": limit / 1e3 if limit is not None else None,
        "temperature_c": q("nvmlDeviceGetTemperature", handle, m.NVML_TEMPERATURE_GPU),
        "pcie": {
            "gen": q("nvmlDeviceGetCurrPcieLinkGeneration", handle),
            "width": q("nvmlDeviceGetCurrPcieLinkWidth", handle),
            "max_gen": q("nvmlDeviceGetMaxPcieLinkGeneration", handle),
            "max_width": q("nvmlDeviceGetMaxPcieLinkWidth", handle),
        },
    }


def _nvidia() -> dict:
    with nvml() as nv:
        if nv.module is None:
            return {"driver": None, "gpus": [], "gpu_note": nv.note}
        return {
            "driver": nv.query("nvmlSystemGetDriverVersion"),
            "gpus": [_gpu(nv, i, h) for i, h in enumerate(nv.handles)],
            "gpu_note": nv.note,
        }


# --- the snapshot ----------------------------------------------------------------------------------


def snapshot(
    *, bandwidth: bool = True, refresh: bool = False, root: Path | None = None, import_torch: bool = True
) -> dict:
    """Everything about this machine a result depends on, as a JSON-able dict.

    `bandwidth`: include the measured memory bandwidth (cached per machine; measured once, a few
    seconds, when there is no cache or `refresh`). `root`: the checkout whose git state is
    recorded (default: perfkit's own source checkout).
    """
    nvidia = _nvidia()
    snap = {
        VERSION_KEY: FORMAT_VERSION,
        "taken_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
        "os": {"system": platform.system(), "release": platform.release(), "platform": platform.platform()},
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
            "executable": sys.executable,
        },
        "perfkit": {"version": perfkit.__version__, "git": _git(root or _PERFKIT_CHECKOUT)},
        "torch": _torch(imported=import_torch, gpus=nvidia["gpus"]),
        "cpu": _cpu(),
        "memory": _memory(),
        "nvidia_driver": nvidia["driver"],
        "gpus": nvidia["gpus"],
        "gpu_note": nvidia["gpu_note"],
    }
    if bandwidth:
        from perfkit.machine import bandwidth as bw

        try:
            snap["bandwidth"] = bw.measured(refresh=refresh).to_dict()
        except ModuleNotFoundError as exc:  # a plain `pip install perfkit`: torch, which measures them, is the user's
            if exc.name != "torch":
                raise
            snap["bandwidth_note"] = "not measured: the rates are measured with torch (pip install 'perfkit[engine]')"
    return snap


# --- `perfkit env` ---------------------------------------------------------------------------------


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.1f} GiB"


def _or(value, unit: str = "") -> str:
    return "?" if value is None else f"{value}{unit}"


def format_snapshot(snap: dict) -> str:
    """The snapshot as the aligned text `perfkit env` prints."""
    lines = []

    def row(key: str, text: str) -> None:
        lines.append(f"{key:<10} {text}")

    git = snap["perfkit"]["git"]
    if git.get("commit"):
        where = f"git {git['commit'][:12]}{', dirty' if git['dirty'] else ''}"
    else:
        where = git.get("note", "no git")
    row("perfkit", f"{snap['perfkit']['version']} ({where})")
    py = snap["python"]
    row("python", f"{py['version']} ({py['implementation']}) {py['executable']}")
    row("os", snap["os"]["platform"])
    t = snap["torch"]
    if t.get("version"):
        cuda = f"CUDA {t['cuda']}" if t.get("cuda") else "no CUDA build"
        if t.get("cudnn"):
            cuda += f", cuDNN {t['cudnn']}"
        if t.get("cuda") and not t.get("cuda_available"):
            cuda += ", no device"
        threads = f"{t['threads']} threads" if t.get("threads") else "threads not read: torch not imported"
        row("torch", f"{t['version']} ({cuda}; {threads})")
    else:
        row("torch", t.get("note", "absent"))
    c = snap["cpu"]
    f = c["freq_mhz"]
    freq = f"{f['current'] / 1e3:.2f} GHz" if f["current"] else "freq ?"
    if f["max"]:
        freq += f" (max {f['max'] / 1e3:.2f} GHz)"
    pinned = f", this process on CPUs {c['affinity']}" if c.get("affinity") else ""
    held = f", {c['governor']} governor" if c.get("governor") else ", no frequency governor exposed"
    row("cpu", f"{c['model']}, {c['physical_cores']} cores / {c['logical_cores']} threads, {freq}{held}{pinned}")
    m = snap["memory"]
    row("memory", f"{_gib(m['total_bytes'])} total, {_gib(m['available_bytes'])} available")
    if not snap["gpus"]:
        row("gpu", snap["gpu_note"] or "none")
    for g in snap["gpus"]:
        peak = g["peak_dram_bytes_per_s"]
        pcie = g["pcie"]
        row(
            f"gpu {g['index']}",
            f"{g['name']} (driver {_or(snap['nvidia_driver'])}), memory {_gib(g['memory_used_bytes'])} used"
            f" / {_gib(g['memory_total_bytes'])}",
        )
        row(
            "",
            f"SM {_or(g['sm_clock_mhz']['current'])}/{_or(g['sm_clock_mhz']['max'])} MHz, memory "
            f"{_or(g['mem_clock_mhz']['current'])}/{_or(g['mem_clock_mhz']['max'])} MHz x "
            f"{_or(g['memory_bus_width_bits'])} bit = peak " + ("?" if peak is None else f"{peak / 1e12:.2f} TB/s"),
        )
        row(
            "",
            f"power {_or(g['power_w'])} W of {_or(g['power_limit_w'])} W, {_or(g['temperature_c'])} C, PCIe gen "
            f"{_or(pcie['gen'])} x{_or(pcie['width'])} (max gen {_or(pcie['max_gen'])} x{_or(pcie['max_width'])})",
        )
    if "bandwidth" in snap:
        from perfkit.machine import bandwidth as bw

        for i, text in enumerate(bw.describe(snap["bandwidth"])):
            row("bandwidth" if i == 0 else "", text)
    elif "bandwidth_note" in snap:
        row("bandwidth", snap["bandwidth_note"])
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """`perfkit env [--json] [--refresh] [--no-bandwidth]`: print this machine's snapshot."""
    parser = argparse.ArgumentParser(prog="perfkit env", description="Show the environment snapshot.")
    parser.add_argument("--json", action="store_true", help="print the snapshot as JSON")
    parser.add_argument("--refresh", action="store_true", help="remeasure the memory bandwidth")
    parser.add_argument("--no-bandwidth", action="store_true", help="skip the bandwidth figure")
    args = parser.parse_args(argv)
    if args.refresh and args.no_bandwidth:
        raise UserError("--refresh remeasures the bandwidth; it cannot go with --no-bandwidth")
    snap = snapshot(bandwidth=not args.no_bandwidth, refresh=args.refresh)
    if args.json:
        print(json.dumps(snap, indent=2, sort_keys=True))
    else:
        print(format_snapshot(snap))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
