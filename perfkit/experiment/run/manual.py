"""`perfkit judge NOTEBOOK`: verdicts from a probe notebook someone executed by hand.

A notebook run with papermill, nbconvert or JupyterLab (and saved) carries its records in its
outputs. This judges them against the hypotheses that name the notebook (or the one asked for),
with the same judging as a run. The verdicts are printed, clearly marked as not produced by a
run, and never stored: one hand-run process is one replicate, so it is a first look, not
evidence for the ledger. When a utilization trace lies beside the notebook (a run's executed
notebook in runs/<run-id>/executions/.../, with its utilization.json), the machine's fitness is
judged from it over the cells' time, as a run judges it; otherwise the verdict says it was not.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from perfkit.errors import UserError
from perfkit.experiment.records.hypothesis import Hypothesis, load_hypotheses
from perfkit.experiment.records.notebooks import COMPUTED, literal_default, notebook_parameters
from perfkit.experiment.records.results import Execution
from perfkit.experiment.records.verdict import UNFIT_REASON, Judgement, Verdict
from perfkit.experiment.run.executed import read_notebook, records_in
from perfkit.experiment.run.judging import judge
from perfkit.paths import Project

#: Parameters that say only how many samples a probe takes, not what it measures: a notebook run with
#: other counts than the record's (JupyterLab's Run All uses the defaults) is judged, saying so.
SAMPLE_COUNTS = ("repeat", "repeats", "pairs", "samples", "warmup", "iterations", "min_samples", "max_samples")


@dataclass(frozen=True)
class HandJudged:
    hypothesis: Hypothesis
    judgement: Judgement
    differs: dict[str, tuple[Any, Any]]  # parameter -> (the record's value, the notebook's)


def probe_name(nb, path: Path) -> str:
    """The probe a notebook was executed from: papermill's input path, else the file's own name."""
    source = nb.metadata.get("papermill", {}).get("input_path")
    return Path(source).name if source else path.name


def _parameters(nb, probe: Path) -> dict[str, Any]:
    """The parameters it ran with: the probe's defaults, overridden by those papermill says it injected."""
    declared = notebook_parameters(probe) if probe.is_file() else {}
    ran: dict[str, Any] = {}
    for name, description in (declared if isinstance(declared, dict) else {}).items():
        value = literal_default(description.get("default"))
        if value is not COMPUTED:  # a default computed at run time is unknown here
            ran[name] = value
    return ran | dict(nb.metadata.get("papermill", {}).get("parameters") or {})


def fitness_of(project: Project, path: Path, nb) -> tuple[str, str | None, dict | None]:
    """(what was judged of the machine, why it was unfit or None, the foreign load it ran under) from the
    trace beside the notebook."""
    import json

    from perfkit.experiment.records import config
    from perfkit.experiment.run.executed import cell_times
    from perfkit.machine import fitness

    beside = path.parent / "utilization.json"
    if not beside.is_file():
        return f"the machine's fitness not judged (no utilization.json beside {path.name})", None, None
    try:
        trace = json.loads(beside.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"{beside}: not a utilization trace ({exc})") from None
    cells = cell_times(nb)
    window = (min(c[1] for c in cells), max(c[2] for c in cells)) if cells else None
    limits = config.read(project).fitness
    why, load = fitness.unfit(trace, window, limits), fitness.load(trace, window, limits)
    if why:
        return f"the machine was not fit ({why}; {beside})", why, load
    busy = fitness.load_words([load], count=False)
    return f"the machine was fit ({busy + ', measured through; ' if busy else ''}{beside})", None, load


def judge_notebook(project: Project, path: Path, ids: list[str] | None = None) -> tuple[str, list[HandJudged], str]:
    """(the probe's name, the verdict of each hypothesis that reads it, what was judged of the machine)."""
    try:
        nb = read_notebook(path)
    except Exception as exc:  # nbformat's own: JSON of another shape ({}, []) it cannot convert or read
        raise UserError(f"{path}: not a readable notebook ({type(exc).__name__}: {str(exc)[:120]})") from None
    if nb is None:
        raise UserError(f"{path}: {'not a readable notebook' if path.is_file() else 'no such file'}")
    name = probe_name(nb, path)
    hypotheses = load_hypotheses(project, ids or None)
    chosen = hypotheses if ids else [h for h in hypotheses if Path(h.probe.notebook).name == name]
    if not chosen:
        raise UserError(f"no hypothesis names {name}; pass --hypothesis ID to judge it against one")
    records = tuple(records_in(nb, str(path)))
    if not records:
        raise UserError(f"{path}: no perfkit records in its outputs (was it executed and saved?)")
    params = _parameters(nb, project.notebooks_dir / name)
    machine, unfit, load = fitness_of(project, path, nb)
    out = []
    for h in chosen:
        full, quick = dict(h.probe.params), {**h.probe.params, **h.probe.quick}
        differs = min(
            (
                {k: (v, params[k]) for k, v in wanted.items() if k in params and params[k] != v}
                for wanted in (full, quick)
            ),
            key=len,
        )
        execution = Execution(
            key="by-hand",
            notebook=name,
            params={**full, **params},
            status="ok",
            records=records,
            run_id=None,
            load=load,
        )
        judgement = judge(h, [execution])
        if unfit and judgement.verdict is not Verdict.ERROR:  # measured on a busy machine: not evidence
            judgement = replace(judgement, verdict=Verdict.INCONCLUSIVE, off_by=None, reason=f"{UNFIT_REASON}: {unfit}")
        ran = ", ".join(f"{k}={v[1]!r}" for k, v in differs.items())
        asked = ", ".join(f"{k}={v[0]!r}" for k, v in differs.items())
        if differs and all(k in SAMPLE_COUNTS for k in differs):  # the same experiment, more or fewer samples
            note = f"sample counts differ from the record's ({ran}; it asks {asked}): judged on the samples taken"
            judgement = replace(judgement, warnings=(note, *judgement.warnings))
        elif differs:  # another experiment than the one the claim names: no verdict on the claim
            judgement = replace(
                judgement,
                verdict=Verdict.INCONCLUSIVE,
                off_by=None,
                reason=f"the notebook ran with {ran}; the record asks {asked} (full or quick)",
            )
        out.append(HandJudged(h, judgement, differs))
    return name, out, machine
