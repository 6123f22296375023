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
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from perfkit.experiment.results import Execution
from perfkit.files import Reader, write_atomic
from perfkit.samples import MIMETYPE, MetricRecord

KERNEL_NAME = "perfkit"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_live: set[subprocess.Popen] = set()  # executions in flight, so an interrupted run can stop them
_live_lock = threading.Lock()


def nsys() -> str | None:
    """Nsight Systems' command-line tool, when it is on PATH."""
    import shutil

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


def ensure_kernelspec(directory: Path, *, prefix: list[str] | None = None) -> Path:
    """A `perfkit` kernelspec for this interpreter under directory/kernels; put directory on JUPYTER_PATH.

    The runner never relies on a kernel someone registered by hand: whatever interpreter runs
    perfkit also runs the probes. `prefix` runs the kernel under another command (`nsys profile`).
    """
    spec_dir = Path(directory) / "kernels" / KERNEL_NAME
    spec = {
        # no IPython history database: every executed cell would land in ~/.ipython, outside the project
        "argv": [
            *(prefix or []),
            sys.executable,
            "-m",
            "ipykernel_launcher",
            "-f",
            "{connection_file}",
            "--HistoryManager.enabled=False",
        ],
        "display_name": "perfkit",
        "language": "python",
        "metadata": {"debugger": True},
    }
    write_atomic(spec_dir / "kernel.json", json.dumps(spec, indent=1) + "\n")
    return Path(directory)


def _epoch(stamp: str | None) -> float | None:
    if not stamp:
        return None
    moment = datetime.fromisoformat(stamp)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def _first_line(source: str) -> str:
    for line in source.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            text = line.strip()
            return text if len(text) <= 60 else text[:57] + "..."
    return ""


def _cell_words(index: int, source: str) -> str:
    line = _first_line(source)
    return f"cell {index} (`{line}`)" if line else f"cell {index}"


def read_notebook(path: Path):
    """The executed notebook, or None when there is none (or it was torn by a kill)."""
    import nbformat

    try:
        return nbformat.read(str(path), as_version=4)
    except (OSError, ValueError, json.JSONDecodeError):
        return None


def records_in(nb, shown: str = "executed notebook") -> list[MetricRecord]:
    """Every perfkit record displayed in an executed notebook, in order."""
    out = []
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            if output.get("output_type") not in ("display_data", "execute_result"):
                continue
            payload = output.get("data", {}).get(MIMETYPE)
            if payload is None:
                continue
            for i, item in enumerate(payload.get("records", [])):
                out.append(MetricRecord.from_json(Reader(item, shown, f"cells[{index}].records[{i}]")))
    return out


def cell_times(nb) -> list[tuple[str, float, float]]:
    """(label, start, end) per executed cell, from papermill's metadata; a running cell ends now."""
    out = []
    for index, cell in enumerate(nb.cells):
        meta = cell.get("metadata", {}).get("papermill", {})
        start = _epoch(meta.get("start_time"))
        if start is None:
            continue
        end = _epoch(meta.get("end_time")) or time.time()
        out.append((f"cell {index}", start, end))
    return out


def last_started_cell(nb) -> tuple[int, str] | None:
    """The last cell papermill started: the one running when a kernel died or time ran out."""
    found = None
    for index, cell in enumerate(nb.cells):
        if cell.get("metadata", {}).get("papermill", {}).get("start_time"):
            found = (index, cell.get("source", ""))
    return found


def _kill(victims: list) -> None:
    """SIGKILL each psutil process (those already gone are skipped) and wait for them to go."""
    import psutil

    for victim in victims:
        try:
            victim.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(victims, timeout=10)


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
    _kill(victims)
    proc.wait()


def kill_all() -> None:
    """Stop every execution in flight (an interrupted run must not leave kernels behind)."""
    with _live_lock:
        procs = list(_live)
    for proc in procs:
        _kill_tree(proc)


def execute(
    planned: Execution,
    *,
    notebook: Path,
    exec_dir: Path,
    run_id: str,
    cwd: Path,
    kernel_dir: Path,
    timeout_s: float,
    env: dict[str, str] | None = None,
    extra: dict[str, object] | None = None,
) -> Execution:
    """Execute `notebook` with the planned parameters into exec_dir/executed.ipynb; never raises for the probe.

    `extra` adds parameters the plan does not key on (the replicate index). Returns the planned
    execution, ended: its status, wall time, records and, when it did not end
    well, the reason naming the cell (the traceback goes to exec_dir/traceback.txt).
    """
    output = Path(exec_dir) / "executed.ipynb"
    output.parent.mkdir(parents=True, exist_ok=True)
    spec_path = output.with_name(output.stem + ".spec.json")
    outcome_path = output.with_name(output.stem + ".outcome.json")
    if outcome_path.exists():
        outcome_path.unlink()
    write_atomic(
        spec_path,
        json.dumps(
            {
                "notebook": str(notebook),
                "output": str(output),
                "params": {**planned.params, **(extra or {})},
                "cwd": str(cwd),
                "outcome": str(outcome_path),
                "parent": os.getpid(),  # the child stops when this process is gone, even before it looked
            },
            indent=1,
        ),
    )
    child_env = dict(os.environ)
    child_env["JUPYTER_PATH"] = os.pathsep.join(p for p in (str(kernel_dir), os.environ.get("JUPYTER_PATH")) if p)
    child_env.pop("MPLBACKEND", None)  # let the kernel use its inline backend so figures land in the notebook
    child_env.update(env or {})
    started = time.monotonic()
    with open(output.with_name(output.stem + ".log"), "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "perfkit.experiment.execute", str(spec_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=child_env,
            start_new_session=True,
        )
        with _live_lock:
            _live.add(proc)
        try:
            proc.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            _kill_tree(proc)
            timed_out = True
        except BaseException:
            _kill_tree(proc)
            raise
        finally:
            with _live_lock:
                _live.discard(proc)
    ended = replace(planned, wall_s=round(time.monotonic() - started, 3), run_id=run_id, reused=False)
    nb = read_notebook(output)
    records = tuple(records_in(nb, str(output))) if nb is not None else ()
    running = last_started_cell(nb) if nb is not None else None
    if timed_out:
        where = f"in {_cell_words(*running)}" if running else "before any cell ran (kernel start-up)"
        return replace(
            ended,
            status="timeout",
            reason=f"timed out after {timeout_s:g} s {where}",
            cell_index=running[0] if running else None,
            records=records,
        )
    try:
        told = json.loads(outcome_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        told = {
            "status": "crashed",
            "ename": None,
            "evalue": f"the executor process exited with status {proc.returncode}",
        }
    status = told["status"]
    if status == "ok":
        return replace(ended, status="ok", records=records)
    if told.get("traceback"):
        write_atomic(Path(exec_dir) / "traceback.txt", told["traceback"] + "\n")
    if status == "error" and told.get("cell_index") is not None:
        index = told["cell_index"]
        reason = f"{notebook.name} {_cell_words(index, told.get('source', ''))}: {told['ename']}: {told['evalue']}"
    elif status == "crashed":
        index = running[0] if running else None
        reason = f"kernel died {f'in {_cell_words(*running)}' if running else 'before any cell ran'}"
    else:
        index = None
        reason = f"{notebook.name}: {told.get('ename')}: {told.get('evalue')}"
    return replace(
        ended,
        status=status,
        reason=reason,
        cell_index=index,
        ename=told.get("ename"),
        evalue=told.get("evalue"),
        records=records,
    )


OUTPUT_CAP_BYTES = 8 * 2**20  #: a probe's stored output (records and errors aside) beyond this is cut
_PR_SET_CHILD_SUBREAPER = 36


def _become_subreaper() -> None:
    """Orphans of the probe (a daemon it started in a session of its own) become this process's children.

    Linux only; elsewhere such an orphan can outlive the run (documented in the README).
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
    _kill(left)
    return names


def _exit_with_parent(parent: int) -> None:
    """If the runner dies, stop too, and take the kernel and whatever the probe started along."""
    while os.getppid() == parent:
        time.sleep(1.0)
    _kill_descendants()
    os._exit(3)


def _capped_client():
    """papermill's notebook client, storing at most OUTPUT_CAP_BYTES of a probe's output, with a note of the cut."""
    from nbformat.v4 import new_output
    from papermill.clientwrap import PapermillNotebookClient

    class CappedClient(PapermillNotebookClient):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.kept = 0  # characters stored so far
            self.cut: dict[int, int] = {}  # cell index -> characters cut
            self.notes: dict[int, object] = {}  # cell index -> the note saying so

        def output(self, outs, msg, display_id, cell_index):
            content = msg.get("content", {})
            data = content.get("data") or {}
            if msg["msg_type"] == "error" or MIMETYPE in data:  # evidence and tracebacks are never cut
                return super().output(outs, msg, display_id, cell_index)
            size = len(content.get("text", "")) + sum(len(str(v)) for v in data.values())
            if self.kept + size <= OUTPUT_CAP_BYTES:
                self.kept += size
                return super().output(outs, msg, display_id, cell_index)
            self.cut[cell_index] = self.cut.get(cell_index, 0) + size
            text = (
                f"[perfkit: {self.cut[cell_index]:,} characters of this cell's output were cut: a probe's stored "
                f"output is capped at {OUTPUT_CAP_BYTES // 2**20} MiB]\n"
            )
            note = self.notes.get(cell_index)
            if note is None or not any(o is note for o in outs):
                note = new_output("stream", name="stderr", text=text)
                outs.append(note)
                self.notes[cell_index] = note
            else:
                note["text"] = text
            return None

    return CappedClient


def _engine():
    """A papermill engine that runs the notebook with the capped client."""
    from papermill.engines import NBClientEngine, logger

    client = _capped_client()

    class CappedEngine(NBClientEngine):
        @classmethod
        def execute_managed_notebook(cls, nb_man, kernel_name, start_timeout=60, **kwargs):
            return client(nb_man, kernel_name=kernel_name, startup_timeout=start_timeout, log=logger).execute()

    return CappedEngine


def _child(spec_path: str) -> int:
    """Run papermill and say how it ended in the outcome file (child process side)."""
    import papermill
    from nbclient.exceptions import DeadKernelError
    from papermill.engines import papermill_engines
    from papermill.exceptions import PapermillExecutionError

    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    _become_subreaper()
    threading.Thread(target=_exit_with_parent, args=(spec.get("parent", os.getppid()),), daemon=True).start()
    papermill_engines.register("perfkit", _engine())
    try:
        papermill.execute_notebook(
            spec["notebook"],
            spec["output"],
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


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1]))
