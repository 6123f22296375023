"""Plots drawn by older drawing code, drawn again from the runs' own samples: `perfkit ledger` does it.

A plot says which result it shows (its stamp) and which drawing code drew it (plots.drawing). When the
drawing code changed since, the standing result's verdict is judged again from the samples its run kept
under runs/ (the same executions, at the level the run judged it at) and drawn with the stored result's
stamp, so the plot still matches its row; the run's own plot and the ledger's copy are both written.
Where the evidence is not here (another clone, runs/ cleaned), the plot stays as drawn, and that is said.
"""

from __future__ import annotations

from pathlib import Path

from perfkit.errors import RecordError
from perfkit.experiment.records import plots
from perfkit.experiment.records.history import history, standing
from perfkit.experiment.records.hypothesis import Hypothesis, ValidationFailed, load_hypotheses
from perfkit.experiment.records.results import (
    Execution,
    HypothesisResult,
    load_all_results,
    read_execution,
    source_of,
    stamp,
)
from perfkit.experiment.run import judging
from perfkit.paths import Project


def outdated(project: Project, entries: dict | None = None) -> list[tuple[HypothesisResult, str, Path]]:
    """(standing result, its run id, its ledger plot) of every plot whose row it matches but which other
    drawing code drew (or drew before plots said which); `entries`: the history, when read already."""
    out = []
    for runs in (history(load_all_results(project)) if entries is None else entries).values():
        entry = standing(runs)
        if not entry.result.plot:
            continue
        path = project.ledger_dir / entry.result.plot
        if path.is_file() and plots.stamp_of(path) == stamp(entry.result) and plots.drawn_with(path) != plots.drawing():
            out.append((entry.result, entry.run_id, path))
    return out


def _evidence(project: Project, result: HypothesisResult) -> list[Execution] | None:
    """The result's executions with their samples, from runs/ (None: not all of them are here)."""
    found = []
    for x in result.executions:
        path = project.runs_dir / (x.run_id or "") / "executions" / x.id / "execution.json"
        try:
            found.append(read_execution(path))
        except (OSError, RecordError):
            return None
    return found


def redraw(project: Project, entries: dict | None = None) -> list[str]:
    """Each outdated plot drawn again from its run's samples; what could not be is said."""
    try:
        hypotheses: dict[str, Hypothesis] = {h.id: h for h in load_hypotheses(project)}
    except ValidationFailed:
        return []  # `perfkit validate` says what is wrong; the plots wait for records that load
    said = []
    for result, run_id, path in outdated(project, entries):
        h = hypotheses.get(result.id)
        executions = _evidence(project, result) if h is not None and h.hash == result.hash else None
        if executions is None:
            said.append(f"{project.relative(path)} was drawn by older code; its samples are not under runs/ here")
            continue
        level = result.measured.confidence if result.measured and result.measured.confidence else None
        item = judging.judged(h, executions, **({"confidence": level} if level else {}))
        if stamp(judging.to_result(item)) != stamp(result):  # judged otherwise now: the row is not this plot's
            said.append(f"{project.relative(path)} was drawn by older code; judged again it differs from its row")
            continue
        source = source_of(run_id, result.executions)
        png = plots.render(h.id, item.judgement, list(item.points), h.expect.plot, stamp=stamp(result), source=source)
        plots.write_plot(project.runs_dir / run_id / "plots" / f"{h.id}.png", png)
        plots.write_plot(path, plots.scaled(png, plots.LEDGER_DPI / plots.DPI))
        said.append(f"redrew {project.relative(path)} from run {run_id}'s samples (the drawing code changed)")
    return said
