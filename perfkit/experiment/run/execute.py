"""One papermill execution of a probe, in its own process, with a wall-clock limit.

The execution runs in a child process in a new session: on timeout the child, its kernel and
anything they started are killed, and the partial executed notebook (papermill saves it as each
cell starts and ends) is kept as evidence. A raise, a hang and a dead kernel each end in an
outcome that names the cell, so one bad probe never takes the run down with it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from perfkit.errors import RecordError
from perfkit.experiment.records.results import Execution
from perfkit.experiment.run import capped, kernel
from perfkit.experiment.run import warm as warm_replicates
from perfkit.experiment.run.executed import (
    cell_times,
    cell_words,
    last_started_cell,
    read_notebook,
    records_in,
    setup_seconds,
)
from perfkit.files import write_atomic
from perfkit.machine import devices
from perfkit.machine.fitness import cpu_list
from perfkit.paths import format_literal
from perfkit.processes import alive

KERNEL_NAME = kernel.NAME
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_live: set[subprocess.Popen] = set()  # executions in flight, so an interrupted run can stop them
_stopping = threading.Event()  # set when a run is interrupted: no execution starts after that
_live_lock = threading.Lock()


def ensure_kernelspec(directory: Path, *, prefix: list[str] | None = None, warm: bool = False) -> Path:
    """A `perfkit` kernelspec for this interpreter under directory/kernels; put directory on JUPYTER_PATH.

    The runner never relies on a kernel someone registered by hand: whatever interpreter runs
    perfkit also runs the probes. `prefix` runs the kernel under another command (`nsys profile`);
    `warm` launches it through the warm replicate's provisioner (perfkit/experiment/run/warm.py).
    """
    spec_dir = Path(directory) / "kernels" / KERNEL_NAME
    spec = kernel.spec()
    spec["argv"] = [*(prefix or []), *spec["argv"]]
    if warm:
        spec["metadata"]["kernel_provisioner"] = {"provisioner_name": kernel.PROVISIONER}
    write_atomic(spec_dir / "kernel.json", json.dumps(spec, indent=1) + "\n")
    return Path(directory)


def _kill_tree(proc: subprocess.Popen) -> None:
    """Kill the child, its kernel (which runs in a session of its own) and their children."""
    import psutil

    try:
        victims = [psutil.Process(proc.pid)] + psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        victims = []
    try:
        os.killpg(proc.pid, 9)
    except ProcessLookupError:
        pass
    warm_replicates.kill(victims)
    proc.wait()


def allow_executions() -> None:
    """A new round of a run may start executions again (after an earlier run in this process was stopped)."""
    _stopping.clear()


def kill_all() -> None:
    """Stop every execution in flight, and any about to start (an interrupted run leaves no kernels behind)."""
    with _live_lock:
        _stopping.set()
        procs = list(_live)
    for proc in procs:
        _kill_tree(proc)


@dataclass(frozen=True)
class Job:
    """Everything one probe execution needs, wherever it runs (this machine or a cluster worker)."""

    planned: Execution
    notebook: Path  # what to execute: the run's copy of the probe (runs/<run-id>/probes/) or its profiled copy
    exec_dir: Path  # where executed.ipynb, its log and traceback go
    run_id: str
    cwd: Path  # the probe's working directory
    code_root: Path  # the project's root: on the probe's import path, so it imports the code under test
    kernel_dir: Path  # holds the `perfkit` kernelspec (ensure_kernelspec)
    timeout_s: float
    env: dict[str, str] = field(default_factory=dict)  # on top of this process's environment
    extra: dict[str, object] | None = None  # parameters the plan does not key on (the replicate index)
    cpus: tuple[int, ...] | None = None  # the CPUs it runs on, its own while others run at once (None: all)
    template: warm_replicates.Template | None = None  # the round's template it forks from (None: a fresh process)
    machine: dict | None = None  # the machine it runs on, as devices.identity() says (None: this one's)
    server_pids: tuple[int, ...] = ()  # a running server on this machine the probe drives: its load is the subject's


@dataclass(frozen=True)
class Ended:
    """An execution as it ended, with when each cell ran and the machine's utilization meanwhile."""

    execution: Execution
    cells: tuple[tuple[str, float, float], ...] = ()  # (label, start, end), from papermill's metadata
    trace: dict | None = None  # perfkit.machine.utilization's trace, when it was sampled

    def window(self) -> tuple[float, float] | None:
        """From the first cell's start to the last cell's end: when the probe measured."""
        if not self.cells:
            return None
        return min(c[1] for c in self.cells), max(c[2] for c in self.cells)


def measure(job: Job, *, interval_s: float = 0.25) -> Ended:
    """`execute` with the machine's utilization sampled meanwhile: the one wrapper, local or remote.

    The sampler watches the execution's own process tree (from its child process down, so executions
    running at once are not each other's), a running server's on this machine that it drives (its
    load is what is measured, not another job's), and the load of the CPUs it is pinned to.
    """
    from perfkit.machine import utilization

    samplers: list[utilization.Sampler] = []

    def launched(pid: int) -> None:
        sampler = utilization.Sampler(interval_s=interval_s, pid=pid, cpus=job.cpus, also=job.server_pids)
        samplers.append(sampler.start())

    try:
        ended = execute(job, launched=launched)
    finally:
        trace = samplers[0].stop() if samplers else None
    return replace(ended, trace=trace)


def _write_spec(job: Job, output: Path, outcome_path: Path) -> Path:
    spec_path = output.with_name(output.stem + ".spec.json")
    spec = {
        "notebook": str(job.notebook),
        "output": str(output),
        "params": {**job.planned.params, **(job.extra or {})},
        "cwd": str(job.cwd),
        "outcome": str(outcome_path),
        # the child stops when its parent is gone, even before it looked: this process, or the template
        # it was forked from (which itself stops with this process); a warm one whose template died first
        # lives on while this process (`runner`) does
        "parent": job.template.proc.pid if job.template else os.getpid(),
        "runner": os.getpid(),
        "cpus": list(job.cpus) if job.cpus else None,
        "warm": job.template is not None,
    }
    write_atomic(spec_path, json.dumps(spec, indent=1))
    return spec_path


def child_environment(kernel_dir: Path, code_root: Path, env: dict[str, str]) -> dict[str, str]:
    """The environment of an execution's child process (and of the template warm ones fork from)."""
    child_env = dict(os.environ)
    child_env["JUPYTER_PATH"] = os.pathsep.join(p for p in (str(kernel_dir), os.environ.get("JUPYTER_PATH")) if p)
    child_env.pop("MPLBACKEND", None)  # let the kernel use its inline backend so figures land in the notebook
    child_env.update(env)
    # the kernel puts the code under test first on its import path and on PYTHONPATH for what it starts
    # (kernel.on_path): this root, not the project the notebook's folder is in
    child_env[kernel.CODE_ROOT_ENV] = str(code_root)
    child_env[kernel.OUTPUT_CAP_ENV] = str(OUTPUT_CAP_BYTES)  # the kernel cuts a flood before it reaches us
    # every replicate draws its own hash seed: a fixed one inherited from the process that runs perfkit (a
    # Dask worker's nanny sets 6640 for its own processes) would make every replicate share its dict layouts
    child_env["PYTHONHASHSEED"] = "random"
    return child_env


def _launch(
    job: Job, spec_path: Path, log_path: Path, launched: Callable[[int], None] | None = None
) -> tuple[bool, int | None]:
    """Run the child to its end or its time limit: (timed out, exit status); `launched(pid)` once it started."""
    child_env = child_environment(job.kernel_dir, job.code_root, job.env)
    with open(log_path, "wb") as log:
        with _live_lock:  # started and known at once: kill_all either sees it or it never starts
            if _stopping.is_set():
                raise KeyboardInterrupt("the run was interrupted before this execution started")
            if job.template is not None:  # forked from the round's template: the same child, warm
                proc = job.template.fork(spec_path, log_path, child_env, job.cpus)
            else:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "perfkit.experiment.run.execute", str(spec_path)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=child_env,
                    start_new_session=True,
                )
            _live.add(proc)
        try:
            if launched is not None:
                launched(proc.pid)
            proc.wait(timeout=job.timeout_s)
            return False, proc.returncode
        except subprocess.TimeoutExpired:
            _kill_tree(proc)
            return True, proc.returncode
        except BaseException:
            _kill_tree(proc)
            raise
        finally:
            with _live_lock:
                _live.discard(proc)


def execute(job: Job, *, launched: Callable[[int], None] | None = None) -> Ended:
    """Execute the job's notebook into exec_dir/executed.ipynb; never raises for the probe.

    Returns the planned execution, ended: its status, wall time, records and, when it did not end
    well, the reason naming the cell (the traceback goes to exec_dir/traceback.txt). The executed
    notebook is read once, for the records and for when each cell ran.
    """
    output = Path(job.exec_dir) / "executed.ipynb"
    output.parent.mkdir(parents=True, exist_ok=True)
    outcome_path = output.with_name(output.stem + ".outcome.json")
    outcome_path.unlink(missing_ok=True)
    spec_path = _write_spec(job, output, outcome_path)
    started, launched_at = time.monotonic(), time.time()
    timed_out, returncode = _launch(job, spec_path, output.with_name(output.stem + ".log"), launched)
    nb = read_notebook(output)
    ended = replace(
        job.planned,
        wall_s=round(time.monotonic() - started, 3),
        run_id=job.run_id,
        reused=False,
        cpus=cpu_list(job.cpus) if job.cpus else None,
        setup_s=setup_seconds(nb, launched_at) if nb is not None else None,
        warm=job.template is not None,
        machine=job.machine or devices.identity(),
    )
    try:
        records, unreadable = (tuple(records_in(nb, str(output))) if nb is not None else ()), None
    except RecordError as exc:  # this probe's outputs, not the run, are at fault: an error execution
        records, unreadable = (), str(exc)
    running = last_started_cell(nb) if nb is not None else None
    cells = tuple(cell_times(nb)) if nb is not None else ()
    if timed_out:
        where = f"in {cell_words(*running)}" if running else "before any cell ran (kernel start-up)"
        return Ended(
            replace(
                ended,
                status="timeout",
                reason=f"timed out after {job.timeout_s:g} s {where}",
                cell_index=running[0] if running else None,
                records=records,
            ),
            cells,
        )
    try:
        told = json.loads(outcome_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        told = {"status": "crashed", "ename": None, "evalue": f"the executor process exited with status {returncode}"}
    if unreadable is not None and told.get("status") == "ok":
        told = {"status": "error", "ename": "RecordError", "evalue": f"its records cannot be read: {unreadable}"}
    if told.get("status") != "ok" and _stopping.is_set():  # killed by Ctrl-C or SIGTERM: no crash of its own
        stopped = replace(ended, status="crashed", reason=INTERRUPTED, records=records)
        return Ended(replace(stopped, cell_index=running[0] if running else None), cells)
    return Ended(_told(replace(ended, records=records), told, job, running), cells)


def _told(ended: Execution, told: dict, job: Job, running: tuple[int, str] | None) -> Execution:
    """The execution as its outcome file tells it ended."""
    status = told["status"]
    if status == "ok":
        return replace(ended, status="ok")
    if told.get("traceback"):
        write_atomic(Path(job.exec_dir) / "traceback.txt", told["traceback"] + "\n")
    name = job.notebook.name
    if status == "error" and told.get("cell_index") is not None:
        index = told["cell_index"]
        reason = f"{name} {cell_words(index, told.get('source', ''))}: {told['ename']}: {told['evalue']}"
    elif status == "crashed":
        index = running[0] if running else None
        reason = f"kernel died {f'in {cell_words(*running)}' if running else 'before any cell ran'}"
    else:
        index = None
        reason = f"{name}: {told.get('ename')}: {told.get('evalue')}"
    return replace(
        ended, status=status, reason=reason, cell_index=index, ename=told.get("ename"), evalue=told.get("evalue")
    )


INTERRUPTED = "interrupted: the run was stopped while this replicate ran"
OUTPUT_CAP_BYTES = 8 * 2**20  #: a probe's stored output (records and errors aside) beyond this is cut
_PR_SET_CHILD_SUBREAPER = 36


def _pin(cpus: list[int]) -> None:
    """Run this process, every thread of it, and all it starts later on `cpus` only."""
    tasks = Path("/proc/self/task")
    for tid in [int(t.name) for t in tasks.iterdir()] if tasks.is_dir() else [0]:
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:
            pass  # a thread that has ended meanwhile


def _become_subreaper() -> None:
    """Orphans of the probe (a daemon it started in a session of its own) become this process's children.

    Linux only; elsewhere such an orphan can outlive the run (documented in docs/trust.md).
    """
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _kill_descendants() -> list[str]:
    """Kill every process this one still has below it; their names (what the probe left running)."""
    import psutil

    left = psutil.Process().children(recursive=True)
    names = []
    for proc in left:
        try:
            names.append(f"{proc.name()} (pid {proc.pid})")
        except psutil.NoSuchProcess:
            names.append(f"pid {proc.pid}")
    warm_replicates.kill(left)
    return names


def _exit_with_parent(parent: int, runner: int | None) -> None:
    """If the runner dies, stop too, and take the kernel and whatever the probe started along. A warm
    executor whose template (its parent) died first finishes its replicate while the runner lives."""
    while os.getppid() == parent or (runner is not None and runner != parent and alive(runner)):
        time.sleep(1.0)
    _kill_descendants()
    os._exit(3)


def _child(spec_path: str) -> int:
    """Run papermill and say how it ended in the outcome file (child process side)."""
    import papermill
    from nbclient.exceptions import DeadKernelError
    from papermill.engines import papermill_engines
    from papermill.exceptions import PapermillExecutionError

    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    if spec.get("cpus"):
        _pin(spec["cpus"])  # before the kernel starts: it and its threads inherit the CPUs
    _become_subreaper()
    if spec.get("warm"):  # forked from a template: the kernel is forked too, before any thread starts
        kernel.fork_prekernel()
        kernel.register_provisioner()
    watch = (spec.get("parent", os.getppid()), spec.get("runner"))
    threading.Thread(target=_exit_with_parent, args=watch, daemon=True).start()
    papermill_engines.register("perfkit", capped.engine(OUTPUT_CAP_BYTES))
    try:
        papermill.execute_notebook(
            format_literal(spec["notebook"]),  # papermill formats both paths with the parameters
            format_literal(spec["output"]),
            parameters=spec["params"],
            engine_name="perfkit",
            kernel_name=KERNEL_NAME,
            language="python",
            cwd=spec["cwd"],
            progress_bar=False,
            start_timeout=120,
        )
        told = {"status": "ok"}
    except PapermillExecutionError as exc:
        told = {
            "status": "error",
            "cell_index": exc.cell_index,
            "source": exc.source,
            "ename": exc.ename,
            "evalue": exc.evalue,
            "traceback": _ANSI.sub("", "\n".join(exc.traceback)),
        }
    except DeadKernelError as exc:
        told = {"status": "crashed", "ename": "DeadKernelError", "evalue": str(exc)}
    except Exception as exc:  # the kernel would not start, the notebook is unreadable, ...: a failed probe, reported
        import traceback

        told = {"status": "error", "ename": type(exc).__name__, "evalue": str(exc), "traceback": traceback.format_exc()}
    left = _kill_descendants()  # the kernel has shut down: anything still below this process, the probe left
    if left:
        print(f"perfkit: killed what the probe left running: {', '.join(left)}", flush=True)
    write_atomic(Path(spec["outcome"]), json.dumps(told, indent=1))
    return 0 if told["status"] == "ok" else 1


def _leave(code: int) -> None:
    """Exit without the interpreter's teardown: with torch, papermill and matplotlib imported it takes 0.5-0.7 s
    here, inside every replicate's wall time and every round's end, and has nothing left to do: the outcome
    is written, the kernel shut down and its folder removed (in `finally` blocks), what it left killed."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.modules.setdefault("rfc3987_syntax", None)  # 1.6 s of grammar for a format papermill never checks (cli.py)
    if sys.argv[1] == "--template":  # a round's warm template: it forks this child per replicate
        _leave(warm_replicates.serve(sys.argv[2], json.loads(sys.argv[3]), sys.argv[4] or None, _child))
    _leave(_child(sys.argv[1]))
