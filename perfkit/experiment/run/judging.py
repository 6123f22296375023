"""From a hypothesis's probe executions to its verdict and the compact result the ledger stores.

The evidence is gathered once per hypothesis (`Evidence`: which replicates ended well on a fit
machine, and their records merged into one Point per metric and place); the verdict, the metric
summaries and the plot all read that one object. `judged` is the one entry point, for a run and
for a notebook judged by hand.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from typing import Any

from perfkit import stats, units
from perfkit.errors import UserError
from perfkit.experiment.records import compare
from perfkit.experiment.records.hypothesis import Hypothesis
from perfkit.experiment.records.results import Execution, HypothesisResult, MetricSummary
from perfkit.experiment.records.verdict import UNFIT_REASON, Inconclusive, Judgement, Point, Verdict
from perfkit.experiment.run import load, machines, windows
from perfkit.samples import MetricRecord


@dataclass(frozen=True)
class Evidence:
    """What a verdict rests on: every replicate, the ones usable, and their records merged."""

    executions: tuple[Execution, ...]  # every replicate of every execution the hypothesis reads
    points: tuple[Point, ...] = ()  # the usable replicates' records, merged (empty when none is usable)
    failed: str | None = None  # why a probe did not end well ("error")
    unfit: str | None = None  # why no replicate can be judged: the machine was busy (strict)
    left_out: str | None = None  # a warning: replicates measured while busy (strict) or that load explains, left out
    problem: str | None = None  # why the records cannot be compared (a unit of another dimension)


@dataclass(frozen=True)
class Judged:
    """One hypothesis judged: the verdict, the evidence it came from, the level it was judged at."""

    hypothesis: Hypothesis
    judgement: Judgement
    evidence: Evidence
    confidence: float = stats.CONFIDENCE
    stopped: str | None = None  # why the run added no more replicates for it

    @property
    def executions(self) -> tuple[Execution, ...]:
        return self.evidence.executions

    @property
    def points(self) -> tuple[Point, ...]:
        return self.evidence.points


def merge_points(executions: list[Execution], sweep_param: str | None) -> list[Point]:
    """The records of the executions, merged over replicates: one Point per metric and `at`.

    The sweep value is added to each record's `at`; samples of later replicates are converted to
    the unit of the first (a unit of another dimension is a UserError: a mistake, not evidence).
    """
    groups: dict[tuple[str, str], list[tuple[Execution, MetricRecord, dict[str, Any]]]] = {}
    for execution in sorted(executions, key=lambda x: (x.replicate, x.key)):
        for record in execution.records:
            at = dict(record.at or {})
            if sweep_param is not None and sweep_param in execution.params:
                at.setdefault(sweep_param, execution.params[sweep_param])
            key = (record.name, json.dumps(at, sort_keys=True, default=str))
            groups.setdefault(key, []).append((execution, record, at))
    points = []
    for entries in groups.values():
        _, first, at = entries[0]
        ran_on = tuple(x.machine_id for x, _, _ in entries)
        points.append(
            Point(
                name=first.name,
                unit=first.unit,
                at=at,
                replicates=tuple(tuple(units.convert(list(r.samples), r.unit, first.unit)) for _, r, _ in entries),
                note=first.note,
                breakdown=first.breakdown,
                records=len(entries),
                duplicated=len(entries) != len({(x.key, x.replicate) for x, _, _ in entries}),
                machines=ran_on if all(ran_on) else None,
            )
        )
    return points


def failure_reason(execution: Execution) -> str:
    return execution.reason or f"{execution.notebook}: {execution.status}"


def gather(executions: list[Execution], sweep_param: str | None) -> Evidence:
    """The evidence in the executions: a failure, a busy machine, or the usable replicates' points."""
    every = tuple(executions)
    failed = [x for x in executions if x.status != "ok"]
    if failed:
        return Evidence(every, failed="; ".join(dict.fromkeys(failure_reason(x) for x in failed)))
    usable, said = list(executions), []
    unfit = [x for x in executions if x.unfit]
    if unfit:
        usable = [x for x in executions if not x.unfit]
        why = f"{unfit[0].unfit} during {len(unfit)} of {len(executions)} replicates"
        keys = {x.key for x in executions}
        if any(sum(1 for x in usable if x.key == k) * 2 < sum(1 for x in executions if x.key == k) for k in keys):
            return Evidence(every, unfit=f"{UNFIT_REASON}: {why}")
        said.append(f"left out {len(unfit)} of {len(executions)} replicates: {why}")
    outliers = load.loaded_outliers(usable)
    if outliers:
        usable = [x for x in usable if all(x is not y for y, _ in outliers)]
        said.append("left out, as the load explains it: " + "; ".join(why for _, why in outliers))
    left_out = "; ".join(said) or None
    try:
        points = tuple(merge_points(usable, sweep_param))
    except UserError as exc:  # a unit mismatch between records is a mistake to fix, not evidence
        return Evidence(every, left_out=left_out, problem=f"cannot compare: {exc}")
    return Evidence(every, points=points, left_out=left_out)


def _measured_through(hypothesis: Hypothesis, evidence: Evidence, confidence: float) -> str:
    """What the unfit replicates say when measured through (strict mode refused them): the interval they
    give and whether it decides, so that the user knows what the shared mode would have said."""
    try:
        sweep = hypothesis.probe.sweep
        points = merge_points(list(evidence.executions), sweep.param if sweep else None)
        through = hypothesis.expect.judge(points, confidence=confidence)
    except (Inconclusive, UserError, ValueError):
        return ""
    if through.measured is None:
        return ""
    decided = through.verdict.value if through.verdict is not Verdict.INCONCLUSIVE else "still undecided"
    more = f" (about {through.needed} replicates at that load would likely decide it)" if through.needed else ""
    return (
        f"; measured through the load, these replicates give {through.measured.text(level=True)}: {decided}{more}; "
        f'fitness = "shared" in [tool.perfkit] (the default) measures through load, or a quieter machine'
    )


def _verdict(hypothesis: Hypothesis, evidence: Evidence, confidence: float) -> Judgement:
    expect = hypothesis.expect
    if evidence.failed:
        return Judgement(verdict=Verdict.ERROR, reason=evidence.failed, expected=expect.expected())
    if not evidence.executions:
        return Judgement(verdict=Verdict.INCONCLUSIVE, reason="the probe was not executed", expected=expect.expected())
    if evidence.unfit:
        busy = "machine busy: " in evidence.unfit  # strict about load (swapping or a throttled GPU is not load)
        reason = evidence.unfit + (_measured_through(hypothesis, evidence, confidence) if busy else "")
        return Judgement(verdict=Verdict.INCONCLUSIVE, reason=reason, expected=expect.expected())
    if evidence.problem:
        return Judgement(verdict=Verdict.ERROR, reason=evidence.problem, expected=expect.expected())
    two_servers, on_servers = windows.judged(list(evidence.executions))
    if two_servers:
        return Judgement(verdict=Verdict.INCONCLUSIVE, reason=two_servers, expected=expect.expected())
    found = machines.machines_of(evidence.executions)
    every = hypothesis.machines == "every" and len(found) > 1
    try:
        judgement = expect.judge(list(evidence.points), confidence=confidence)
        each = machines.level(confidence, len(found), every=every)
        per_machine = tuple(
            machines.judged_on(expect, evidence.points, machine, label, each) for machine, label in found.items()
        )
    except Inconclusive as exc:
        return Judgement(verdict=Verdict.INCONCLUSIVE, reason=str(exc), expected=expect.expected())
    except UserError as exc:  # a record and the expectation in units of different dimensions
        return Judgement(verdict=Verdict.ERROR, reason=f"cannot compare: {exc}", expected=expect.expected())
    if len(found) > 1:
        judgement = machines.over_machines(judgement, per_machine, every)
    said = ([evidence.left_out] if evidence.left_out else []) + on_servers
    if said:
        judgement = replace(judgement, warnings=(*said, *judgement.warnings))
    judgement = _finite(judgement)
    explained = load.may_explain(hypothesis, judgement, evidence.executions)
    return explained if explained is not judgement else load.what_would_decide(judgement, evidence.executions)


def _finite(judgement: Judgement) -> Judgement:
    """The judgement, or 'inconclusive' when its estimate or floor is not a finite number (no measurement)."""
    m, f = judgement.measured, judgement.floor
    figures = {}
    if m is not None:
        figures |= {"value": m.value, "low": m.low, "high": m.high}
    if f is not None:
        figures |= {"floor": f.value, "floor low": f.low, "floor high": f.high}
    bad = [f"{k} {v}" for k, v in figures.items() if v is not None and not math.isfinite(v)]
    if not bad:
        return judgement
    what = f"{m.label} " if m is not None else ""
    return replace(
        judgement,
        verdict=Verdict.INCONCLUSIVE,
        reason=f"the measurement is not finite: {what}{', '.join(bad)} (an overflow or a broken sample?)",
        measured=None,
        off_by=None,
        floor=None,
    )


def judged(hypothesis: Hypothesis, executions: list[Execution], *, confidence: float = stats.CONFIDENCE) -> Judged:
    """The hypothesis judged from the executions (every replicate) of its probe, at `confidence`."""
    sweep = hypothesis.probe.sweep
    evidence = gather(list(executions), sweep.param if sweep else None)
    return Judged(hypothesis, _verdict(hypothesis, evidence, confidence), evidence, confidence)


def judge(hypothesis: Hypothesis, executions: list[Execution], *, confidence: float = stats.CONFIDENCE) -> Judgement:
    """The verdict alone (see `judged`)."""
    return judged(hypothesis, executions, confidence=confidence).judgement


def summaries(item: Judged) -> tuple[MetricSummary, ...]:
    """Mean and interval (at the verdict's level) of each metric the claim reads, wherever it was recorded."""
    names = set(item.hypothesis.expect.summarized())
    out = []
    for point in item.points:
        if point.name not in names:
            continue
        values = point.samples()
        mean = low = high = std = between = None
        if values and stats.is_clean(values):
            est = stats.mean_estimate(point.replicates, confidence=item.confidence, machines=point.machines)
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


SAME_KEYS = "the same probe, parameters, code under test, packages, perfkit, environment and machine"


def not_reproduced(result: HypothesisResult, previous: HypothesisResult | None, previous_run: str) -> str | None:
    """What the last verdict measured, when nothing perfkit can see changed since (the record, and every
    execution's key: probe, parameters, code under test, packages, environment, machine) and yet the two
    intervals are disjoint; else None."""
    if previous is None or previous.hash != result.hash or not (previous.measured and result.measured):
        return None
    if {x.key for x in previous.executions} != {x.key for x in result.executions}:
        return None
    now, then = result.measured, previous.measured
    if now.low <= then.high and then.low <= now.high:
        return None
    if machines.ids(previous) != machines.ids(result):  # another machine of the same kind
        return machines.beyond_the_pool(previous, result, previous_run)
    return f"run {previous_run} measured {then.text()} with {SAME_KEYS} (equal execution keys)"


def changed(
    result: HypothesisResult,
    previous: HypothesisResult | None,
    previous_run: str,
    said: list[str],
    *,
    evidence_here: bool = True,
) -> str | None:
    """What changed since the standing measurement when the executions' keys differ, and how far it moved.

    `said` holds why each execution ran again (perfkit/experiment/run/why.py); `evidence_here`, whether the
    standing run's manifest is under runs/ here. None when the keys are the same (then `not_reproduced`
    speaks) or there is nothing to compare with.
    """
    if previous is None or not previous.executions or not result.executions:
        return None
    moved = machines.machine_change(result, previous)
    if {x.key for x in previous.executions} == {x.key for x in result.executions}:
        if moved is None or not (previous.measured and result.measured):
            return moved
        return f"{moved}: {compare.moved_from(previous, result)}"
    said = [*said, moved] if moved else said
    threads = _threads(previous), _threads(result)
    if not said and threads[0] != threads[1] and None not in threads:
        said = [f"threads {threads[0]} -> {threads[1]}"]  # what the stored executions themselves say
    unnamed = (
        "in a part that neither the stored results nor its manifest under runs/ name"
        if evidence_here
        else "(its evidence is not under runs/ here, so what changed cannot be named)"
    )
    what = "; ".join(dict.fromkeys(said)) or f"measured with other execution keys than run {previous_run}, {unnamed}"
    if previous.hash != result.hash:
        what = f"the hypothesis was edited; {what}"
    if not (previous.measured and result.measured):
        return what
    then = previous.measured.text(level=True)
    floor = compare.floor_move(previous, result)
    what += f"; the expectation moved: {floor}" if floor else ""
    if not compare.comparable(previous.measured, result.measured):
        return f"{what}; now measured as another quantity (was {then})"
    return f"{what}: {compare.moved_from(previous, result)}"


def _threads(result: HypothesisResult) -> str | None:
    """The CPU threads its executions ran with ('2', or '1, 2' when they differ); None when not recorded."""
    counts = sorted({x.threads for x in result.executions if x.threads is not None})
    return ", ".join(map(str, counts)) if counts else None


def to_result(item: Judged) -> HypothesisResult:
    """The compact record the ledger stores: the verdict, its summaries, the executions without samples."""
    h, j = item.hypothesis, item.judgement
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
        metrics=summaries(item),
        stopped=item.stopped,
        executions=tuple(replace(x, records=()) for x in item.executions),
        per_machine=j.per_machine,
    )
