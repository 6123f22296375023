"""A run: plan the probe executions, execute (or reuse) them, judge, then write plots, results and ledger.

`run` is those four steps, each a function with typed inputs and outputs:
plan (perfkit/experiment/plan.py) -> `execute` -> `judge_all` -> `write`. The run's manifest
(runs/<run-id>/manifest.json) is written first as "running" and always ends "finished" or
"interrupted", with every execution that had ended by then.
"""

from __future__ import annotations

import errno
import json
import os
import platform
import random
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from perfkit import stats
from perfkit.errors import UserError
from perfkit.experiment import cluster as remote
from perfkit.experiment import commit, ledger, plots
from perfkit.experiment import execute as executor
from perfkit.experiment.hypothesis import MAX_REPLICATES, Hypothesis, load_hypotheses
from perfkit.experiment.plan import (
    REPLICATE_PARAM,
    Plan,
    environment_key,
    parse_overrides,
    plan,
    source_tree_hash,
)
from perfkit.experiment.results import (
    Execution,
    HypothesisResult,
    MetricSummary,
    RunResults,
    load_all_results,
    read_execution,
    write_execution,
)
from perfkit.experiment.verdict import Judgement, Point, Verdict, effective_points, judge, usable_replicates
from perfkit.files import dumps, write_atomic, write_json
from perfkit.machine import devices, fitness, snapshot, utilization
from perfkit.paths import Project

__all__ = ["DEFAULT_TIMEOUT_S", "INJECTED_TAG", "PROFILERS", "RunOptions", "RunReport", "parse_overrides", "run"]

PROFILERS = ("torch", "nsys")
INJECTED_TAG = "perfkit-injected"
DEFAULT_TIMEOUT_S = 600.0
#: independent kernel processes per execution when neither the command nor the record says
DEFAULT_REPLICATES = {"quick": 3, "full": 5}
MORE_LOOKS = 2  # times a run may add replicates to verdicts the first look left undecided
#: Format history of runs/<run-id>/manifest.json (`format_version`):
#:   1: first format (with a top-level `git` beside the environment's).
#:   2: the project's git state is recorded once, in `environment.perfkit.git`; statuses
#:      running | finished | interrupted; `executions` in the one Execution shape.
#:   3: `process` (host, pid, start time) says who runs it; status `killed` (with `killed_note`):
#:      a later run found it "running" with its process gone; `failed` (with `failed_note`): it could
#:      not write what it measured (a full disk, a read-only folder).
MANIFEST_VERSION = 3


@dataclass(frozen=True)
class RunOptions:
    quick: bool = False
    jobs: int = 1
    overrides: dict[str, Any] = field(default_factory=dict)
    timeout_s: float = DEFAULT_TIMEOUT_S
    force: bool = False
    profile: str | None = None
    cluster: str | None = None  # a Dask scheduler address or local:N (perfkit/experiment/cluster.py)
    client: Any = field(default=None, compare=False, repr=False)  # its client, once connected
    command: str = ""
    replicates: int | None = None  # None: DEFAULT_REPLICATES for the mode
    max_replicates: int | None = None  # add replicates to undecided verdicts up to this; None: per mode
    retry_unfit: bool = True  # re-run, once, a replicate measured while the machine was busy

    def replicates_default(self) -> int:
        return self.replicates or DEFAULT_REPLICATES["quick" if self.quick else "full"]

    def replicates_most(self) -> int:
        """Quick mode adds none by default (it must stay quick); a full run up to three times as many."""
        if self.max_replicates is not None:
            return max(self.max_replicates, self.replicates_default())
        return self.replicates_default() * (1 if self.quick else 3)

    def confidence(self) -> float:
        """Each look at the evidence spends part of the 5%: Bonferroni over the looks a run may take."""
        looks = 1 + (MORE_LOOKS if self.replicates_most() > self.replicates_default() else 0)
        return 1.0 - (1.0 - stats.CONFIDENCE) / looks

    def check(self) -> None:
        for flag, value in (("--replicates", self.replicates), ("--max-replicates", self.max_replicates)):
            if value is not None and not 1 <= value <= MAX_REPLICATES:
                raise UserError(f"{flag} must be from 1 to {MAX_REPLICATES}, got {value}")
        if self.jobs < 1:
            raise UserError(f"--jobs must be at least 1, got {self.jobs}")
        if self.timeout_s <= 0:
            raise UserError(f"--timeout must be positive, got {self.timeout_s}")
        if self.profile is not None and self.profile not in PROFILERS:
            raise UserError(f"--profile: expected one of {', '.join(PROFILERS)}, got {self.profile!r}")
        if self.cluster and self.profile:
            raise UserError("--profile with --cluster is not supported yet: profile a probe on this machine")
        if self.profile == "nsys" and executor.nsys() is None:
            raise UserError(
                "--profile nsys: Nsight Systems' `nsys` is not on PATH; install NVIDIA Nsight Systems "
                "(or use --profile torch, which needs nothing more)"
            )


@dataclass(frozen=True)
class RunDir:
    """Where one run keeps its evidence: runs/<run-id>/."""

    run_id: str
    path: Path
    created: str  # UTC, ISO 8601

    def execution_dir(self, key: str) -> Path:
        return self.path / "executions" / key


@dataclass(frozen=True)
class Judged:
    """One hypothesis judged: the verdict and the evidence it came from."""

    hypothesis: Hypothesis
    judgement: Judgement
    executions: tuple[Execution, ...]
    points: tuple[Point, ...]
    stopped: str | None = None  # why the run added no more replicates for it


class Interrupted(KeyboardInterrupt):
    """A run stopped by Ctrl-C or SIGTERM; says what was kept."""

    def __init__(self, run_dir: RunDir, ended: int, planned: int):
        self.run_dir, self.ended, self.planned = run_dir, ended, planned
        super().__init__(
            f"interrupted: {ended} of {planned} probe executions had ended and are kept under "
            f"{run_dir.path}/ (its manifest says interrupted); no verdicts were written"
        )


@dataclass
class RunReport:
    run_id: str
    results: RunResults
    executed: int
    reused: int
    wall_s: float
    exit_code: int
    judgements: dict[str, Judgement] = field(default_factory=dict)


class _Printer:
    """Progress lines from several worker threads, one line at a time.

    A reader that went away (`perfkit run ... | head -2`) never stops the measurement: once the pipe
    is closed the lines are dropped and the run goes on to store its results and the ledger.
    """

    def __init__(self, out: Callable[[str], None]):
        self.out = out
        self.lock = threading.Lock()
        self.closed = False

    def __call__(self, text: str) -> None:
        with self.lock:
            if self.closed:
                return
            try:
                self.out(text)
            except (BrokenPipeError, ValueError):  # ValueError: a closed file
                self.closed = True


# ---------------------------------------------------------------- the run directory and its manifest


def new_run_dir(project: Project) -> RunDir:
    """A run id that sorts by time and is claimed atomically (mkdir) against concurrent runs."""
    project.runs_dir.mkdir(parents=True, exist_ok=True)
    now = datetime.now(UTC)
    base = now.strftime("%Y%m%d-%H%M%S")
    for n in range(1, 1000):
        run_id = base if n == 1 else f"{base}-{n}"
        if (project.results_dir / f"{run_id}.json").exists():
            continue
        try:
            (project.runs_dir / run_id).mkdir()
        except FileExistsError:
            continue
        return RunDir(run_id=run_id, path=project.runs_dir / run_id, created=now.strftime("%Y-%m-%dT%H:%M:%SZ"))
    raise UserError(f"cannot find a free run id under {project.runs_dir}")


MIN_FREE_BYTES = 64 * 2**20  # executed notebooks, samples and plots of a run: well under this


def check_writable(project: Project) -> None:
    """Before any probe runs: every folder a run writes takes a file, and the disk has room."""
    import shutil
    import tempfile

    for folder in (project.runs_dir, project.results_dir, project.plots_dir, project.ledger_path.parent):
        shown = project.relative(folder)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(prefix=".perfkit-write-check.", suffix=".tmp", dir=folder)
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise UserError(f"cannot write in {shown}/: {exc.strerror or exc}; nothing was run") from None
    free = shutil.disk_usage(project.runs_dir).free
    if free < MIN_FREE_BYTES:
        raise UserError(
            f"only {free / 2**20:.0f} MiB free on the disk of {project.relative(project.runs_dir)}/; a run needs "
            f"{MIN_FREE_BYTES / 2**20:.0f} MiB; nothing was run"
        )


_CANNOT_WRITE = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}


class WriteFailed(UserError):
    """A run could not write what it measured (a full disk, a folder made read-only mid-run)."""


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _manifest(
    project: Project, run_dir: RunDir, hypotheses: list[Hypothesis], options: RunOptions, source_hash: str
) -> dict[str, Any]:
    return {
        "run_id": run_dir.run_id,
        "created": run_dir.created,
        "status": "running",
        "command": options.command or " ".join(sys.argv),
        "cwd": os.getcwd(),
        "versions": {name: _version(name) for name in ("perfkit", "torch", "papermill", "nbclient", "numpy")}
        | {"python": platform.python_version()},
        "options": {
            "quick": options.quick,
            "jobs": options.jobs,
            "timeout_s": options.timeout_s,
            "force": options.force,
            "profile": options.profile,
            "overrides": options.overrides,
            "replicates": options.replicates_default(),
            "hypotheses": [h.id for h in hypotheses],
        },
        "perfkit_source": source_hash,
        "process": _this_process(),
    }


def _this_process() -> dict[str, Any]:
    """Who runs this run: enough for a later run to tell a killed one from one still going."""
    import psutil

    return {"host": platform.node(), "pid": os.getpid(), "started": psutil.Process().create_time()}


def _alive(process: dict[str, Any]) -> bool | None:
    """Whether the process a manifest names still runs (None: another host, or not recorded)."""
    import psutil

    if not isinstance(process, dict) or process.get("host") != platform.node() or "pid" not in process:
        return None
    try:
        return abs(psutil.Process(int(process["pid"])).create_time() - float(process.get("started", 0))) < 1.0
    except (psutil.NoSuchProcess, ValueError, TypeError):
        return False


def mark_killed_runs(project: Project, by: str) -> list[str]:
    """Manifests still "running" whose process is gone: a kill (-9, OOM, power) ended them. Mark them."""
    found = []
    for path in sorted(project.runs_dir.glob("*/manifest.json")):
        if path.parent.name == by:
            continue
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(manifest, dict) or manifest.get("status") != "running":
            continue
        if _alive(manifest.get("process")) is False:
            manifest["status"] = "killed"
            manifest["killed_note"] = f"process {manifest['process']['pid']} ended without finishing; found by run {by}"
            manifest.pop("format_version", None)
            write_json(path, manifest, version=MANIFEST_VERSION)
            found.append(path.parent.name)
    return found


def _write_manifest(run_dir: RunDir, manifest: dict[str, Any]) -> None:
    write_json(run_dir.path / "manifest.json", json.loads(json.dumps(manifest, default=str)), version=MANIFEST_VERSION)


# ---------------------------------------------------------------- execute (or reuse)


def find_cached(project: Project, planned: Execution, current_run: str) -> Execution | None:
    """The latest earlier execution of this key and replicate that ended well on a fit machine."""
    if not project.runs_dir.is_dir():
        return None
    for run_dir in sorted((p for p in project.runs_dir.iterdir() if p.is_dir()), reverse=True):
        if run_dir.name == current_run:
            continue
        path = run_dir / "executions" / planned.id / "execution.json"
        if path.is_file():
            found = read_execution(path, project.relative(path))
            if (
                found.status == "ok"
                and found.key == planned.key
                and found.replicate == planned.replicate
                and not found.unfit
            ):
                return found
    return None


def _profiled_notebook(source: Path, target: Path, trace_path: str) -> Path:
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


def _execute_one(
    project: Project,
    run_dir: RunDir,
    planned: Execution,
    options: RunOptions,
    *,
    kernel_dir: Path,
    told: bool,
    tag: str,
    say: _Printer,
) -> Execution:
    exec_dir = run_dir.execution_dir(planned.id)
    exec_dir.mkdir(parents=True, exist_ok=True)
    notebook = project.notebooks_dir / planned.notebook
    env = fitness.thread_env(sharing=options.jobs)
    threads_text = env.get("OMP_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS") or os.environ.get("MKL_NUM_THREADS")
    if options.profile == "torch":
        trace = exec_dir / "torch_trace.json"
        env["PERFKIT_TORCH_PROFILE"] = str(trace)
        notebook = _profiled_notebook(notebook, exec_dir / "input.ipynb", str(trace))
    if options.profile == "nsys":  # the kernel itself runs under Nsight Systems: a report per execution
        kernel_dir = executor.ensure_kernelspec(exec_dir / "jupyter", prefix=executor.nsys_prefix(exec_dir / "nsys"))
    sampler = utilization.Sampler(interval_s=0.25)
    label = f"{planned.label()} [replicate {planned.replicate}]"
    say(f"{tag} start    {label}  ({threads_text} threads)")
    sampler.start()
    try:
        ended = executor.execute(
            planned,
            notebook=notebook,
            exec_dir=exec_dir,
            run_id=run_dir.run_id,
            cwd=project.notebooks_dir,
            kernel_dir=kernel_dir,
            timeout_s=options.timeout_s,
            env=env,
            extra={REPLICATE_PARAM: planned.replicate} if told else None,
        )
    finally:
        trace_data = sampler.stop()
    return _finish(exec_dir, ended, trace_data, label=label, tag=tag, say=say)


def _finish(
    exec_dir: Path, ended: Execution, trace_data: dict | None, *, label: str, tag: str, say: _Printer
) -> Execution:
    """After an execution, wherever it ran: fitness from its trace, its files, one line saying how it ended."""
    nb = executor.read_notebook(exec_dir / "executed.ipynb")
    cells = executor.cell_times(nb) if nb else []
    window = (min(c[1] for c in cells), max(c[2] for c in cells)) if cells else None  # when the cells ran
    if trace_data is not None:
        ended = replace(ended, unfit=fitness.unfit(trace_data, window))
        write_atomic(exec_dir / "utilization.json", dumps(json.loads(json.dumps(trace_data, default=str))))
        utilization.plot_trace(trace_data, exec_dir / "utilization.png", intervals=cells)
    write_execution(exec_dir / "execution.json", ended)
    detail = f"{len(ended.records)} records" if ended.status == "ok" else ended.reason
    status = "ok" if ended.status == "ok" else ended.status.upper()
    on = f" on {ended.host}" if ended.host else ""
    say(
        f"{tag} finished {label}{on}  {ended.wall_s:.1f} s  {status}: {detail}"
        + (f"  UNFIT: {ended.unfit}" if ended.unfit else "")
    )
    return ended


def _in_pool(
    project: Project,
    run_dir: RunDir,
    the_plan: Plan,
    options: RunOptions,
    batch: list[Execution],
    say: _Printer,
    done: dict[str, Execution],
    *,
    kernel_dir: Path,
    first: int,
    total: int,
) -> None:
    """Execute one round's executions, `options.jobs` at a time (or on the cluster), filling `done` as each ends."""
    if options.client is not None:
        _on_cluster(project, run_dir, the_plan, options, batch, say, done, first=first, total=total)
        return
    pool = ThreadPoolExecutor(max_workers=options.jobs)
    try:
        futures = {
            pool.submit(
                _execute_one,
                project,
                run_dir,
                x,
                options,
                kernel_dir=kernel_dir,
                told=x.key in the_plan.told,
                tag=f"[{first + i + 1}/{total}]",
                say=say,
            ): x
            for i, x in enumerate(batch)
        }
        for future, x in futures.items():
            done[x.id] = future.result()
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        executor.kill_all()
        raise
    pool.shutdown()


def _on_cluster(
    project: Project,
    run_dir: RunDir,
    the_plan: Plan,
    options: RunOptions,
    batch: list[Execution],
    say: _Printer,
    done: dict[str, Execution],
    *,
    first: int,
    total: int,
) -> None:
    tags = {x.id: f"[{first + i + 1}/{total}]" for i, x in enumerate(batch)}

    def label(x: Execution) -> str:
        return f"{x.label()} [replicate {x.replicate}]"

    def started(x: Execution, how: str) -> None:
        say(f"{tags[x.id]} start    {label(x)}  ({how})")

    def ended(x: Execution, got: Execution, trace: dict | None) -> None:
        exec_dir = run_dir.execution_dir(x.id)
        exec_dir.mkdir(parents=True, exist_ok=True)
        done[x.id] = _finish(exec_dir, got, trace, label=label(x), tag=tags[x.id], say=say)

    remote.execute(
        options.client,
        project,
        [
            (
                x,
                run_dir.execution_dir(x.id),
                {REPLICATE_PARAM: x.replicate} if x.key in the_plan.told else None,
                the_plan.resources.get(x.key, {}),
            )
            for x in batch
        ],
        run_id=run_dir.run_id,
        timeout_s=options.timeout_s,
        env={},
        started=started,
        ended=ended,
    )


def execute(
    project: Project, run_dir: RunDir, the_plan: Plan, options: RunOptions, say: _Printer, done: dict[str, Execution]
) -> None:
    """Reuse or execute every replicate of every planned execution, filling `done` (id -> ended) as each ends.

    Replicates run in rounds (replicate 0 of every execution, then 1, ...), each round in an order
    shuffled with a fixed seed, so drift and background load spread over all executions instead of
    landing on one. A replicate measured on a busy machine is re-run once at the end.
    """
    fresh = [x for x in the_plan.replicated() if x.id not in done]  # not had by an earlier look of this run
    to_run: list[Execution] = []
    reused: list[Execution] = []
    for planned in fresh:
        cached = None if options.force else find_cached(project, planned, run_dir.run_id)
        if cached is None:
            to_run.append(planned)
            continue
        done[planned.id] = replace(cached, reused=True)
        write_execution(run_dir.execution_dir(planned.id) / "execution.json", done[planned.id])
        reused.append(planned)
    counts = "/".join(str(n) for n in sorted(set(the_plan.replicates.values())))
    say(
        f"run {run_dir.run_id}: {len(the_plan.needs)} hypotheses, {len(the_plan.executions)} probe executions x "
        f"{counts} replicates ({len(to_run)} to execute, {len(reused)} reused){' [quick]' if options.quick else ''}"
    )
    for x in reused:
        origin = done[x.id]
        say(f"[reused]  {x.label()} [replicate {x.replicate}]  from run {origin.run_id} ({origin.wall_s:.1f} s there)")
    if not to_run:
        return
    kernel_dir = executor.ensure_kernelspec(run_dir.path / "jupyter")
    started = 0
    for r in sorted({x.replicate for x in to_run}):
        batch = [x for x in to_run if x.replicate == r]
        random.Random(r).shuffle(batch)
        _in_pool(
            project,
            run_dir,
            the_plan,
            options,
            batch,
            say,
            done,
            kernel_dir=kernel_dir,
            first=started,
            total=len(to_run),
        )
        started += len(batch)
    retry = [x for x in to_run if done[x.id].unfit] if options.retry_unfit else []
    if retry:
        say(f"re-running {len(retry)} replicates measured while the machine was busy")
        for x in retry:  # the first attempt's evidence is kept beside the re-run's
            first_try = run_dir.execution_dir(x.id)
            first_try.rename(first_try.with_name(first_try.name + "-unfit"))
        again: dict[str, Execution] = {}
        _in_pool(
            project, run_dir, the_plan, options, retry, say, again, kernel_dir=kernel_dir, first=0, total=len(retry)
        )
        for x in retry:
            if again[x.id].status == "ok":
                done[x.id] = again[x.id]
                continue
            failed = run_dir.execution_dir(x.id)  # the re-run broke: the first attempt stands, as it was
            failed.rename(failed.with_name(failed.name + "-retry-failed"))
            failed.with_name(failed.name + "-unfit").rename(failed)


# ---------------------------------------------------------------- judge


def judge_all(
    hypotheses: list[Hypothesis], the_plan: Plan, done: dict[str, Execution], *, confidence: float = stats.CONFIDENCE
) -> list[Judged]:
    out = []
    replicated = the_plan.replicated()
    for h in hypotheses:
        executions = tuple(done[x.id] for x in replicated if x.key in the_plan.needs[h.id])
        sweep = h.probe.sweep
        usable = usable_replicates(executions)  # the ones the verdict rests on
        try:
            points = effective_points(usable, sweep.param if sweep else None)
        except UserError:
            points = []  # the judgement says why (a unit mismatch is an error verdict)
        out.append(
            Judged(
                hypothesis=h,
                judgement=judge(h, list(executions), confidence=confidence),
                executions=executions,
                points=tuple(points),
            )
        )
    return out


def _summaries(judged: Judged) -> tuple[MetricSummary, ...]:
    """Mean and 95% interval of each metric the claim reads, at every point it was recorded."""
    names = set(judged.hypothesis.expect.summarized())
    out = []
    for point in judged.points:
        if point.name not in names:
            continue
        values = point.samples()
        mean = low = high = std = between = None
        if values and stats.is_clean(values):
            est = stats.mean_estimate(point.replicates)
            mean, low, high, std = est.value, est.low, est.high, stats.summarize(values).std
            between = stats.between_share(point.replicates)
        out.append(
            MetricSummary(
                name=point.name,
                unit=point.unit,
                at=point.at or None,
                n=len(values),
                mean=mean,
                low=low,
                high=high,
                std=std,
                note=point.note,
                replicates=len(point.replicates),
                between=between,
            )
        )
    return tuple(sorted(out, key=lambda m: (m.name, json.dumps(m.at, sort_keys=True, default=str))))


def not_reproduced(result: HypothesisResult, previous: HypothesisResult | None, previous_run: str) -> str | None:
    """What the last verdict measured, when nothing changed since (record, probe, parameters and code:
    the same execution keys) and yet the two intervals are disjoint; else None."""
    if previous is None or previous.hash != result.hash or not (previous.measured and result.measured):
        return None
    if {x.key for x in previous.executions} != {x.key for x in result.executions}:
        return None
    now, then = result.measured, previous.measured
    if now.low <= then.high and then.low <= now.high:
        return None
    return f"run {previous_run} measured {then.text()} with nothing changed"


def _result(judged: Judged) -> HypothesisResult:
    h, j = judged.hypothesis, judged.judgement
    return HypothesisResult(
        id=h.id,
        hash=h.hash,
        claim=h.claim,
        kind=h.expect.kind,
        expected=j.expected,
        verdict=j.verdict.value,
        reason=j.reason,
        measured=j.measured,
        off_by=j.off_by,
        floor=j.floor,
        plot=f"plots/{h.id}.png",
        warnings=j.warnings,
        metrics=_summaries(judged),
        stopped=judged.stopped,
        executions=tuple(replace(x, records=()) for x in judged.executions),
    )


def _grow(the_plan: Plan, judged: list[Judged], most: int) -> Plan | None:
    """The plan with more replicates for executions whose verdict more replicates would likely decide."""
    counts = dict(the_plan.replicates)
    for item in judged:
        needed = item.judgement.needed
        if item.judgement.verdict is not Verdict.INCONCLUSIVE or needed is None:
            continue
        for key in the_plan.needs[item.hypothesis.id]:
            counts[key] = max(counts[key], min(most, max(needed, counts[key] + 1)))
    if counts == the_plan.replicates:
        return None
    return replace(the_plan, replicates=counts)


def _growth_text(the_plan: Plan) -> str:
    return ", ".join(f"{x.label()}: {the_plan.replicates[x.key]}" for x in the_plan.executions)


def _stopped(item: Judged, the_plan: Plan, options: RunOptions) -> str:
    """Why no more replicates were run for this hypothesis."""
    counts = sorted({the_plan.replicates[k] for k in the_plan.needs[item.hypothesis.id]})
    ran = "/".join(str(n) for n in counts)
    j = item.judgement
    if j.verdict in (Verdict.CONFIRMED, Verdict.REFUTED):
        return f"decided at {ran} replicates"
    if j.verdict is Verdict.ERROR:
        return f"the probe failed; {ran} ran"
    if j.reason and j.reason.startswith("the machine was not fit"):
        return f"the machine was busy; {ran} ran"
    if j.needed is None:
        return f"more replicates would not decide it; {ran} ran"
    if max(counts) < options.replicates_most():
        return (
            f"{ran} replicates after {MORE_LOOKS} looks added more; --max-replicates allows {options.replicates_most()}"
        )
    if options.replicates_most() <= options.replicates_default():
        return f"{ran} replicates planned; --max-replicates would let the run add more"
    return f"reached --max-replicates ({options.replicates_most()})"


# ---------------------------------------------------------------- write


def write(
    project: Project,
    run_dir: RunDir,
    judged: list[Judged],
    *,
    quick: bool,
    command: str,
    git: tuple[str | None, bool | None],
    say: _Printer,
    profile: str | None = None,
    machine: str | None = None,
) -> tuple[RunResults, Path | None]:
    """Plots, then the compact results, plots and LEDGER.md committed as one unit (perfkit/experiment/commit.py).

    The ledger is a history of measurements, not of runs: a hypothesis whose executions were all
    reused and whose verdict is the one already stored gets no new row, and a run that measured
    nothing new writes no results file (its evidence and manifest stay under runs/). Returns every
    result of the run and the results file written (None when there was nothing new).
    """
    staged = commit.staging_dir(project, run_dir.run_id) / "plots"
    for item in judged:
        h, j = item.hypothesis, item.judgement
        for path, dpi in ((run_dir.path / "plots" / f"{h.id}.png", 150), (staged / f"{h.id}.png", 100)):
            plots.plot_verdict(h, j, list(item.points), path, dpi=dpi)
    with commit.locked(project, say):
        commit.finish_pending(project)
        earlier = load_all_results(project)  # read under the lock: for "not reproduced" and for the ledger
        standing = {hid: ledger.standing(runs) for hid, runs in ledger.history(earlier).items()}
        last = {hid: (e.run_id, e.result) for hid, e in standing.items()}
        made, fresh = [], []
        for item in judged:
            result = _result(item)
            run_id, previous = last.get(result.id, (None, None))
            result = replace(result, not_reproduced=not_reproduced(result, previous, run_id))
            made.append(result)
            if ledger.same_measurement(result, previous):
                (staged / f"{result.id}.png").unlink(missing_ok=True)  # the ledger's plot stays the measured one
                continue
            fresh.append(result)
            if profile and previous is not None and not (standing[result.id].run and standing[result.id].run.profile):
                (staged / f"{result.id}.png").unlink(missing_ok=True)  # a profiled run never replaces the plot
        results = RunResults(
            run_id=run_dir.run_id,
            created=run_dir.created,
            command=command,
            quick=quick,
            git_commit=git[0],
            git_dirty=git[1],
            hypotheses=tuple(made),
            profile=profile,
            machine=machine,
        )
        path = commit.apply(project, replace(results, hypotheses=tuple(fresh)), earlier) if fresh else None
    for item, result in zip(judged, made):
        h, j = item.hypothesis, item.judgement
        same = "" if result in fresh else "   (reused: as in the ledger)"
        say(f"{h.id:<32} {j.verdict.value:<13} {j.line()}{same}")
        for warning in j.warnings:
            say(f"{'':<32}   warning: {warning}")
        if result.not_reproduced:
            say(f"{'':<32}   NOT REPRODUCED: {result.not_reproduced}")
    return results, path


# ---------------------------------------------------------------- the run


def run(
    project: Project,
    *,
    ids: list[str] | None = None,
    all_hypotheses: bool = False,
    quick: bool = False,
    jobs: int = 1,
    overrides: dict[str, Any] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    force: bool = False,
    profile: str | None = None,
    replicates: int | None = None,
    max_replicates: int | None = None,
    cluster: str | None = None,
    command: str = "",
    out: Callable[[str], None] = print,
) -> RunReport:
    """Execute what the selected hypotheses need, judge them, and write results, plots and ledger."""
    started = time.monotonic()
    if bool(ids) == bool(all_hypotheses):
        raise UserError("name the hypotheses to run, or pass --all (not both)")
    options = RunOptions(
        quick=quick,
        jobs=jobs,
        overrides=dict(overrides or {}),
        timeout_s=timeout_s,
        force=force,
        profile=profile,
        command=command or " ".join(sys.argv),
        replicates=replicates,
        max_replicates=max_replicates,
        cluster=cluster or configured_cluster(project),
    )
    options.check()
    project.check_confined()
    hypotheses = load_hypotheses(project, ids or None)  # a malformed record stops the run before anything is made
    if not hypotheses:
        raise UserError(f"no hypotheses in {project.relative(project.hypotheses_dir)}")
    check_writable(project)
    if options.cluster:  # an unreachable scheduler is an error before anything is written
        options = replace(options, client=remote.connect(options.cluster))
    try:
        return _run(project, options, hypotheses, started=started, out=out)
    finally:
        if options.client is not None:
            remote.close(options.client)


def configured_cluster(project: Project) -> str | None:
    """`[tool.perfkit] cluster = "..."` in the project's pyproject.toml, if set."""
    import tomllib

    path = project.root / "pyproject.toml"
    if not path.is_file():
        return None
    try:
        value = tomllib.loads(path.read_text(encoding="utf-8")).get("tool", {}).get("perfkit", {}).get("cluster")
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"{project.relative(path)}: cannot read [tool.perfkit]: {exc}") from None
    if value is not None and not isinstance(value, str):
        raise UserError(f"{project.relative(path)}: [tool.perfkit] cluster must be a string, got {value!r}")
    return value


def _run(
    project: Project, options: RunOptions, hypotheses: list[Hypothesis], *, started: float, out: Callable[[str], None]
) -> RunReport:
    quick, profile = options.quick, options.profile
    say = _Printer(out)
    source_hash = source_tree_hash()
    environment = environment_key()
    if options.client is not None:  # measured elsewhere: never the same measurement as one made here
        environment["cluster"] = options.cluster
        say(f"cluster {options.cluster}: {remote.where(options.client)}")
    the_plan = plan(
        project,
        hypotheses,
        quick=quick,
        overrides=options.overrides,
        source_hash=source_hash,
        profile=profile,
        environment=environment,
        replicates=options.replicates_default(),
        note=say,
    )
    if options.client is not None:
        remote.check_resources(options.client, the_plan.resources, {x.key: x.label() for x in the_plan.executions})
    run_dir = new_run_dir(project)
    manifest = _manifest(project, run_dir, hypotheses, options, source_hash)
    manifest["cache_key"] = environment  # what, besides the notebook and parameters, a reuse must match
    _write_manifest(run_dir, manifest)
    for killed in mark_killed_runs(project, by=run_dir.run_id):
        say(f"run {killed} was killed while running (its process is gone): its manifest now says so")
    manifest["environment"] = snapshot.snapshot(root=project.root)
    git = manifest["environment"]["perfkit"]["git"]
    machine_text = devices.describe()
    done: dict[str, Execution] = {}
    timings: dict[str, float] = {}
    try:
        t0 = time.monotonic()
        confidence = options.confidence()
        execute(project, run_dir, the_plan, options, say, done)
        judged = judge_all(hypotheses, the_plan, done, confidence=confidence)
        for _ in range(MORE_LOOKS if options.replicates_most() > options.replicates_default() else 0):
            grown = _grow(the_plan, judged, options.replicates_most())
            if grown is None:
                break
            the_plan = grown
            say(f"undecided: adding replicates ({_growth_text(the_plan)})")
            execute(project, run_dir, the_plan, options, say, done)
            judged = judge_all(hypotheses, the_plan, done, confidence=confidence)
        timings["execute_s"] = round(time.monotonic() - t0, 3)
        judged = [replace(item, stopped=_stopped(item, the_plan, options)) for item in judged]
        say("")
        results, results_file = write(
            project,
            run_dir,
            judged,
            quick=quick,
            command=options.command,
            git=(git.get("commit"), git.get("dirty")),
            say=say,
            profile=profile,
            machine=machine_text,
        )
        manifest["status"] = "finished"
        manifest["verdicts"] = {item.hypothesis.id: item.judgement.verdict.value for item in judged}
    except KeyboardInterrupt:
        manifest["status"] = "interrupted"
        raise Interrupted(run_dir, len(done), len(the_plan.replicated())) from None
    except OSError as exc:
        if exc.errno not in _CANNOT_WRITE:
            raise
        where = project.relative(Path(exc.filename)) if exc.filename else "a file"
        manifest["status"] = "failed"
        manifest["failed_note"] = f"cannot write {where}: {exc.strerror or exc}"
        ledger_state = (
            "its ledger commit is half-applied: `perfkit ledger` finishes it once the disk takes it"
            if commit.staging_dir(project, run_dir.run_id) / "journal.json" in commit.pending(project)
            else "nothing was added to the ledger"
        )
        raise WriteFailed(
            f"cannot write {where}: {exc.strerror or exc}; {len(done)} of {len(the_plan.replicated())} probe "
            f"executions had ended, and what they wrote is under {project.relative(run_dir.path)}/; {ledger_state}"
        ) from None
    finally:
        if manifest["status"] not in ("finished", "failed"):
            manifest["status"] = "interrupted"
        timings["total_s"] = round(time.monotonic() - started, 3)
        manifest["executions"] = [done[x.id].to_json(with_records=False) for x in the_plan.replicated() if x.id in done]
        manifest["timings"] = timings
        try:
            _write_manifest(run_dir, manifest)
        except OSError:
            if manifest["status"] != "failed":
                raise
    wall = time.monotonic() - started
    executed = sum(1 for x in done.values() if not x.reused)
    judgements = {item.hypothesis.id: item.judgement for item in judged}
    counts = {v: sum(1 for j in judgements.values() if j.verdict == v) for v in Verdict}
    say("")
    say(
        f"run {run_dir.run_id} finished in {wall:.1f} s: {executed} executed, {len(done) - executed} reused; "
        + ", ".join(f"{n} {v.value}" for v, n in counts.items() if n)
    )
    if results_file is None:
        say(
            "nothing new was measured (every execution reused, every verdict as stored): results and ledger "
            f"unchanged; evidence: {project.relative(run_dir.path)}/"
        )
    else:
        say(
            f"results: {project.relative(results_file)}; ledger: {project.relative(project.ledger_path)}; "
            f"evidence: {project.relative(run_dir.path)}/"
        )
    return RunReport(
        run_id=run_dir.run_id,
        results=results,
        executed=executed,
        reused=len(done) - executed,
        wall_s=wall,
        exit_code=1 if counts[Verdict.ERROR] else 0,
        judgements=judgements,
    )
