"""Scheduling a run's executions: reuse or execute each replicate, in rounds, retrying busy ones once.

Replicates run in rounds (replicate 0 of every execution, then 1, ...), each round in an order
shuffled with a fixed seed, so drift and background load spread over all executions instead of
landing on one. An execution runs here, `--jobs` at a time, or on a Dask cluster
(perfkit/experiment/run/cluster.py), always from the bytes of the notebook the plan hashed (the run's
copy under runs/<run-id>/probes/, shipped to the cluster), in notebooks/ as its working directory.
Either way it comes back as an `execute.Ended` and is finished the same way: fitness judged from
its utilization trace, its files written, one line printed.
On a shared machine (the default) other processes' load is recorded with each replicate and measured
through; with `fitness = "strict"` a replicate measured on a busy machine is re-run once at the end of the look.
"""

from __future__ import annotations

import json
import queue
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from perfkit.experiment.records.results import Execution, read_execution, write_execution
from perfkit.experiment.run import cluster as remote
from perfkit.experiment.run import execute as executor
from perfkit.experiment.run import executed, profiling, why, windows
from perfkit.experiment.run import warm as warm_replicates
from perfkit.experiment.run.context import RunContext
from perfkit.experiment.run.plan import REPLICATE_PARAM
from perfkit.files import dumps, write_atomic
from perfkit.machine import fitness, utilization
from perfkit.paths import Project


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


def stored_replicates(project: Project, planned: Execution) -> int:
    """How many replicates of this execution's key, from replicate 0 on, earlier runs measured well."""
    count = 0
    while find_cached(project, replace(planned, replicate=count), current_run="") is not None:
        count += 1
    return count


def label(x: Execution) -> str:
    return f"{x.label()} [replicate {x.replicate}]"


def finish(exec_dir: Path, ended: executor.Ended, *, tag: str, ctx: RunContext) -> Execution:
    """After an execution, wherever it ran: fitness from its trace, its files, one line saying how it ended."""
    execution = ended.execution
    if ended.trace is not None:
        window = ended.window()
        execution = replace(
            execution,
            unfit=fitness.unfit(ended.trace, window, ctx.limits),
            load=fitness.load(ended.trace, window, ctx.limits),
        )
        write_atomic(exec_dir / "utilization.json", dumps(json.loads(json.dumps(ended.trace, default=str))))
        utilization.plot_trace(ended.trace, exec_dir / "utilization.png", intervals=list(ended.cells))
    write_execution(exec_dir / "execution.json", execution)
    detail = f"{len(execution.records)} records" if execution.status == "ok" else execution.reason
    status = "ok" if execution.status == "ok" else execution.status.upper()
    if execution.reason == executor.INTERRUPTED:  # not a crash of its own: the run was stopped
        status, detail = "INTERRUPTED", "the run was stopped while it ran"
    on = f" on {execution.host}" if execution.host else ""
    setup = (
        "" if execution.setup_s is None else f" (set-up {execution.setup_s:.1f} s{', warm' if execution.warm else ''})"
    )
    loaded = fitness.load_words([execution.load], count=False)
    ctx.say(
        f"{tag} finished {label(execution)}{on}  {execution.wall_s:.1f} s{setup}  {status}: {detail}"
        + (f"  UNFIT: {execution.unfit}" if execution.unfit else f"  ({loaded})" if loaded else "")
    )
    return execution


def _execute_one(ctx: RunContext, planned: Execution, kernels: Kernels, slots: queue.Queue, *, tag: str) -> Execution:
    """One replicate on this machine, on a slot of CPUs no other execution of the run uses meanwhile."""
    cpus = slots.get()
    try:
        return _on_slot(ctx, planned, kernels, cpus, tag=tag)
    finally:
        slots.put(cpus)


def _threads(ctx: RunContext, planned: Execution) -> int:
    """Decided by the plan, for every replicate."""
    return planned.threads or fitness.threads_for(ctx.options.jobs, strict=ctx.limits.strict)


def _on_slot(ctx: RunContext, planned: Execution, kernels: Kernels, cpus: tuple[int, ...], *, tag: str) -> Execution:
    exec_dir = ctx.run_dir.execution_dir(planned.id)
    exec_dir.mkdir(parents=True, exist_ok=True)
    threads = _threads(ctx, planned)
    template = kernels.live_template(threads, ctx.say)
    kernel_dir = kernels.warm if template is not None else kernels.fresh
    waited = fitness.wait_for_cores(threads, on=cpus) if ctx.limits.strict else 0.0  # shared: measured through
    env = fitness.thread_env(threads)
    profiled = profiling.prepare(ctx.options.profile, ctx.probes[planned.notebook], exec_dir)
    if profiled.kernel_prefix:  # the kernel itself runs under the profiler: a kernelspec of its own
        kernel_dir = executor.ensure_kernelspec(exec_dir / "jupyter", prefix=profiled.kernel_prefix)
    job = executor.Job(
        planned=planned,
        notebook=profiled.notebook,
        exec_dir=exec_dir,
        run_id=ctx.run_dir.run_id,
        cwd=ctx.project.notebooks_dir,
        code_root=ctx.project.code_root,
        kernel_dir=kernel_dir,
        timeout_s=ctx.options.timeout_s,
        env={**env, **(profiled.env or {})},
        extra={REPLICATE_PARAM: planned.replicate} if planned.key in ctx.plan.told else None,
        cpus=cpus,
        template=None if profiled.kernel_prefix else template,
    )
    wait = f", after waiting {waited:.0f} s for free cores" if waited >= 1 else ""
    ctx.say(f"{tag} start    {label(planned)}  ({threads} threads on CPU {fitness.cpu_list(cpus)}{wait})")
    with ctx.windows.window(planned) as instance, heartbeat(ctx, tag, planned, exec_dir):
        if instance is not None:  # its server's processes on this machine: the subject's load, not a stranger's
            job = replace(job, server_pids=windows.local_processes(planned.server["url"], instance["before"]))
        try:
            ended = executor.measure(job)
        except warm_replicates.TemplateFailed as exc:  # it died between the look and the fork: nothing ran yet
            kernels.drop(threads, str(exc), ctx.say)
            ended = executor.measure(replace(job, template=None, kernel_dir=kernels.fresh))
    if instance is not None:  # a window on a server the run did not start: which process it measured
        ended = replace(ended, execution=replace(ended.execution, server_instance=instance))
    return finish(exec_dir, ended, tag=tag, ctx=ctx)


HEARTBEAT_S = 10.0  # a probe running longer says so this often: elapsed, the cell it is in, the run's time left


@contextmanager
def heartbeat(ctx: RunContext, tag: str, planned: Execution, exec_dir: Path, every_s: float = HEARTBEAT_S):
    """While the block runs, every `every_s` one line: how long this execution has run, the cell it is in
    (papermill saves the notebook as each cell starts) and, once some finished, the run's time left."""
    stop = threading.Event()
    started = time.monotonic()

    def beat() -> None:
        while not stop.wait(every_s):
            elapsed = time.monotonic() - started
            cell = _running_cell(exec_dir / "executed.ipynb")
            ctx.say(f"{tag} running  {label(planned)}  {elapsed:.0f} s{cell}{_time_left(ctx)}")

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _running_cell(path: Path) -> str:
    """', in cell 4 (`first line`)' from the notebook papermill is writing ('' until it has started one)."""
    nb = executed.read_notebook(path)  # None when half-written or not there yet: nothing to say this time
    found = executed.last_started_cell(nb) if nb is not None else None
    return f", in {executed.cell_words(*found)}" if found else ""


def _time_left(ctx: RunContext) -> str:
    """'; about 40 s left in the run': the mean time of its executions that ended, over those still to end."""
    walls = [x.wall_s for x in ctx.done.values() if not x.reused and x.wall_s]
    left = sum(1 for x in ctx.plan.replicated() if x.id not in ctx.done)
    if not walls or not left:
        return ""
    seconds = sum(walls) / len(walls) * left / max(1, ctx.options.at_once())
    return f"; about {seconds:.0f} s left in the run ({left} executions)"


def _slots(ctx: RunContext, batch: list[Execution]) -> queue.Queue:
    """One slot of CPUs per execution running at once: `--jobs` of them when each gets its threads' cores."""
    threads = max((_threads(ctx, x) for x in batch), default=1)
    available = fitness.cpus()
    wanted = max(1, min(ctx.options.jobs, len(batch)))
    at_once = fitness.at_once(wanted, threads, len(available))
    if at_once < wanted:
        ctx.say(
            f"--jobs {ctx.options.jobs}: {at_once} at a time, so each execution gets its {threads} threads' "
            f"own cores ({len(available)} CPUs here)"
        )
    slots: queue.Queue = queue.Queue()
    for cpus in fitness.slots(at_once, available):
        slots.put(cpus)
    return slots


@dataclass
class Kernels:
    """Where a round's kernels come from: the kernelspec folders, and the templates warm replicates fork from
    (one per thread count in the round; none with --fresh-processes, a profiler or a failed start)."""

    fresh: Path
    warm: Path
    templates: dict[int, warm_replicates.Template] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def live_template(self, threads: int, say) -> warm_replicates.Template | None:
        """The round's template for `threads`, or None: none was started, or it is gone (killed, crashed);
        a gone one is dropped and said once, and the round's later replicates start as fresh processes."""
        template = self.templates.get(threads)
        if template is not None and (code := template.proc.poll()) is not None:
            self.drop(threads, f"the template exited ({code})", say)
            return None
        return template

    def drop(self, threads: int, why: str, say) -> None:
        with self.lock:
            template = self.templates.pop(threads, None)
        if template is not None:
            say(f"[warm]    {why}: the round's remaining replicates start as fresh processes")
            template.close()

    def close(self) -> None:
        for template in self.templates.values():
            template.close()


def _kernels(ctx: RunContext, batch: list[Execution], name: str) -> Kernels:
    """The round's kernelspecs and, for warm replicates, its templates, started before any replicate runs."""
    kernels = Kernels(
        fresh=executor.ensure_kernelspec(ctx.run_dir.path / "jupyter"),
        warm=executor.ensure_kernelspec(ctx.run_dir.path / "jupyter-warm", warm=True),
    )
    if ctx.options.fresh_processes or ctx.options.profile:
        return kernels
    preload = warm_replicates.preloads([ctx.plan.sources[n] for n in sorted({x.notebook for x in batch})])
    for threads in sorted({_threads(ctx, x) for x in batch}):
        env = executor.child_environment(kernels.warm, ctx.project.code_root, fitness.thread_env(threads))
        try:
            template = warm_replicates.Template(env=env, preload=preload, root=ctx.project.code_root)
        except warm_replicates.TemplateFailed as exc:
            ctx.say(f"[warm]    {name}: {exc}; its replicates start as fresh processes")
            continue
        kernels.templates[threads] = template
        ready = template.ready
        ctx.say(
            f"[warm]    {name}: a template with {len(ready['imported'])} modules imported in {ready['seconds']:.1f} s "
            f"({threads} threads); each of its {len(batch)} replicates is forked from it"
        )
    return kernels


def _round(ctx: RunContext, batch: list[Execution], tags: dict[str, str], done: dict, *, name: str) -> None:
    """Execute one round's executions, `--jobs` at a time (or on the cluster), filling `done` as each ends."""
    if ctx.client is not None:
        _on_cluster(ctx, batch, tags, done)
        return
    executor.allow_executions()
    kernels = _kernels(ctx, batch, name)
    slots = _slots(ctx, batch)
    pool = ThreadPoolExecutor(max_workers=slots.qsize())
    try:
        futures = {pool.submit(_execute_one, ctx, x, kernels, slots, tag=tags[x.id]): x for x in batch}
        for future, x in futures.items():
            done[x.id] = future.result()
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        executor.kill_all()
        raise
    finally:
        kernels.close()
    pool.shutdown()


def _on_cluster(ctx: RunContext, batch: list[Execution], tags: dict[str, str], done: dict) -> None:
    def started(x: Execution, how: str) -> None:
        ctx.say(f"{tags[x.id]} start    {label(x)}  ({how})")

    def ended(x: Execution, got: executor.Ended) -> None:
        exec_dir = ctx.run_dir.execution_dir(x.id)
        exec_dir.mkdir(parents=True, exist_ok=True)
        done[x.id] = finish(exec_dir, got, tag=tags[x.id], ctx=ctx)

    requests = [
        remote.Request(
            planned=x,
            exec_dir=ctx.run_dir.execution_dir(x.id),
            extra={REPLICATE_PARAM: x.replicate} if x.key in ctx.plan.told else None,
            resources=ctx.plan.resources.get(x.key, {}),
        )
        for x in batch
    ]
    if ctx.shipped is None:  # once per run: every round's tasks read the same archive
        ctx.shipped = remote.ship(ctx.client, ctx.project, probes=ctx.plan.sources)
    remote.execute(
        ctx.client,
        remote.Round(
            run_id=ctx.run_dir.run_id, timeout_s=ctx.options.timeout_s, requests=requests, shipped=ctx.shipped
        ),
        started=started,
        ended=ended,
    )


def _reuse(ctx: RunContext, fresh: list[Execution]) -> tuple[list[Execution], list[Execution]]:
    """(to execute, reused): each replicate an earlier run measured with the same key is taken from it."""
    to_run, reused = [], []
    for planned in fresh:
        cached = None if ctx.options.force else find_cached(ctx.project, planned, ctx.run_dir.run_id)
        if cached is None:
            to_run.append(planned)
            continue
        ctx.done[planned.id] = replace(cached, reused=True)
        write_execution(ctx.run_dir.execution_dir(planned.id) / "execution.json", ctx.done[planned.id])
        reused.append(planned)
    return to_run, reused


def _retry_unfit(ctx: RunContext, ran: list[Execution]) -> None:
    """Re-run, once, each replicate measured while the machine was busy; the first attempt's evidence is kept."""
    retry = [x for x in ran if ctx.done[x.id].unfit] if ctx.options.retry_unfit else []
    if not retry:
        return
    ctx.say(f"re-running {len(retry)} replicates measured while the machine was busy")
    for x in retry:
        first_try = ctx.run_dir.execution_dir(x.id)
        first_try.rename(first_try.with_name(first_try.name + "-unfit"))
    again: dict[str, Execution] = {}
    total = len(ran) + len(retry)  # the counter goes on from where the run's executions left it
    tags = {x.id: f"[{len(ran) + i + 1}/{total}]" for i, x in enumerate(retry)}
    _round(ctx, retry, tags, again, name="re-runs")
    for x in retry:
        if again[x.id].status == "ok":
            ctx.done[x.id] = again[x.id]
            continue
        failed = ctx.run_dir.execution_dir(x.id)  # the re-run broke: the first attempt stands, as it was
        failed.rename(failed.with_name(failed.name + "-retry-failed"))
        failed.with_name(failed.name + "-unfit").rename(failed)


def _say_why(ctx: RunContext, to_run: list[Execution]) -> None:
    """One line per execution about to run: what changed since the run that last measured it."""
    if ctx.now is None:
        return
    earlier = why.Earlier(ctx.project, ctx.run_dir.run_id)
    for x in to_run:
        if x.key in ctx.said:  # once per execution, not per replicate (nor per look)
            continue
        ctx.said.add(x.key)
        said, compared = why.reason(earlier, x, ctx.now, forced=ctx.options.force)
        if said == why.NEVER:  # never measured: perhaps an earlier run's budget left it out, and it says so
            readers = sorted(h for h, keys in ctx.plan.needs.items() if x.key in keys)
            left = earlier.left_out(readers)
            if left is not None:
                said = f"run {left[0]} left it out ({left[1]}: {left[2]}); measured now"
        if compared is not None:  # what changed since a run whose evidence is here: for the result's `changed`
            ctx.why[x.key] = (said, compared)
        ctx.say(f"[execute] {x.label()}: {said}")


def execute(ctx: RunContext) -> None:
    """Reuse or execute every replicate of `ctx.plan` not yet in `ctx.done`, filling it as each ends."""
    the_plan = ctx.plan
    fresh = [x for x in the_plan.replicated() if x.id not in ctx.done]  # not had by an earlier look of this run
    to_run, reused = _reuse(ctx, fresh)
    counts = "/".join(str(n) for n in sorted(set(the_plan.replicates.values())))
    ctx.say(
        f"run {ctx.run_dir.run_id}: {len(the_plan.needs)} hypotheses, {len(the_plan.executions)} probe executions x "
        f"{counts} replicates ({len(to_run)} to execute, {len(reused)} reused){' [quick]' if ctx.options.quick else ''}"
    )
    for x in reused:
        origin = ctx.done[x.id]
        ctx.say(f"[reused]  {label(x)}  from run {origin.run_id} ({origin.wall_s:.1f} s there): the same key")
    _say_why(ctx, to_run)
    started = 0
    for r in sorted({x.replicate for x in to_run}):
        batch = [x for x in to_run if x.replicate == r]
        random.Random(r).shuffle(batch)
        tags = {x.id: f"[{started + i + 1}/{len(to_run)}]" for i, x in enumerate(batch)}
        _round(ctx, batch, tags, ctx.done, name=f"replicate {r}")
        started += len(batch)
    _retry_unfit(ctx, to_run)
