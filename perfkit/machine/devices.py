"""What this machine's processors are called: the CPU model, and the NVIDIA GPUs through NVML.

A leaf of perfkit.machine: the snapshot, the bandwidth cache's fingerprint, the utilization
sampler and the GPU check all name the hardware through it, and it imports none of them.
A machine without a driver gets one line saying why (`nvml().note`), never a traceback.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
from pathlib import Path

from perfkit import environment

__all__ = ["cpu_model", "nvml", "gpu_names", "fingerprint_inputs", "fingerprint", "machine_id", "identity"]


def cpu_model() -> str:
    """The CPU's marketing name, as the OS reports it."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass  # not Linux: fall through to what the platform module knows
    return platform.processor() or platform.machine() or "unknown"


class nvml:  # noqa: N801 - a context manager used like a function
    """NVML initialised for the block: `with nvml() as nv: nv.handles` (empty without a driver).

    `nv.note` is None when NVML works, else one line such as "no NVIDIA driver: NVML Shared
    Library Not Found". `nv.module` is pynvml, for queries.
    """

    def __enter__(self):
        self.module = None
        self.handles = []
        self.note = None
        self._initialised = False
        try:
            import pynvml
        except ImportError as exc:
            self.note = f"no NVIDIA driver: nvidia-ml-py not importable ({exc})"
            return self
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            self.note = f"no NVIDIA driver: {exc}"
            return self
        self._initialised = True
        self.module = pynvml
        try:
            count = pynvml.nvmlDeviceGetCount()
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except pynvml.NVMLError as exc:
            self.note = f"NVML could not list devices: {exc}"
            self.handles = []
        if not self.handles and self.note is None:
            self.note = "NVIDIA driver present but no GPU visible"
        return self

    def query(self, fn_name: str, *args):
        """Call `pynvml.<fn_name>(*args)`; None when the GPU does not support the query."""
        try:
            value = getattr(self.module, fn_name)(*args)
        except self.module.NVMLError:
            return None
        return value.decode() if isinstance(value, bytes) else value

    def __exit__(self, *exc):
        if self._initialised:
            try:
                self.module.nvmlShutdown()
            except self.module.NVMLError:
                pass  # shutting down a half-broken driver must not hide the real result
        return False


def gpu_names() -> list[str]:
    """Names of the NVIDIA GPUs NVML sees (empty without a driver)."""
    with nvml() as nv:
        return [nv.query("nvmlDeviceGetName", h) for h in nv.handles]


def fingerprint_inputs() -> dict:
    """What identifies a machine: CPU model, cores, memory (GiB) and GPU names."""
    import psutil

    return {
        "cpu_model": cpu_model(),
        "logical_cores": psutil.cpu_count(logical=True),
        "memory_gib": round(psutil.virtual_memory().total / 2**30),
        "gpus": gpu_names(),
    }


def fingerprint(inputs: dict | None = None) -> str:
    """A short stable hash of `fingerprint_inputs`: the bandwidth cache and the execution cache key on it."""
    inputs = fingerprint_inputs() if inputs is None else inputs
    text = json.dumps(inputs, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


MACHINE_ID = "PERFKIT_MACHINE_ID"  # set: this machine's id (a simulated machine's, or one a container shares)


def machine_id() -> str:
    """This machine's id, stable across runs and reboots: $PERFKIT_MACHINE_ID, else a short hash of the
    OS's machine id (/etc/machine-id, systemd's and dbus's) with the host name (containers cloned from
    one image may share the file), else of the host name alone. A $PERFKIT_MACHINE_ID that is not an id
    (environment.identifier) is refused."""
    given = environment.identifier(MACHINE_ID)
    if given:
        return given
    seed = ""
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            seed = Path(path).read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError):
            continue
        if seed:
            break
    return hashlib.sha256(f"{seed}/{platform.node()}".encode()).hexdigest()[:12]


@functools.lru_cache(maxsize=1)
def _identity(given: str) -> dict:
    return {"id": machine_id(), "host": platform.node(), "cpu": cpu_model(), "gpus": gpu_names()}


def identity() -> dict:
    """The machine a replicate ran on, as an execution records it: its `id` (machine_id), `host`, `cpu`
    model and `gpus` (NVML's names; empty without a driver)."""
    return dict(_identity(os.environ.get(MACHINE_ID, "")))


def governor() -> str | None:
    """The CPU frequency governor ("performance", "powersave", ...), when the kernel exposes one."""
    from pathlib import Path

    found = set()
    for path in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cpufreq/scaling_governor"):
        try:
            found.add(path.read_text(encoding="utf-8").strip())
        except OSError:
            continue
    return "/".join(sorted(found)) or None


def describe(inputs: dict | None = None) -> str:
    """The machine in a few words, for a reader of the ledger: CPU, cores, memory, GPUs (and, measured
    now, the CPU frequency governor when there is one)."""
    live = inputs is None
    inputs = fingerprint_inputs() if inputs is None else inputs
    gpus = inputs.get("gpus") or []
    names = sorted(set(gpus))
    gpu_text = ", ".join(f"{gpus.count(n)}x {n}" for n in names) if gpus else "no GPU"
    held = governor() if live else None
    clock = f"; {held} governor" if held else ""
    return f"{inputs['cpu_model']}, {inputs['logical_cores']} cores, {inputs['memory_gib']} GiB; {gpu_text}{clock}"
