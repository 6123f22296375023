"""`perfkit run --profile`: a probe execution under torch.profiler or Nsight Systems.

`torch` runs a copy of the probe with tagged cells that start and stop torch.profiler around it
(a trace per execution); `nsys` runs the probe's kernel itself under `nsys profile` (a report per
execution). A profiled measurement is marked as such and never stands for an unprofiled one.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from perfkit.errors import UserError
from perfkit.files import write_atomic

PROFILERS = ("torch", "nsys")
INJECTED_TAG = "perfkit-injected"  # cells perfkit added to a probe's copy


def nsys() -> str | None:
    """Nsight Systems' command-line tool, when it is on PATH."""
    return shutil.which("nsys")


def nsys_prefix(report: Path) -> list[str]:
    """The command that runs a kernel under Nsight Systems, writing `report`.nsys-rep."""
    return [
        nsys() or "nsys",
        "profile",
        "--trace=cuda,nvtx,osrt",
        "--sample=none",
        "--force-overwrite=true",
        f"--output={report}",
    ]


def check(profile: str | None) -> None:
    """A profiler perfkit knows and that this machine has, before anything runs."""
    if profile is not None and profile not in PROFILERS:
        raise UserError(f"--profile: expected one of {', '.join(PROFILERS)}, got {profile!r}")
    if profile == "nsys" and nsys() is None:
        raise UserError(
            "--profile nsys: Nsight Systems' `nsys` is not on PATH; install NVIDIA Nsight Systems "
            "(or use --profile torch, which needs nothing more)"
        )


def profiled_notebook(source: Path, target: Path, trace_path: str) -> Path:
    """A copy of the probe with cells that start and stop torch.profiler around it (tagged)."""
    import nbformat

    nb = nbformat.read(str(source), as_version=4)
    index = next(i for i, c in enumerate(nb.cells) if "parameters" in c.get("metadata", {}).get("tags", []))
    start = nbformat.v4.new_code_cell(f"import perfkit.probe.profiler\nperfkit.probe.profiler.start({trace_path!r})")
    stop = nbformat.v4.new_code_cell("perfkit.probe.profiler.stop()")
    for cell in (start, stop):
        cell.metadata["tags"] = [INJECTED_TAG]
    nb.cells.insert(index + 1, start)
    nb.cells.append(stop)
    write_atomic(target, nbformat.writes(nb))
    return target


@dataclass(frozen=True)
class Profiled:
    """What a profiler changes about one execution: the notebook run, the kernel's command, the environment."""

    notebook: Path
    kernel_prefix: list[str] | None = None
    env: dict[str, str] | None = None


def prepare(profile: str | None, notebook: Path, exec_dir: Path) -> Profiled:
    """How to run `notebook` under `profile` (None: as it is), its traces going to exec_dir."""
    if profile == "torch":
        trace = exec_dir / "torch_trace.json.gz"
        copy = profiled_notebook(notebook, exec_dir / "input.ipynb", str(trace))
        return Profiled(notebook=copy, env={"PERFKIT_TORCH_PROFILE": str(trace)})
    if profile == "nsys":
        return Profiled(notebook=notebook, kernel_prefix=nsys_prefix(exec_dir / "nsys"))
    return Profiled(notebook=notebook)
