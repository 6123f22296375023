"""A run: plan the probe executions, execute (or reuse) them, judge, then write plots, results and ledger.

`run` reads top to bottom as those four steps, each in a module of its own:
plan (plan.py) -> execute (schedule.py) -> judge (judging.py, looking again while the replicate
policy, replicates.py, adds replicates) -> write (write.py). The run's folder and manifest
(rundir.py) are claimed before anything runs and always end "finished", "interrupted" or
"failed", with every execution that had ended by then.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from perfkit.errors import UserError
from perfkit.experiment.records import code, config, replicates
from perfkit.experiment.records.hypothesis import Hypothesis, load_hypotheses
from perfkit.experiment.records.results import RunResults, load_all_results
from perfkit.experiment.records.verdict import Judgement, Verdict
from perfkit.experiment.run import cluster as remote
from perfkit.experiment.run import commit, priors, rundir, schedule, why
from perfkit.experiment.run.context import Printer, RunContext
from perfkit.experiment.run.judging import Evidence, Judged, judged
from perfkit.experiment.run.options import AUTO_JOBS, RunOptions
from perfkit.experiment.run.plan import Basis, environment_key, plan, source_tree_hash
from perfkit.experiment.run.write import Written, say_verdicts, write
from perfkit.machine import devices, fitness, pace, snapshot
from perfkit.paths import Project

__all__ = ["RunOptions", "RunReport", "run"]


@dataclass
class RunReport:
    run_id: str
    results: RunResults
    executed: int
    reused: int
    wall_s: float
    exit_code: int
    judgements: dict[str, Judgement] = field(default_factory=dict)


def run(project: Project, options: RunOptions, *, out: Callable[[str], None] = print, client: Any = None) -> RunReport:
    """Execute what the selected hypotheses need, judge them, and write results, plots and ledger.

    `client`: a Dask client for options.cluster that the caller holds and closes (perfkit bisect
    measures every commit on one cluster); by default the run connects and closes its own."""
    started = time.monotonic()
    settings = config.read(project)
    options = replace(
        options, cluster=options.cluster or settings.cluster, command=options.command or " ".join(sys.argv)
    )
    options.check()
    project.check_confined()
    hypotheses = load_hypotheses(project, list(options.ids) or None)  # a malformed record stops the run here
    if not hypotheses:
        raise UserError(f"no hypotheses in {project.relative(project.hypotheses_dir)}")
    load_all_results(project)  # a committed results file its reader refuses stops the run before any probe runs
    rundir.check_writable(project)
    own = client is None and options.cluster is not None
    if own:
        client = remote.connect(options.cluster)  # unreachable: an error, nothing written
    try:
        return _run(_start(project, options, hypotheses, client, Printer(out), settings), hypotheses, started)
    finally:
        if own:
            remote.close(client)


def _start(
    project: Project,
    options: RunOptions,
    hypotheses: list[Hypothesis],
    client: Any,
    say: Printer,
    settings: config.Settings,
):
    """Plan, then claim the run's folder and write its manifest as "running"."""
    options = _jobs(options, say)
    code_for, limits = code.resolver(project, settings.code), settings.fitness
    policy = replicates.policy(
        quick=options.quick,
        replicates=options.replicates,
        max_replicates=options.max_replicates,
        budget_s=options.budget_s,
    )
    source_hash = source_tree_hash()
    environment = environment_key()
    if client is not None:  # measured elsewhere: never the same measurement as one made here
        environment["cluster"] = options.cluster
        say(f"cluster {options.cluster}: {remote.where(client)}")
    basis = Basis(source_hash, environment, code_for, replicates=policy.first, strict=limits.strict)
    the_plan = plan(project, hypotheses, options, basis, note=say)
    say(_threads_line(options, limits))
    first = _first_round(project, hypotheses, options, policy, the_plan, basis)
    the_plan = first.plan
    for line in first.lines:
        say(line)
    if client is not None:
        remote.check_resources(client, the_plan.resources, {x.key: x.label() for x in the_plan.executions})
    now = why.Now(the_plan.notebooks, the_plan.code, source_hash, environment, options.profile)
    run_dir = rundir.new_run_dir(project)
    ctx = RunContext(project, options, run_dir, policy, the_plan, say, now, limits, client)
    ctx.left_out, ctx.first = dict(first.left_out), first
    ctx.out_of_time.update(first.short)
    ctx.probes = run_dir.freeze_probes(the_plan.sources)  # what every replicate executes: the bytes the keys hashed
    recorded = options.recorded() | {"replicates": policy.first, "hypotheses": [h.id for h in hypotheses]}
    manifest = rundir.manifest(ctx.run_dir, command=options.command, options=recorded, source_hash=source_hash)
    manifest["cache_key"] = environment  # what, besides the notebook and parameters, a reuse must match
    manifest["confidence"] = policy.confidence()  # the first look's; each verdict says its own
    manifest["budget_s"] = policy.budget_s
    manifest["left_out"] = dict(ctx.left_out)  # what the budget left unmeasured: a later run says it measures it
    manifest["notebooks"] = the_plan.notebooks  # with `code` and `code_of`: what a later run compares with
    manifest["code"] = {state.digest: state.to_json() for state in the_plan.code.values()}
    manifest["code_of"] = {key: state.digest for key, state in the_plan.code.items()}
    ctx.run_dir.write_manifest(manifest)
    for killed in rundir.mark_killed_runs(project, by=ctx.run_dir.run_id):
        say(f"run {killed} was killed while running (its process is gone): its manifest now says so")
    manifest["environment"] = snapshot.snapshot(root=project.code_root, import_torch=False)  # the probes import it
    return ctx, manifest


def _jobs(options: RunOptions, say: Printer) -> RunOptions:
    """`--jobs auto` decided once, as the run starts: one execution at a time per core free now (at least
    one), each on a core of its own; a neighbour that takes a core later is measured through."""
    if options.jobs != AUTO_JOBS:
        return options
    cpus = fitness.cpus()
    free = max(1, fitness.free_cores(on=cpus, seconds=0.5))
    say(f"--jobs auto: {free} at a time, one per core free as the run starts ({free} of {len(cpus)} CPUs)")
    return replace(options, jobs=free)


def _threads_line(options: RunOptions, limits: fitness.Limits) -> str:
    """The threads every execution gets and why, said once per run (the count is in every key)."""
    environ = next((f"{n}={os.environ[n]}" for n in fitness.THREAD_VARIABLES if os.environ.get(n)), None)
    threads = options.threads or fitness.threads_for(options.at_once(), strict=limits.strict)
    said = fitness.threads_said(threads, given="--threads" if options.threads else environ, strict=limits.strict)
    how = (
        "strict: a replicate measured while other processes use its cores is unfit"
        if limits.strict
        else "shared: other processes' load is recorded per replicate and measured through "
        '(fitness = "strict" refuses it)'
    )
    return f"threads: {said}, unless a record's probe.threads says its own; fitness {how}"


def _first_round(
    project: Project,
    hypotheses: list[Hypothesis],
    options: RunOptions,
    policy: replicates.Policy,
    the_plan,
    basis: Basis,
) -> priors.FirstRound:
    """The first round planned from the ledger (priors.py): replicates and sample counts, within --budget."""

    def replan(chosen: dict[str, dict[str, int]]):
        return plan(project, hypotheses, options, basis, note=lambda _: None, samples=chosen)

    def reusable(x) -> int:
        return 0 if options.force else schedule.stored_replicates(project, x)

    setting = priors.Setting(
        quick=options.quick,
        warm=not (options.cluster or options.fresh_processes or options.profile),
        fixed=set(options.overrides),
        reusable=reusable,
        replan=replan,
        choose_replicates=options.replicates is None,
        pace_s=pace.pace_s(),  # how fast the machine is today, beside the days the stored costs were measured
    )
    return priors.first_round(hypotheses, the_plan, policy, load_all_results(project), setting)


def judge_all(ctx: RunContext, hypotheses: list[Hypothesis], look: int = 0) -> list[Judged]:
    """Every hypothesis judged from the replicates of the executions it reads, at its look's level (the
    error spent by then, from its replicates at each of its looks); one the budget left out says so."""
    replicated = ctx.plan.replicated()
    out = []
    for h in hypotheses:
        if h.id in ctx.left_out:
            out.append(
                Judged(h, Judgement(Verdict.INCONCLUSIVE, ctx.left_out[h.id], h.expect.expected()), Evidence(()))
            )
            continue
        executions = [ctx.done[x.id] for x in replicated if x.key in ctx.plan.needs[h.id]]
        counts = ctx.looked.setdefault(h.id, [])
        now = max((ctx.plan.replicates[k] for k in ctx.plan.needs[h.id]), default=0)
        if not counts or now > counts[-1]:
            counts.append(now)
        claimed = replace(h, machines="every") if ctx.options.per_machine else h  # its record's hash stays
        out.append(judged(claimed, executions, confidence=ctx.policy.confidence(counts)))
    return out


def _within_budget(ctx: RunContext, grown: dict[str, int]) -> dict[str, int] | None:
    """The growth the time budget affords (all of it without one); None when nothing fits."""
    if ctx.policy.budget_s is None:
        return grown
    seconds = {k: _replicate_s(ctx, k) / max(1, ctx.options.at_once()) for k in grown}
    growing = [x for x in ctx.plan.executions if grown.get(x.key, 0) > ctx.plan.replicates[x.key]]
    left = ctx.policy.budget_s - (time.monotonic() - ctx.started) - priors.RUN_S / 2  # the plots and ledger to come
    added = max((grown[x.key] - ctx.plan.replicates[x.key] for x in growing), default=0)
    left -= added * (ctx.first.template_s if ctx.first is not None else 0.0)  # a warm template per replicate added
    free = {} if ctx.options.force else {x.key: schedule.stored_replicates(ctx.project, x) for x in growing}
    counts, left_out = ctx.policy.afford(grown, ctx.plan.replicates, ctx.plan.needs, seconds, left, free=free)
    for hid in ctx.plan.needs:  # the budget's last word on each: left out now, or afforded after all
        if hid in left_out:
            ctx.out_of_time[hid] = left_out[hid]
        elif any(counts[k] > ctx.plan.replicates[k] for k in ctx.plan.needs[hid]):
            ctx.out_of_time.pop(hid, None)
    if left_out:
        ctx.say(
            f"the time budget ({ctx.policy.budget_s:g} s, {max(0.0, left):.0f} s left) leaves out "
            f"{', '.join(sorted(left_out))}"
        )
    return None if counts == ctx.plan.replicates else counts


def _replicate_s(ctx: RunContext, key: str) -> float:
    """What one more replicate of execution `key` will cost: its replicates' walls in this run, else those
    of the earlier run this one reused them from (a reused replicate cost nothing here, but the next one
    costs what it cost there), else the first round's forecast, else the mean replicate of this run; with
    what a replicate costs beside its own wall time."""
    fresh: dict[str, list[float]] = {}
    reused: dict[str, list[float]] = {}
    for x in ctx.done.values():
        if x.wall_s is not None:
            (reused if x.reused else fresh).setdefault(x.key, []).append(x.wall_s)
    walls = fresh.get(key) or reused.get(key)
    if walls:
        return sum(walls) / len(walls) + priors.REPLICATE_S
    if ctx.first is not None and key in ctx.first.per_replicate_s:
        return ctx.first.per_replicate_s[key]
    every = [w for ws in fresh.values() for w in ws]
    return sum(every) / len(every) + priors.REPLICATE_S if every else 0.0


def _pace(ctx: RunContext) -> float:
    """Seconds the first round took per second forecast (1: as forecast), read as it ends."""
    first = ctx.first
    if first is None:
        return 1.0
    forecast = first.seconds + first.overhead_s - priors.RUN_S  # the round's replicates and its templates
    return (time.monotonic() - ctx.started) / max(forecast, 1e-9)


def _bring_back(ctx: RunContext, pace: float) -> list[str]:
    """Measure at their minimum, after all, the hypotheses the first round left out for want of time, as
    many as the budget still holds once the round ran faster than forecast (its costs were measured on a
    slower day, or before a change made the probes faster), before any measured one grows: each one's
    forecast scaled by the first round's `pace`, the likeliest decisions per second first (one the
    plan says sits on its bound comes last: it once took the time a served hypothesis needed to decide).
    The hypotheses added to the plan."""
    first, budget = ctx.first, ctx.policy.budget_s
    if not budget or first is None or first.whole is None or not ctx.left_out:
        return []
    elapsed = time.monotonic() - ctx.started
    left = budget - elapsed - priors.RUN_S / 2  # the plots and ledger to come
    whole, planned = first.whole, dict(ctx.plan.replicates)

    def cost(hid: str) -> float:
        return pace * sum(whole.replicates[k] * first.per_replicate_s[k] for k in whole.needs[hid] if k not in planned)

    def order(hid: str) -> tuple:
        odds = first.odds.get(hid, 0.0)
        return (odds <= 0, cost(hid) / odds if odds > 0 else cost(hid), hid)

    back = []
    for hid in sorted(ctx.left_out, key=order):
        new = [k for k in whole.needs[hid] if k not in planned]
        more = cost(hid)
        if not back:  # the templates of the rounds the executions brought back add
            more += pace * first.template_s * max((whole.replicates[k] for k in new), default=0)
        if more > left:
            continue
        left -= more
        back.append(hid)
        planned.update({k: whole.replicates[k] for k in new})
    if not back:
        return []
    for hid in back:
        del ctx.left_out[hid]
    ctx.say(
        f"[plan]    the first round took {pace:.2f} s a second forecast and ended at {elapsed:.0f} s: "
        f"measuring after all {', '.join(back)} (at the fewest replicates)"
    )
    ctx.plan = replace(
        ctx.plan,
        executions=tuple(x for x in whole.executions if x.key in planned),
        replicates={x.key: planned[x.key] for x in whole.executions if x.key in planned},
        needs={**ctx.plan.needs, **{hid: whole.needs[hid] for hid in back}},
    )
    return back


def measure_and_judge(ctx: RunContext, hypotheses: list[Hypothesis]) -> list[Judged]:
    """Execute and judge; with the time the first round left, measure what it left out (a hypothesis not
    measured at all is further from a verdict than one measured at its minimum); then look again with more
    replicates while the policy says more would decide and the budget holds them."""
    schedule.execute(ctx)
    items = judge_all(ctx, hypotheses)
    back = _bring_back(ctx, _pace(ctx))
    if back:
        schedule.execute(ctx)
        judged_now = {
            i.hypothesis.id: i for i in judge_all(ctx, [i.hypothesis for i in items if i.hypothesis.id in back])
        }
        items = [judged_now.get(i.hypothesis.id, i) for i in items]
    for look in range(1, ctx.policy.looks):
        grown = ctx.policy.grow(ctx.plan.replicates, ctx.plan.needs, {i.hypothesis.id: i.judgement for i in items})
        grown = _within_budget(ctx, grown) if grown is not None else None
        if grown is None:
            break
        added = [x for x in ctx.plan.executions if grown[x.key] > ctx.plan.replicates[x.key]]
        ctx.plan = replace(ctx.plan, replicates=grown)
        ctx.say(f"undecided: adding replicates ({', '.join(f'{x.label()}: {grown[x.key]}' for x in added)})")
        schedule.execute(ctx)
        judged_now = {i.hypothesis.id: i for i in judge_all(ctx, hypotheses, look)}
        # a verdict an earlier look decided stands at its level; only those that grew are judged again
        items = [judged_now[i.hypothesis.id] if _grew(ctx, i.hypothesis.id, added) else i for i in items]
    return [
        replace(
            i,
            stopped=ctx.left_out.get(i.hypothesis.id)
            or ctx.policy.stopped(
                i.judgement,
                [ctx.plan.replicates[k] for k in ctx.plan.needs[i.hypothesis.id]],
                ctx.out_of_time.get(i.hypothesis.id) if i.judgement.verdict is Verdict.INCONCLUSIVE else None,
            ),
        )
        for i in items
    ]


def _grew(ctx: RunContext, hid: str, added: list) -> bool:
    return any(x.key in ctx.plan.needs[hid] for x in added)


def _run(started_run: tuple[RunContext, dict[str, Any]], hypotheses: list[Hypothesis], started: float) -> RunReport:
    ctx, manifest = started_run
    git = manifest["environment"]["perfkit"]["git"]
    timings: dict[str, float] = {}
    try:
        t0 = time.monotonic()
        items = measure_and_judge(ctx, hypotheses)
        timings["execute_s"] = round(time.monotonic() - t0, 3)
        ctx.say("")
        written = write(ctx, items, git=git, machine=devices.describe())
        say_verdicts(ctx, items, written)
        manifest["status"] = "finished"
        manifest["verdicts"] = {item.hypothesis.id: item.judgement.verdict.value for item in items}
    except KeyboardInterrupt:
        manifest["status"] = "interrupted"
        raise rundir.Interrupted(ctx.run_dir, len(ctx.done), len(ctx.plan.replicated())) from None
    except OSError as exc:
        if exc.errno not in rundir.CANNOT_WRITE:
            raise
        raise _write_failed(ctx, manifest, exc) from None
    finally:
        if manifest["status"] not in ("finished", "failed"):
            manifest["status"] = "interrupted"
        timings["total_s"] = round(time.monotonic() - started, 3)
        ended = [ctx.done[x.id].to_json(with_records=False) for x in ctx.plan.replicated() if x.id in ctx.done]
        manifest["executions"] = ended
        manifest["timings"] = timings
        try:
            ctx.run_dir.write_manifest(manifest)
        except OSError:
            if manifest["status"] != "failed":
                raise
    return _report(ctx, items, written, time.monotonic() - started)


def _write_failed(ctx: RunContext, manifest: dict[str, Any], exc: OSError) -> rundir.WriteFailed:
    """A full disk or a read-only folder mid-run: one line saying what was kept."""
    project = ctx.project
    where = project.relative(Path(exc.filename)) if exc.filename else "a file"
    manifest["status"] = "failed"
    manifest["failed_note"] = f"cannot write {where}: {exc.strerror or exc}"
    ledger_state = (
        "its ledger commit is half-applied: `perfkit ledger` finishes it once the disk takes it"
        if commit.staging_dir(project, ctx.run_dir.run_id) / "journal.json" in commit.pending(project)
        else "nothing was added to the ledger"
    )
    return rundir.WriteFailed(
        f"cannot write {where}: {exc.strerror or exc}; {len(ctx.done)} of {len(ctx.plan.replicated())} probe "
        f"executions had ended, and what they wrote is under {project.relative(ctx.run_dir.path)}/; {ledger_state}"
    )


def _report(ctx: RunContext, items: list[Judged], written: Written, wall: float) -> RunReport:
    project, run_dir = ctx.project, ctx.run_dir
    executed = sum(1 for x in ctx.done.values() if not x.reused)
    judgements = {item.hypothesis.id: item.judgement for item in items}
    counts = {v: sum(1 for j in judgements.values() if j.verdict == v) for v in Verdict}
    ctx.say("")
    ctx.say(
        f"run {run_dir.run_id} finished in {wall:.1f} s: {executed} executed, {len(ctx.done) - executed} reused; "
        + ", ".join(f"{n} {v.value}" for v, n in counts.items() if n)
    )
    if not ctx.options.ledger:  # perfkit check and perfkit bisect: evidence only
        ctx.say(f"the ledger is left as it was (this run only answers); evidence: {project.relative(run_dir.path)}/")
    elif written.path is None:
        ctx.say(
            "nothing new was measured (every execution reused, every verdict as stored): results and ledger "
            f"unchanged; evidence: {project.relative(run_dir.path)}/"
        )
    else:
        ctx.say(
            f"results: {project.relative(written.path)}; ledger: {project.relative(project.ledger_path)}; "
            f"evidence: {project.relative(run_dir.path)}/"
        )
    return RunReport(
        run_id=run_dir.run_id,
        results=written.results,
        executed=executed,
        reused=len(ctx.done) - executed,
        wall_s=wall,
        exit_code=1 if counts[Verdict.ERROR] else 0,
        judgements=judgements,
    )
