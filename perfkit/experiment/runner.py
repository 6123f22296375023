"""A run: plan the probe executions the hypotheses need, execute (or reuse) them, judge, plot, ledger.

Each distinct (notebook, parameters) pair runs once even when several hypotheses read it. An
execution whose notebook, parameters and perfkit source are unchanged is reused from the latest
run that has it, unless forced, and the output says so.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import platform
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

import yaml

from perfkit.experiment import execute as executor
from perfkit.experiment import ledger
from perfkit.experiment import plots
from perfkit.errors import UserError
from perfkit.experiment.hypothesis import Hypothesis, check_parameter, load_hypotheses, notebook_parameters
from perfkit.files import write_atomic
from perfkit.paths import Project
from perfkit.phases import BREAKDOWN, STEP
from perfkit.experiment.results import (
    ExecutionRecord, ExecutionRef, HypothesisResult, MetricSummary, RunResults, dumps, read_execution,
    write_execution, write_results,
)
from perfkit.stats import is_clean, mean_interval, seed_for, summarize
from perfkit.experiment.verdict import Judgement, Verdict, effective_points, judge

PROFILERS = ("torch",)
INJECTED_TAG = "perfkit-injected"
DEFAULT_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Planned:
    """One distinct probe execution and the hypotheses that read it."""

    key: str
    notebook: str
    params: dict[str, Any]
    hypotheses: tuple[str, ...]

    def label(self) -> str:
        shown = " ".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"{self.notebook} {shown}".strip()


@dataclass
class RunReport:
    run_id: str
    results: RunResults
    executed: int
    reused: int
    wall_s: float
    exit_code: int
    judgements: dict[str, Judgement] = field(default_factory=dict)


def source_tree_hash() -> str:
    """Hash of the perfkit package's files: a change in the framework or engine invalidates the cache."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        parts = path.relative_to(root).parts
        if "__pycache__" in parts or any(p.startswith(".") for p in parts) or path.suffix == ".pyc" or not path.is_file():
            continue
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """`K=V` strings to parameters; V is read as YAML so 4096 is an int and 0.5 a float."""
    out = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep or not name.strip():
            raise UserError(f"--param expects NAME=VALUE, got {pair!r}")
        try:
            out[name.strip()] = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError:
            raise UserError(f"--param {name}: cannot read value {text!r}") from None
    return out


def execution_key(notebook_bytes: bytes, params: dict[str, Any], source_hash: str, profile: str | None) -> str:
    digest = hashlib.sha256(notebook_bytes)
    digest.update(json.dumps(params, sort_keys=True, default=str).encode())
    digest.update(source_hash.encode())
    digest.update((profile or "").encode())
    return digest.hexdigest()[:16]


def plan(
    project: Project,
    hypotheses: list[Hypothesis],
    *,
    quick: bool,
    overrides: dict[str, Any],
    source_hash: str,
    profile: str | None,
    note: Callable[[str], None] = print,
) -> tuple[list[Planned], dict[str, list[str]]]:
    """The distinct executions, and for each hypothesis the keys of the executions it reads."""
    declared_cache: dict[str, dict] = {}
    used_overrides: set[str] = set()
    by_key: dict[str, Planned] = {}
    needs: dict[str, list[str]] = {}
    for h in hypotheses:
        path = project.notebooks_dir / h.probe.notebook
        if h.probe.notebook not in declared_cache:
            declared_cache[h.probe.notebook] = notebook_parameters(path)
        declared = declared_cache[h.probe.notebook]
        params = dict(h.probe.params)
        if quick:
            params.update(h.probe.quick)
        for name, value in overrides.items():
            if name in declared:
                problem = check_parameter(name, value, declared)
                if problem:
                    raise UserError(f"--param {name}={value!r}: {problem} ({h.probe.notebook})")
                params[name] = value
                used_overrides.add(name)
        points = [params]
        sweep = h.probe.sweep
        if sweep is not None:
            if sweep.param in overrides:
                note(f"note: {h.id} sweeps {sweep.param}; --param {sweep.param} does not apply to it")
            values = sweep.quick if quick and sweep.quick else sweep.values
            points = [{**params, sweep.param: v} for v in values]
        notebook_bytes = path.read_bytes()
        keys = []
        for point in points:
            key = execution_key(notebook_bytes, point, source_hash, profile)
            if key in by_key:
                existing = by_key[key]
                by_key[key] = Planned(key, existing.notebook, existing.params, existing.hypotheses + (h.id,))
            else:
                by_key[key] = Planned(key, h.probe.notebook, point, (h.id,))
            keys.append(key)
        needs[h.id] = keys
    unused = sorted(set(overrides) - used_overrides)
    if unused:
        raise UserError(f"--param {', '.join(unused)}: no selected probe declares it")
    return list(by_key.values()), needs


def find_cached(project: Project, key: str, current_run: str) -> ExecutionRecord | None:
    """The latest earlier execution with this key that ended well."""
    if not project.runs_dir.is_dir():
        return None
    for run_dir in sorted((p for p in project.runs_dir.iterdir() if p.is_dir()), reverse=True):
        if run_dir.name == current_run:
            continue
        path = run_dir / "executions" / key / "execution.json"
        if path.is_file():
            record = read_execution(path, project.relative(path))
            if record.status == "ok" and record.key == key:
                return record
    return None


def new_run_id(project: Project) -> str:
    """A run id that sorts by time and is claimed atomically (mkdir) against concurrent runs."""
    project.runs_dir.mkdir(parents=True, exist_ok=True)
    base = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    for n in range(1, 1000):
        run_id = base if n == 1 else f"{base}-{n}"
        if (project.results_dir / f"{run_id}.json").exists():
            continue
        try:
            (project.runs_dir / run_id).mkdir()
            return run_id
        except FileExistsError:
            continue
    raise UserError(f"cannot find a free run id under {project.runs_dir}")


def _optional(module: str):
    """A module another part of perfkit provides, or None (with the reason) when it is absent."""
    try:
        return importlib.import_module(module), None
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise
        return None, f"{module} is not available"


def _git(project: Project) -> tuple[str | None, bool | None]:
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=project.root, capture_output=True, text=True, timeout=20)
        status = subprocess.run(["git", "status", "--porcelain"], cwd=project.root, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None, None
    if commit.returncode != 0:
        return None, None
    return commit.stdout.strip(), bool(status.stdout.strip()) if status.returncode == 0 else None


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
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


class _Printer:
    """Progress lines from several worker threads, one line at a time."""

    def __init__(self, out: Callable[[str], None]):
        self.out = out
        self.lock = threading.Lock()

    def __call__(self, text: str) -> None:
        with self.lock:
            self.out(text)


def _execute_one(
    project: Project,
    run_dir: Path,
    run_id: str,
    planned: Planned,
    *,
    timeout_s: float,
    kernel_dir: Path,
    profile: str | None,
    tag: str,
    say: _Printer,
) -> ExecutionRecord:
    exec_dir = run_dir / "executions" / planned.key
    exec_dir.mkdir(parents=True, exist_ok=True)
    source = project.notebooks_dir / planned.notebook
    env = {}
    notebook = source
    if profile == "torch":
        trace = exec_dir / "torch_trace.json"
        env["PERFKIT_TORCH_PROFILE"] = str(trace)
        notebook = _profiled_notebook(source, exec_dir / "input.ipynb", str(trace))
    utilization, why_not = _optional("perfkit.machine.utilization")
    sampler = utilization.Sampler(interval_s=0.25) if utilization else None
    say(f"{tag} start    {planned.label()}")
    if sampler:
        sampler.start()
    try:
        outcome = executor.execute(
            notebook=notebook, output=exec_dir / "executed.ipynb", params=planned.params, cwd=project.notebooks_dir,
            kernel_dir=kernel_dir, timeout_s=timeout_s, env=env,
        )
    finally:
        trace_data = sampler.stop() if sampler else None
    if trace_data is not None:
        write_atomic(exec_dir / "utilization.json", json.dumps(trace_data, indent=1, default=str) + "\n")
        utilization.plot_trace(trace_data, exec_dir / "utilization.png", intervals=list(outcome.cells))
    record = ExecutionRecord(
        key=planned.key, notebook=planned.notebook, params=planned.params, status=outcome.status,
        wall_s=round(outcome.wall_s, 3), run_id=run_id, reason=outcome.reason, cell_index=outcome.cell_index,
        ename=outcome.ename, evalue=outcome.evalue, records=outcome.records,
    )
    write_execution(exec_dir / "execution.json", record)
    if outcome.traceback:
        write_atomic(exec_dir / "traceback.txt", outcome.traceback + "\n")
    ended = "ok" if outcome.status == "ok" else outcome.status.upper()
    detail = f"{len(outcome.records)} records" if outcome.status == "ok" else outcome.reason
    say(f"{tag} finished {planned.label()}  {outcome.wall_s:.1f} s  {ended}: {detail}")
    return record


def _summaries(h: Hypothesis, executions: list[ExecutionRecord]) -> tuple[MetricSummary, ...]:
    names = set(h.expect.metrics())
    if h.expect.kind == "share":
        names |= {STEP, *BREAKDOWN}
    sweep = h.probe.sweep
    out = []
    for point in effective_points(executions, sweep.param if sweep else None):
        record = point.record
        if record.name not in names:
            continue
        samples = list(record.samples)
        mean = low = high = std = None
        if samples and is_clean(samples):
            est = mean_interval(samples, seed=seed_for(record.name))
            mean, low, high, std = est.value, est.low, est.high, summarize(samples).std
        out.append(MetricSummary(name=record.name, unit=record.unit, at=point.at or None, n=len(samples), mean=mean,
                                 low=low, high=high, std=std, note=record.note))
    return tuple(sorted(out, key=lambda m: (m.name, json.dumps(m.at, sort_keys=True, default=str))))


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
    command: str = "",
    out: Callable[[str], None] = print,
) -> RunReport:
    """Execute what the selected hypotheses need, judge them, and write results, plots and ledger."""
    started = time.monotonic()
    if bool(ids) == bool(all_hypotheses):
        raise UserError("name the hypotheses to run, or pass --all (not both)")
    if jobs < 1:
        raise UserError(f"--jobs must be at least 1, got {jobs}")
    if timeout_s <= 0:
        raise UserError(f"--timeout must be positive, got {timeout_s}")
    if profile is not None and profile not in PROFILERS:
        raise UserError(f"--profile: expected one of {', '.join(PROFILERS)}, got {profile!r}")
    hypotheses = load_hypotheses(project, ids or None)
    if not hypotheses:
        raise UserError(f"no hypotheses in {project.relative(project.hypotheses_dir)}")
    say = _Printer(out)
    source_hash = source_tree_hash()
    planned, needs = plan(project, hypotheses, quick=quick, overrides=overrides or {}, source_hash=source_hash,
                          profile=profile, note=say)
    run_id = new_run_id(project)
    run_dir = project.runs_dir / run_id
    created = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    git_commit, git_dirty = _git(project)
    manifest: dict[str, Any] = {
        "format_version": 1, "run_id": run_id, "created": created, "status": "running",
        "command": command or " ".join(sys.argv), "cwd": os.getcwd(), "git": {"commit": git_commit, "dirty": git_dirty},
        "versions": {"python": platform.python_version(), "perfkit": _version("perfkit"), "torch": _version("torch"),
                     "papermill": _version("papermill"), "nbclient": _version("nbclient"), "numpy": _version("numpy")},
        "options": {"quick": quick, "jobs": jobs, "timeout_s": timeout_s, "force": force, "profile": profile,
                    "overrides": overrides or {}, "hypotheses": [h.id for h in hypotheses]},
        "perfkit_source": source_hash,
    }
    write_atomic(run_dir / "manifest.json", dumps(manifest))
    machine, why_not = _optional("perfkit.machine.snapshot")
    manifest["environment"] = machine.snapshot() if machine else {"unavailable": why_not}

    records: dict[str, ExecutionRecord] = {}
    to_run: list[Planned] = []
    for p in planned:
        cached = None if force else find_cached(project, p.key, run_id)
        if cached is None:
            to_run.append(p)
            continue
        origin = cached.cached_from or cached.run_id
        reused = replace(cached, cached_from=origin)
        write_execution(run_dir / "executions" / p.key / "execution.json", reused)
        records[p.key] = reused
    say(f"run {run_id}: {len(hypotheses)} hypotheses, {len(planned)} probe executions "
        f"({len(to_run)} to execute, {len(planned) - len(to_run)} reused){' [quick]' if quick else ''}")
    for p in (x for x in planned if x.key in records):
        r = records[p.key]
        say(f"[reused]  {p.label()}  from run {r.cached_from} ({r.wall_s:.1f} s there)")
    execute_started = time.monotonic()
    if to_run:
        kernel_dir = executor.ensure_kernelspec(run_dir / "jupyter")
        pool = ThreadPoolExecutor(max_workers=jobs)
        try:
            futures = {
                pool.submit(_execute_one, project, run_dir, run_id, p, timeout_s=timeout_s, kernel_dir=kernel_dir,
                            profile=profile, tag=f"[{i + 1}/{len(to_run)}]", say=say): p
                for i, p in enumerate(to_run)
            }
            for future, p in futures.items():
                records[p.key] = future.result()
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            executor.kill_all()
            raise
        pool.shutdown()
    execute_s = time.monotonic() - execute_started

    judged: list[HypothesisResult] = []
    judgements: dict[str, Judgement] = {}
    plots_dir = run_dir / "plots"
    say("")
    for h in hypotheses:
        executions = [records[k] for k in needs[h.id]]
        j = judge(h, executions)
        judgements[h.id] = j
        sweep = h.probe.sweep
        points = effective_points([x for x in executions if x.status == "ok"], sweep.param if sweep else None)
        plots.plot_verdict(h, j, points, plots_dir / f"{h.id}.png", dpi=150)
        plots.plot_verdict(h, j, points, project.plots_dir / f"{h.id}.png", dpi=100)
        judged.append(HypothesisResult(
            id=h.id, hash=h.hash, claim=h.claim, kind=h.expect.kind, expected=j.expected, verdict=j.verdict.value,
            reason=j.reason, measured=j.measured, off_by=j.off_by, floor=j.floor, plot=f"plots/{h.id}.png",
            warnings=j.warnings, metrics=_summaries(h, executions),
            executions=tuple(
                ExecutionRef(key=x.key, notebook=x.notebook, params=x.params, status=x.status,
                             run_id=x.cached_from or x.run_id, cached=x.cached_from is not None, wall_s=x.wall_s)
                for x in executions
            ),
        ))
        say(f"{h.id:<32} {j.verdict.value:<13} {j.line()}")
        for warning in j.warnings:
            say(f"{'':<32}   warning: {warning}")
    results = RunResults(run_id=run_id, created=created, command=manifest["command"], quick=quick,
                         git_commit=git_commit, git_dirty=git_dirty, hypotheses=tuple(judged))
    results_file = write_results(project, results)
    ledger.write(project)
    wall = time.monotonic() - started
    executed = len(to_run)
    manifest.update({
        "status": "finished",
        "executions": [
            {"key": r.key, "notebook": r.notebook, "params": r.params, "status": r.status, "reason": r.reason,
             "wall_s": r.wall_s, "reused_from": r.cached_from}
            for r in (records[p.key] for p in planned)
        ],
        "verdicts": {h.id: judgements[h.id].verdict.value for h in hypotheses},
        "timings": {"total_s": round(wall, 3), "execute_s": round(execute_s, 3)},
    })
    write_atomic(run_dir / "manifest.json", dumps(json.loads(json.dumps(manifest, default=str))))
    counts = {v: sum(1 for j in judgements.values() if j.verdict == v) for v in Verdict}
    say("")
    say(f"run {run_id} finished in {wall:.1f} s: {executed} executed, {len(planned) - executed} reused; "
        + ", ".join(f"{n} {v.value}" for v, n in counts.items() if n))
    say(f"results: {project.relative(results_file)}; ledger: {project.relative(project.ledger_path)}; "
        f"evidence: {project.relative(run_dir)}/")
    exit_code = 1 if counts[Verdict.ERROR] else 0
    return RunReport(run_id=run_id, results=results, executed=executed, reused=len(planned) - executed, wall_s=wall,
                     exit_code=exit_code, judgements=judgements)
