"""The `perfkit` Jupyter kernel: IPython with the project's root on the import path.

A probe imports the code under test (`import ownlib`) without that code being installed: this
kernel finds the project (PERFKIT_ROOT, else the nearest folder above the notebook's with
hypotheses/ and notebooks/), puts it first on `sys.path` and on PYTHONPATH for what the probe
starts, then runs the ordinary IPython kernel. `perfkit run` starts its probes in this kernel too,
naming the code's root in PERFKIT_CODE_ROOT (another checkout's, when `perfkit bisect` measures a
commit in a worktree), which wins over the folder the notebook is in.
Registered once per environment (`perfkit kernel`, or `perfkit init`), it serves every project.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

NAME = "perfkit"
OUTPUT_CAP_ENV = "PERFKIT_OUTPUT_CAP"  # characters of stdout and stderr the kernel forwards
CODE_ROOT_ENV = "PERFKIT_CODE_ROOT"  # set by `perfkit run`: where the code under test is (a bisect's worktree)


def project_root(start: Path) -> Path | None:
    """The nearest folder at or above `start` holding hypotheses/ and notebooks/."""
    for folder in (start, *start.parents):
        if (folder / "hypotheses").is_dir() and (folder / "notebooks").is_dir():
            return folder
    return None


def import_paths(root: Path) -> list[Path]:
    """What goes first on a probe's import path: the code's root, and its src/ folder in a src layout.

    Ahead of site-packages, so a probe imports the code measured, not an editable install of
    another checkout of it (a worktree `perfkit bisect` measures is such a second checkout)."""
    src = root / "src"
    return [root, src] if src.is_dir() and not (src / "__init__.py").exists() else [root]


def on_path(root: Path) -> None:
    """Put the code's root (and src/) first on this process's import path and on its children's PYTHONPATH."""
    texts = [str(p) for p in import_paths(root)]
    sys.path[:] = texts + [p for p in sys.path if p not in texts]
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in texts]
    os.environ["PYTHONPATH"] = os.pathsep.join([*texts, *parts])


def spec() -> dict:
    """The kernelspec: this interpreter, through this module, with no IPython history database."""
    argv = [
        sys.executable,
        "-m",
        "perfkit.experiment.kernel",
        "-f",
        "{connection_file}",
        "--HistoryManager.enabled=False",
    ]
    return {"argv": argv, "display_name": "perfkit", "language": "python", "metadata": {"debugger": True}}


def install(*, user: bool = False) -> str | None:
    """Register the kernel for JupyterLab (in this environment, or for the user); None if it already is."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    manager = KernelSpecManager()
    try:
        if manager.get_kernel_spec(NAME).argv[:3] == spec()["argv"][:3]:
            return None
    except NoSuchKernel:
        pass
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "kernel.json").write_text(json.dumps(spec(), indent=1) + "\n", encoding="utf-8")
        return manager.install_kernel_spec(tmp, NAME, user=user, prefix=None if user else sys.prefix)


def main(argv: list[str] | None = None) -> int:
    """`perfkit kernel [--user]`: register the kernel."""
    import argparse

    parser = argparse.ArgumentParser(prog="perfkit kernel", description="register the perfkit Jupyter kernel")
    parser.add_argument("--user", action="store_true", help="for this user (default: this environment)")
    args = parser.parse_args(argv)
    where = install(user=args.user)
    print(f"registered the perfkit kernel in {where}" if where else "the perfkit kernel is registered already")
    return 0


def cap_streams(cap: int) -> None:
    """Forward at most `cap` characters of this kernel's stdout and stderr, then one note: a probe that
    prints a gigabyte costs neither this kernel nor the run recording it more than the cap."""
    sent = [0]
    for stream in (sys.stdout, sys.stderr):
        write = stream.write

        def capped(text, write=write):
            room = cap - sent[0]
            if room > 0:
                sent[0] += min(len(text), room)
                write(text[:room])
                if len(text) > room:
                    write(f"\n[perfkit: this probe's output went past {cap:,} characters; the kernel cut the rest]\n")
            return len(text)

        stream.write = capped


def launch(argv: list[str] | None = None, *, warm: bool = False) -> None:
    """Run the kernel: the code's root first on the import path, then IPython's kernel with `argv`.

    `warm`: this process was forked from a template that imported matplotlib's inline backend before
    any IPython shell existed (perfkit/experiment/warm.py); it is hooked to this kernel's shell here,
    as its import would have done in a fresh kernel."""
    root = os.environ.get(CODE_ROOT_ENV) or os.environ.get("PERFKIT_ROOT")
    found = Path(root) if root else project_root(Path.cwd().resolve())
    if found is not None:
        on_path(found)
    from ipykernel import kernelapp

    app = kernelapp.IPKernelApp.instance()
    app.initialize(argv)
    inline = sys.modules.get("matplotlib_inline.backend_inline")
    if warm and inline is not None:
        inline._enable_matplotlib_integration()
    cap = os.environ.get(OUTPUT_CAP_ENV, "")
    if cap.isdigit():  # set by `perfkit run` for its probes; a kernel in JupyterLab prints everything
        cap_streams(int(cap))
    app.start()


if __name__ == "__main__":
    launch()
