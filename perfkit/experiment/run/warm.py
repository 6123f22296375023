"""Warm replicates: a template process per round forks each replicate's executor and kernel.

A fresh replicate pays, before its first measuring cell, for two interpreters: the papermill
executor (Python, papermill, nbclient: about 1.5 s) and the kernel (IPython, then the probe's own
imports: torch alone is 2-3 s). A run of 12 executions x 3 replicates paid that 36 times.

Here each round of a run (replicate r of every execution, schedule.py) starts one *template*: a
fresh interpreter, started with the round's thread variables and the code under test first on its
import path, that imports papermill, ipykernel and the third-party modules the round's probes
import (torch, numpy, matplotlib; never the code under test), then waits. Each replicate of the
round is a `fork` of it: the executor, in a session of its own, pinned to its CPUs, and at the
executor's start a second fork, the kernel-to-be, which becomes the probe's IPython kernel when
papermill asks for one (through `kernel.WarmProvisioner`, a Jupyter kernel provisioner: papermill
and the notebooks stay as they are). The kernel is the executor's child, so the process tree the
utilization trace watches, and kills on a timeout, is the same as a fresh replicate's.

What stays independent, and why it holds:
- each replicate is its own process: its allocator state, page faults and thread pools are its own
  from the fork on; the template never runs a parallel torch operation (its pool is made in each
  replicate) and refuses to fork with a second Python thread or CUDA initialized;
- the hash seed and address layout come from the template, and every round has its own, so the
  replicates of one execution (one per round) never share them; executions of one round do;
- numpy's global random state, seeded at import, is seeded again in each replicate (Python's
  `random` does so itself after a fork).
`perfkit run --fresh-processes` starts both interpreters anew for every replicate, as before.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfkit.experiment.run import kernel
from perfkit.processes import alive

#: what every replicate imports before its first cell, whatever the probe: the executor's and the kernel's
BASE = ("papermill", "nbclient", "nbformat", "jupyter_client", "ipykernel.kernelapp", "IPython")
#: imported with these when the probe imports them: the part the probe's first cell would pay for
DEPENDS = {"matplotlib.pyplot": ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg")}
START_TIMEOUT_S = 120.0
INLINE = "module://matplotlib_inline.backend_inline"  # the backend ipykernel gives a kernel's figures
FOLDER_PREFIX = "perfkit-warm-"  # a template's socket folder under the temporary directory


# ---------------------------------------------------------------- what to import


def probe_imports(source: bytes) -> list[str]:
    """The modules a notebook's code cells import at top level, in order (`import a.b`, `from a import b`)."""
    try:
        nb = json.loads(source)
    except ValueError:
        return []
    found: list[str] = []
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        text = cell.get("source", "")
        text = "".join(text) if isinstance(text, list) else text
        try:
            tree = ast.parse("\n".join(line for line in text.splitlines() if not line.lstrip().startswith(("%", "!"))))
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.Import):
                found += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.append(node.module)
    return list(dict.fromkeys(found))


def preloads(sources: list[bytes]) -> list[str]:
    """What a template imports for probes of these sources: the base, then each probe's imports (with
    the modules they stand for); those that are the code under test are left out by the template."""
    wanted: list[str] = list(BASE)
    for source in sources:
        for name in probe_imports(source):
            wanted += [*DEPENDS.get(name, ()), name]
    return list(dict.fromkeys(wanted))


def _outside(name: str, root: Path | None) -> bool:
    """True when module `name` would be imported from outside the code under test (`root`).

    Only a module's spec is looked up (its parent packages are imported, as any lookup does)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError, AttributeError):
        return False
    if spec is None:
        return False
    if root is None or spec.origin in (None, "built-in", "frozen"):
        return True
    origin = Path(spec.origin).resolve()
    return not _under(origin, root) or any(_under(origin, Path(p)) for p in _installed_paths())


def _under(path: Path, folder: Path) -> bool:
    try:
        path.relative_to(folder.resolve())
    except ValueError:
        return False
    return True


def _installed_paths() -> set[str]:
    """Where installed packages live (a virtual environment inside the project is not the code under test)."""
    import sysconfig

    paths = sysconfig.get_paths()
    return {paths["purelib"], paths["platlib"], paths["stdlib"], paths["platstdlib"]}


# ---------------------------------------------------------------- the template (its own process)


def _ready_to_fork() -> str | None:
    """Why this process must not fork replicates, or None: a second Python thread, or CUDA started."""
    import threading

    if threading.active_count() > 1:
        names = ", ".join(t.name for t in threading.enumerate() if t is not threading.current_thread())
        return f"an import started a thread ({names})"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "an import initialized CUDA, which a forked process cannot use"
    return None


def _preload(names: list[str], root: Path | None) -> tuple[list[str], list[str]]:
    """Import each module of `names` that is not the code under test; (imported, skipped with why)."""
    import importlib

    done, skipped = [], []
    for name in names:
        if name in sys.modules:
            done.append(name)
            continue
        if not _outside(name, root):
            skipped.append(f"{name} (the code under test, or not found)")
            continue
        try:
            importlib.import_module(name)
            done.append(name)
        except BaseException as exc:  # noqa: BLE001 - a probe's import that fails here fails there too, and says so
            skipped.append(f"{name} ({type(exc).__name__})")
    return done, skipped


def _fork_executor(
    request: dict, listener: socket.socket, conns: list[socket.socket], wake: tuple[int, int], child
) -> int:
    """Fork one replicate's executor, `child(spec)` in the new process; in the child this never returns."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        os.setsid()
        for s in (listener, *conns):
            s.close()
        signal.set_wakeup_fd(-1)  # the template's wake-up pipe and its SIGCHLD handler are not the executor's
        for fd in wake:
            os.close(fd)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDONLY)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.environ.clear()
        os.environ.update(request["env"])
        kernel.reseed()
        sys.argv = [sys.argv[0], request["spec"]]
        code = child(request["spec"])
    except BaseException:  # noqa: BLE001 - the executor's own failure: printed to its log, exit 1
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve(socket_path: str, preload: list[str], root: str | None, child) -> int:
    """The template's life: import, say ready on stdout, fork an executor (`child(spec)`: execute.py's) per
    request until told to stop (`python -m perfkit.experiment.run.execute --template`).

    Each request is one line of JSON on a Unix socket ({"spec", "log", "env", "cpus"}); the answer is one line
    {"pid": N}, then, when that executor has ended, one line {"status": N} (its wait status)."""
    started = time.monotonic()
    parent = os.getppid()  # the run, read before ready is said: a run gone after that must not be missed
    sys.modules.setdefault("rfc3987_syntax", None)  # 1.6 s of grammar for a format papermill never checks
    if root:
        kernel.on_path(Path(root))
    os.environ.setdefault("MPLBACKEND", INLINE)  # as ipykernel sets it: pyplot, when imported, picks the kernel's
    done, skipped = _preload(preload, Path(root) if root else None)
    refused = _ready_to_fork()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(64)
    ready = {"pid": os.getpid(), "imported": done, "skipped": skipped, "seconds": round(time.monotonic() - started, 3)}
    print(json.dumps({**ready, "refused": refused}), flush=True)
    if refused:
        return 3
    stop = []
    # an executor that ended (SIGCHLD) or the runner's stop (SIGTERM) wakes the loop at once through this pipe:
    # a replicate's end is told to its runner, and a round's template closed, without waiting for a tick
    wake = os.pipe()
    for fd in wake:
        os.set_blocking(fd, False)
    signal.set_wakeup_fd(wake[1])
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    signal.signal(signal.SIGCHLD, lambda *_: None)
    conns: list[socket.socket] = []
    children: dict[int, socket.socket] = {}
    while not stop and os.getppid() == parent:  # the tick only notices a runner that died
        readable, _, _ = select.select([listener, wake[0], *conns], [], [], 0.1)
        for s in readable:
            if s == wake[0]:
                _drain(wake[0])
                continue
            if s is listener:
                conn, _ = listener.accept()
                conns.append(conn)
                continue
            line = _read_line(s)
            conns.remove(s)
            if not line:
                s.close()
                continue
            request = json.loads(line)
            if request.get("cpus"):  # the fork's own cost lands on the CPUs of the slot that asked, not a sibling's
                os.sched_setaffinity(0, request["cpus"])
            pid = _fork_executor(request, listener, conns, wake, child)
            children[pid] = s
            s.sendall((json.dumps({"pid": pid}) + "\n").encode())
        _reap(children)
    _kill_trees(list(children))  # told to stop, or the run is gone: nothing it forked outlives it
    listener.close()
    folder = Path(socket_path).parent
    with contextlib.suppress(OSError):  # a run killed with SIGKILL closes nothing: its template leaves no litter
        Path(socket_path).unlink()
        if folder.name.startswith(FOLDER_PREFIX):
            folder.rmdir()
    return 0


def _kill_trees(pids: list[int]) -> None:
    """Kill each executor and everything below it (its kernel runs in a session of its own)."""
    import psutil

    victims = []
    for pid in pids:
        try:
            root = psutil.Process(pid)
            victims += [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
    kill(victims)


def kill(victims: list) -> None:
    """SIGKILL each psutil process (those already gone are skipped) and wait for them to go."""
    import psutil

    for victim in victims:
        try:
            victim.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(victims, timeout=10)


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


def _read_line(s: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    return data.strip()


def _reap(children: dict[int, socket.socket]) -> None:
    """Tell each executor's requester how it ended, as it ends."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            try:
                conn.sendall((json.dumps({"status": status}) + "\n").encode())
            except OSError:
                pass
            conn.close()


# ---------------------------------------------------------------- the runner's side


@dataclass(eq=False)  # hashed by identity: a run keeps its executions in flight in a set
class Forked:
    """An executor a template forked: what `execute` needs of a subprocess.Popen (pid, wait, returncode).

    Its exit status comes over the template's socket. When the template dies first (killed, crashed), the
    executor lives on, adopted by another parent, as long as the run does (execute.py's `_exit_with_parent`):
    `wait` then waits for the pid to end and returns ORPHANED, and its outcome file says how it ended."""

    pid: int
    conn: socket.socket | None
    returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is not None:
            return self.returncode
        deadline = None if timeout is None else time.monotonic() + timeout
        if self.conn is not None:
            self.conn.settimeout(timeout)
            try:
                line = _read_line(self.conn)
            except TimeoutError:
                raise subprocess.TimeoutExpired(f"warm replicate {self.pid}", timeout) from None
            finally:
                self.conn.settimeout(None)
            self.conn.close()
            self.conn = None
            if line:
                self.returncode = os.waitstatus_to_exitcode(json.loads(line)["status"])
                return self.returncode
        while alive(self.pid):  # no word: the template itself died, and the executor was adopted
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"warm replicate {self.pid}", timeout)
            time.sleep(ORPHAN_POLL_S)
        self.returncode = ORPHANED
        return self.returncode

    def poll(self) -> int | None:
        try:
            return self.wait(timeout=0)
        except subprocess.TimeoutExpired:
            return None


ORPHANED = -1  # an executor whose template died before it: its exit status went to whoever adopted it
ORPHAN_POLL_S = 0.1


def sweep(temp: Path) -> list[Path]:
    """Remove the socket folders of templates that are gone (a run and its template killed with SIGKILL
    close nothing): a folder whose socket no process listens on. Returns those removed."""
    removed = []
    for folder in temp.glob(f"{FOLDER_PREFIX}*"):
        sock = folder / "template.sock"
        if not sock.is_socket():
            continue  # being made now (its template binds it after it imported), or not a template's
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(sock))
        except ConnectionRefusedError:  # nothing listens: its template is gone
            with contextlib.suppress(OSError):
                sock.unlink()
                folder.rmdir()
                removed.append(folder)
        except OSError:
            pass
        finally:
            probe.close()
    return removed


class TemplateFailed(RuntimeError):
    """A template did not start, or refused to fork: its round's replicates start fresh instead."""


class Template:
    """One round's template process (see the module's docstring): start, fork per replicate, close."""

    def __init__(self, *, env: dict[str, str], preload: list[str], root: Path | None):
        import tempfile

        sweep(Path(tempfile.gettempdir()))
        self.folder = Path(tempfile.mkdtemp(prefix=FOLDER_PREFIX))  # short: a socket's path has ~100 bytes
        self.socket_path = str(self.folder / "template.sock")
        argv = [
            sys.executable,
            "-m",
            "perfkit.experiment.run.execute",
            "--template",
            self.socket_path,
            json.dumps(preload),
        ]
        argv.append(str(root or ""))
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, start_new_session=True, text=True
        )
        self.ready = self._wait_ready()

    def _wait_ready(self) -> dict[str, Any]:
        readable, _, _ = select.select([self.proc.stdout], [], [], START_TIMEOUT_S)
        line = self.proc.stdout.readline() if readable else ""
        if not line:
            self.close()
            raise TemplateFailed(f"the template did not start within {START_TIMEOUT_S:g} s")
        ready = json.loads(line)
        if ready.get("refused"):
            self.close()
            raise TemplateFailed(f"the template cannot fork replicates: {ready['refused']}")
        return ready

    def fork(self, spec: Path, log: Path, env: dict[str, str], cpus: tuple[int, ...] | None = None) -> Forked:
        """A new executor for the job whose spec is at `spec`, writing to `log`, with environment `env`,
        forked on `cpus` (its slot's: it pins itself there before its kernel starts)."""
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(self.socket_path)
        except OSError as exc:  # killed, or its socket gone: it forks nothing more
            conn.close()
            raise TemplateFailed(f"the template is gone ({exc.strerror or exc})") from None
        request = {"spec": str(spec), "log": str(log), "env": env, "cpus": list(cpus) if cpus else None}
        conn.sendall((json.dumps(request) + "\n").encode())
        line = _read_line(conn)
        if not line:
            conn.close()
            raise TemplateFailed("the template closed the connection without forking")
        return Forked(pid=json.loads(line)["pid"], conn=conn)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()
        Path(self.socket_path).unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # closed twice (dropped, then the round's end), or not empty
            self.folder.rmdir()
