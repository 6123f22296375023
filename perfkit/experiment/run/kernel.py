"""The `perfkit` Jupyter kernel: IPython with the project's root on the import path.

A probe imports the code under test (`import ownlib`) without that code being installed: this
kernel finds the project (PERFKIT_ROOT, else the nearest folder above the notebook's with
hypotheses/ and notebooks/), puts it first on `sys.path` and on PYTHONPATH for what the probe
starts, then runs the ordinary IPython kernel. `perfkit run` starts its probes in this kernel too,
naming the code's root in PERFKIT_CODE_ROOT (another checkout's, when `perfkit bisect` measures a
commit in a worktree), which wins over the folder the notebook is in.
Registered once per environment (`perfkit kernel`, or `perfkit init`), it serves every project.
A warm replicate's kernel (perfkit/experiment/run/warm.py) is the same kernel, forked rather than started:
`fork_prekernel` and `WarmProvisioner` below.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from perfkit import environment

NAME = "perfkit"
PROVISIONER = "perfkit-warm"  # a warm replicate's kernelspec names it; so does perfkit's entry point
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
        "perfkit.experiment.run.kernel",
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


def launch_kernel(argv: list[str] | None = None, *, warm: bool = False) -> None:
    """Run the kernel: the code's root first on the import path, then IPython's kernel with `argv`.

    `warm`: this process was forked from a template that imported matplotlib's inline backend before
    any IPython shell existed (perfkit/experiment/run/warm.py); it is hooked to this kernel's shell here,
    as its import would have done in a fresh kernel."""
    root = environment.folder(CODE_ROOT_ENV, strict=False) or environment.folder("PERFKIT_ROOT", strict=False)
    found = root if root is not None else project_root(Path.cwd().resolve())
    if found is not None:
        on_path(found)
    from ipykernel import kernelapp

    app = kernelapp.IPKernelApp.instance()
    if warm:  # the traits ipykernel reads from the environment when imported were read in the template
        app.parent_handle = int(os.environ.get("JPY_PARENT_PID") or 0)  # its poller: gone with the executor
    app.initialize(argv)
    inline = sys.modules.get("matplotlib_inline.backend_inline")
    if warm and inline is not None:
        inline._enable_matplotlib_integration()
    cap = environment.count_or_none(OUTPUT_CAP_ENV)
    if cap is not None:  # set by `perfkit run` for its probes; a kernel in JupyterLab prints everything
        cap_streams(cap)
    app.start()


# ---------------------------------------------------------------- a warm replicate's kernel (warm.py)


def reseed() -> None:
    """Fresh entropy for what a fresh process seeds at import (numpy's global state; `random` does it itself)."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(int.from_bytes(os.urandom(4), "little"))


_prekernel: dict[str, int] = {}  # in a warm executor: the kernel-to-be's pid and the pipes to it


def fork_prekernel() -> None:
    """In a warm executor, before any thread or event loop: fork the process that will be its kernel.

    It waits on a pipe for the launch (argv, environment, folder) `WarmProvisioner` sends, then runs
    the perfkit kernel; the executor's end of the pipe closing first means no kernel was wanted."""
    launch_read, launch_write = os.pipe()  # the executor sends the launch
    ack_read, ack_write = os.pipe()  # the kernel-to-be answers once it is in a session of its own
    pid = os.fork()
    if pid:
        os.close(launch_read)
        os.close(ack_write)
        _prekernel.update(pid=pid, send=launch_write, ack=ack_read)
        return
    os.close(launch_write)
    os.close(ack_read)
    code = 0
    try:
        with os.fdopen(launch_read, "rb") as pipe:
            data = pipe.read()
        if not data:
            os._exit(0)
        launch = json.loads(data)
        os.setsid()  # as jupyter_client starts a kernel: a session of its own, so a signal to it is to it alone
        os.write(ack_write, b"1")
        os.close(ack_write)
        os.chdir(launch["cwd"])
        os.environ.clear()
        os.environ.update(launch["env"])
        reseed()
        sys.argv = list(launch["argv"][2:])
        launch_kernel(launch["argv"][3:], warm=True)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0
    except BaseException:  # noqa: BLE001 - the kernel's own failure goes to the executor's log
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class _Child:
    """The kernel-to-be as a Popen-like object for jupyter_client's LocalProvisioner (our own child)."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None
        self.stdin = self.stdout = self.stderr = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = -9  # reaped elsewhere (the executor kills what is left at its end)
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(0.02)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


@functools.cache
def _provisioner_class():
    from jupyter_client.provisioning.local_provisioner import LocalProvisioner

    class WarmProvisioner(LocalProvisioner):
        """Launches the kernel as the warm executor's kernel-to-be; anywhere else, as LocalProvisioner does."""

        async def launch_kernel(self, cmd: list[str], **kwargs: Any):
            if "pid" not in _prekernel:  # not a warm executor, or its kernel-to-be was used: a fresh kernel
                return await super().launch_kernel(cmd, **kwargs)
            pid, send, ack = _prekernel.pop("pid"), _prekernel.pop("send"), _prekernel.pop("ack")
            env = dict(kwargs.get("env") or os.environ)
            env["JPY_PARENT_PID"] = str(os.getpid())  # as jupyter_client's launcher says who the parent is
            launch = {"argv": list(cmd), "env": env, "cwd": str(kwargs.get("cwd") or os.getcwd())}
            os.write(send, json.dumps(launch).encode())
            os.close(send)
            os.read(ack, 1)  # its own session now: a signal to its group reaches it alone
            os.close(ack)
            self.process = _Child(pid)
            self.pid = self.pgid = pid
            self.cwd = launch["cwd"]
            return self.connection_info

    return WarmProvisioner


def register_provisioner() -> None:
    """Make `perfkit-warm` known to jupyter_client in this process (the entry point may not be installed:
    a checkout run without `pip install`)."""
    from importlib.metadata import EntryPoint

    from jupyter_client.provisioning.factory import KernelProvisionerFactory

    factory = KernelProvisionerFactory.instance()
    factory.provisioners[PROVISIONER] = EntryPoint(
        name=PROVISIONER,
        value="perfkit.experiment.run.kernel:WarmProvisioner",
        group=KernelProvisionerFactory.GROUP_NAME,
    )


def __getattr__(name: str):
    if name == "WarmProvisioner":  # built on first use: importing this module stays free of jupyter_client
        return _provisioner_class()
    raise AttributeError(name)


if __name__ == "__main__":
    launch_kernel()
