"""`perfkit show ID`: one hypothesis's record as written, its standing evidence and its history."""

from __future__ import annotations

from perfkit import units
from perfkit.errors import UserError
from perfkit.experiment.outputs.words import evidence_text, flip_note, measured_text, off_by_text, run_words
from perfkit.experiment.records.history import Entry, attempt, history, standing
from perfkit.experiment.records.hypothesis import Hypothesis, load_hypotheses
from perfkit.experiment.records.results import HypothesisResult, load_all_results
from perfkit.paths import Project


def _found(project: Project, hid: str) -> tuple[Hypothesis | None, list[Entry]]:
    """The record (None when only results know it) and its measurements, oldest first."""
    hypotheses = {h.id: h for h in load_hypotheses(project)}
    entries = history(load_all_results(project))
    if hid not in hypotheses and hid not in entries:
        raise UserError(f"no such hypothesis: {hid} (known: {', '.join(sorted(hypotheses)) or 'none'})")
    return hypotheses.get(hid), entries.get(hid, [])


def describe(project: Project, hid: str) -> str:
    """`perfkit show ID`: the record as written, the latest evidence, and the history."""
    h, runs = _found(project, hid)
    lines: list[str] = []
    if h is not None:
        lines += [f"== {project.relative(h.path)}", h.path.read_text(encoding="utf-8").rstrip(), ""]
    if not runs:
        lines.append("never judged: run `perfkit run " + hid + "`")
        return "\n".join(lines) + "\n"
    lines += _standing(project, h, runs)
    r = standing(runs).result
    lines += _metrics(r) + _per_machine(r) + _executions(r) + _history(runs)
    return "\n".join(lines) + "\n"


def _standing(project: Project, h: Hypothesis | None, runs: list[Entry]) -> list[str]:
    """The standing verdict: what was expected and measured, its floor, warnings, changes and plot."""
    latest = standing(runs)
    r = latest.result
    stale = h is not None and h.hash != r.hash
    tried = runs[-1] if runs[-1] is not latest and attempt(runs[-1]) else None
    lines = [f"== standing verdict (run {latest.run_id}){'  [STALE: the record changed since]' if stale else ''}"]
    if tried:
        lines.append(f"later:    run {tried.run_id} did not measure it ({attempt(tried)}): this verdict stands")
    lines += [
        f"verdict:  {r.verdict}",
        f"expected: {r.expected}",
        f"measured: {measured_text(r) or '—'}",
        f"off by:   {off_by_text(r) or '—'}",
        f"evidence: {evidence_text(r) or '—'}",
    ]
    if r.floor:
        lines.append(
            f"floor:    {r.floor.metric} = {r.floor.text()}"
            + (f" over {r.floor.replicates} replicates" if r.floor.replicates else "")
            + (f" ({r.floor.note})" if r.floor.note else "")
        )
    lines += [f"warning:  {w}" for w in r.warnings]
    if r.changed:
        lines.append(f"changed:  {r.changed}")
    if r.not_reproduced:
        lines.append(f"NOT REPRODUCED: {r.not_reproduced}")
    if r.plot:
        lines.append(f"plot:     {project.relative(project.ledger_dir / r.plot)}")
    return lines


def _metrics(r: HypothesisResult) -> list[str]:
    """Each metric's summary, at the verdict's level."""
    if not r.metrics:
        return []
    level = r.measured.level() if r.measured else "95%"  # the summaries were made at the verdict's level
    lines = ["", f"== evidence (mean [{level} interval], n)"]
    for m in r.metrics:
        where = ", ".join(f"{k}={v}" for k, v in sorted((m.at or {}).items()))
        value = (
            f"{units.format_quantity(m.mean, m.unit)} [{units.format_number(m.low)}, {units.format_number(m.high)}]"
            if m.mean is not None
            else "no usable samples"
        )
        lines.append(
            f"  {m.name}{f' [{where}]' if where else ''}: {value}, n={m.n}" + (f"  ({m.note})" if m.note else "")
        )
    return lines


def _per_machine(r: HypothesisResult) -> list[str]:
    """Each machine's own measurement and verdict, when the replicates ran on several."""
    if not r.per_machine:
        return []
    lines = ["", f"== per machine ({len(r.per_machine)})"]
    for m in r.per_machine:
        said = m.measured.text() if m.measured else (m.reason or "nothing measured")
        lines.append(f"  {m.label} [{m.machine}]: {m.verdict or '—'}, {said}")
    return lines


def _executions(r: HypothesisResult) -> list[str]:
    """Each replicate the verdict read: its parameters, outcome, wall time and where its evidence is."""
    if not r.executions:
        return []
    lines = ["", "== probe executions"]
    for x in r.executions:
        params = " ".join(f"{k}={v}" for k, v in sorted(x.params.items()))
        origin = f"reused from run {x.run_id}" if x.reused else f"run {x.run_id}"
        wall = f"{x.wall_s:.1f} s" if x.wall_s is not None else "not timed"
        where = f" on {x.machine.get('host') or x.machine_id}" if x.machine else ""
        lines.append(
            f"  {x.notebook} {params}: {x.status}, {wall}{where}, {origin} (runs/{x.run_id}/executions/{x.id}/)"
            + (f" UNFIT: {x.unfit}" if x.unfit else "")
        )
    return lines


def _history(runs: list[Entry]) -> list[str]:
    """Every measurement, oldest first, a flip marked."""
    lines, previous = ["", "== history"], None
    for entry in runs:
        flip = flip_note(previous, entry.result.verdict)
        lines.append(
            f"  {entry.run_id}  {entry.result.verdict:<13} {measured_text(entry.result) or entry.result.reason or ''}"
            + (f"  {flip}" if flip else "")
        )
        previous = entry.result.verdict
    return lines


def describe_json(project: Project, hid: str) -> dict:
    """`perfkit show ID --json`: the record's hash and path, the standing result and every measurement."""
    h, runs = _found(project, hid)
    return {
        "id": hid,
        "record": {"path": project.relative(h.path), "hash": h.hash, "claim": h.claim} if h else None,
        "stale": bool(h and runs and standing(runs).result.hash != h.hash),
        "standing": {"run_id": standing(runs).run_id, **standing(runs).result.to_json()} if runs else None,
        "history": [
            {
                "run_id": e.run_id,
                "how": run_words(e.run),
                "verdict": e.result.verdict,
                "measured": measured_text(e.result),
            }
            for e in runs
        ],
    }
