"""Writing what a run judged: plots, then the compact results, plots and LEDGER.md as one commit.

The ledger is a history of measurements, not of runs: a hypothesis whose executions were all
reused and whose verdict is the one already stored gets no new row, and a run that measured
nothing new writes no results file (its evidence and manifest stay under runs/). A profiled
measurement never replaces the ledger's plot of an unprofiled one. Each plot is rendered once;
the ledger's copy is scaled from the run's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from perfkit.experiment.records import history, plots
from perfkit.experiment.records.results import (
    HypothesisResult,
    RunResults,
    checked_text,
    load_all_results,
    results_path,
    source_of,
    stamp_fields,
)
from perfkit.experiment.run import commit, judging
from perfkit.experiment.run.context import RunContext


@dataclass(frozen=True)
class Written:
    """Every result of the run, those new to the ledger, and the results file (None: nothing new)."""

    results: RunResults
    fresh: tuple[HypothesisResult, ...]
    path: Path | None


def _plots(ctx: RunContext, judged: list[judging.Judged]) -> Path:
    """Each verdict's plot under runs/<run-id>/plots/, and its ledger copy staged for the commit."""
    staged = commit.staging_dir(ctx.project, ctx.run_dir.run_id) / "plots"
    for item in judged:
        h = item.hypothesis
        # Ctrl-C acts after this plot: raised inside matplotlib it can land in a weakref callback and vanish
        with commit.signals_deferred():
            j = item.judgement
            stamp = stamp_fields(h.id, h.hash, j.verdict.value, j.measured)
            source = source_of(ctx.run_dir.run_id, item.executions)
            png = plots.render(h.id, j, list(item.points), h.expect.plot, stamp=stamp, source=source)
            plots.write_plot(ctx.run_dir.path / "plots" / f"{h.id}.png", png)
            plots.write_plot(staged / f"{h.id}.png", plots.scaled(png, plots.LEDGER_DPI / plots.DPI))
    return staged


def _manifest_here(project, run_id: str | None) -> bool:
    return bool(run_id) and (project.runs_dir / run_id / "manifest.json").is_file()


def write(ctx: RunContext, judged: list[judging.Judged], *, git: dict, machine: str | None) -> Written:
    """Plots, then results, plots and LEDGER.md committed as one unit (perfkit/experiment/run/commit.py)."""
    project, options = ctx.project, ctx.options
    staged = _plots(ctx, judged)
    with commit.locked(project, ctx.say):
        commit.finish_pending(project)
        earlier = load_all_results(project)  # read under the lock: for "not reproduced" and for the ledger
        standing = {hid: history.standing(runs) for hid, runs in history.history(earlier).items()}
        made, fresh = [], []
        for item in judged:
            result = judging.to_result(item)
            entry = standing.get(result.id)
            previous = entry.result if entry else None
            run_id = entry and entry.run_id
            # what changed, as far as it was compared with the standing measurement's own runs
            theirs = {entry.run_id, *(x.run_id for x in previous.executions)} if entry and previous else set()
            said = [ctx.why[x.key][0] for x in result.executions if x.key in ctx.why and ctx.why[x.key][1] in theirs]
            result = replace(
                result,
                not_reproduced=judging.not_reproduced(result, previous, run_id),
                changed=judging.changed(result, previous, run_id, said, evidence_here=_manifest_here(project, run_id)),
            )
            made.append(result)
            if history.same_measurement(result, previous):
                (staged / f"{result.id}.png").unlink(missing_ok=True)  # the ledger's plot stays the measured one
                continue
            fresh.append(result)
            if history.attempt_of(result, options.profile) and entry is not None and history.attempt(entry) is None:
                # a busy machine, a failed probe or a profiler: the fit measurement's plot stays the ledger's
                (staged / f"{result.id}.png").unlink(missing_ok=True)
        results = RunResults(
            run_id=ctx.run_dir.run_id,
            created=ctx.run_dir.created,
            command=options.command,
            quick=options.quick,
            git_commit=git.get("commit"),
            git_dirty=git.get("dirty"),
            hypotheses=tuple(made),
            profile=options.profile,
            machine=machine,
            pace_s=ctx.first.pace_s if ctx.first is not None else None,
        )
        path = None
        if fresh and options.ledger:
            stored = replace(results, hypotheses=tuple(fresh))
            # what perfkit's own reader would refuse is never committed: every later command would exit 2
            checked_text(stored, project.relative(results_path(project, stored.run_id)))
            path = commit.apply(project, stored, earlier)
    return Written(results, tuple(fresh), path)


def say_verdicts(ctx: RunContext, judged: list[judging.Judged], written: Written) -> None:
    """One line per verdict, its warnings and a not-reproduced note printed with it, not after."""
    for item, result in zip(judged, written.results.hypotheses):
        h, j = item.hypothesis, item.judgement
        same = "" if result in written.fresh else "   (reused: as in the ledger)"
        ctx.say(f"{h.id:<32} {j.verdict.value:<13} {j.line()}{same}")
        for warning in j.warnings:
            ctx.say(f"{'':<32}   warning: {warning}")
        if result.not_reproduced:
            ctx.say(f"{'':<32}   NOT REPRODUCED: {result.not_reproduced}")
        if result.changed and result in written.fresh:
            ctx.say(f"{'':<32}   changed: {result.changed}")
