"""The probe side: what a notebook calls to record its measurements.

Records live in the executed notebook itself, as display outputs with their own mimetype next to
a readable summary: the runner reads them back from the notebook, and a person running the
notebook in JupyterLab, with no run around it, sees the summary.

(The module is not called `record` so that the package attribute `perfkit.record` stays the
function, whatever was imported first.)
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable
from typing import Any

from perfkit import units
from perfkit.errors import UserError
from perfkit.phases import PHASES, STEP, UNATTRIBUTED
from perfkit.samples import FORMAT_VERSION, MAX_SAMPLES, MIMETYPE, decode_samples, encode_samples


def _as_floats(name: str, samples: Any) -> list[float]:
    if hasattr(samples, "tolist"):  # numpy arrays and torch tensors
        samples = samples.tolist()
    if isinstance(samples, (int, float)) and not isinstance(samples, bool):
        samples = [samples]
    if isinstance(samples, (str, bytes)) or not isinstance(samples, Iterable):
        raise UserError(f"record({name!r}): samples must be a list of numbers, got {type(samples).__name__}")
    out = []
    for s in samples:
        if isinstance(s, bool) or not isinstance(s, (int, float)):
            raise UserError(f"record({name!r}): samples must be numbers, got {s!r}")
        out.append(float(s))
    return out


def _check_at(name: str, at: Any) -> dict[str, Any] | None:
    if at is None:
        return None
    if not isinstance(at, dict) or not all(
        isinstance(k, str) and isinstance(v, (str, int, float, bool)) for k, v in at.items()
    ):
        raise UserError(f"record({name!r}): `at` must map names to numbers or strings, got {at!r}")
    return {k: at[k] for k in sorted(at)}


def make_record(
    name: str,
    samples: Any,
    *,
    unit: str,
    at: dict[str, Any] | None = None,
    note: str | None = None,
    breakdown: str | None = None,
) -> dict[str, Any]:
    """The validated JSON payload of one record."""
    if not isinstance(name, str) or not name.strip():
        raise UserError(f"record: name must be a non-empty string, got {name!r}")
    if not units.is_unit(unit):
        raise UserError(f"record({name!r}): unknown unit {unit!r}; known units: {', '.join(units.KNOWN_UNITS)}")
    if note is not None and not isinstance(note, str):
        raise UserError(f"record({name!r}): note must be a string")
    values = _as_floats(name, samples)
    if len(values) > MAX_SAMPLES:
        raise UserError(f"record({name!r}): {len(values):,} samples; a record carries at most {MAX_SAMPLES:,}")
    return {
        "name": name,
        "unit": unit,
        "samples": encode_samples(values),
        "at": _check_at(name, at),
        "note": note,
        "breakdown": breakdown,
    }


def summary_line(payload: dict[str, Any]) -> str:
    """What a person reads under the cell: the metric, its mean and 95% interval, and warnings."""
    from perfkit import stats

    samples = decode_samples(payload["samples"])
    where = ""
    if payload.get("at"):
        where = " [" + ", ".join(f"{k}={v}" for k, v in payload["at"].items()) + "]"
    head = f"perfkit record {payload['name']}{where}: "
    unit = payload["unit"]
    if not samples:
        text = head + "NO SAMPLES (a verdict on this metric will be inconclusive)"
    elif not stats.is_clean(samples):
        bad = sum(1 for s in samples if not math.isfinite(s))
        text = head + f"{bad} of {len(samples)} samples are NaN or infinite (a verdict will be inconclusive)"
    else:
        est = stats.mean_interval(samples)
        s = stats.summarize(samples)
        text = (
            head
            + (
                f"{units.format_quantity(est.value, unit)} "
                f"[{units.format_number(est.low)}, {units.format_number(est.high)}]"
            )
            + f" mean of n={s.n} (min {units.format_number(s.min)}, max {units.format_number(s.max)})"
        )
        for warning in stats.warnings([samples]):
            text += f"\n  warning: {warning}"
    if payload.get("note"):
        text += f"\n  note: {payload['note']}"
    return text


def breakdown_summary(records: list[dict[str, Any]]) -> str:
    """One readable block for a step breakdown: the step, then each part with its share."""
    by_name = {r["name"]: decode_samples(r["samples"]) for r in records}
    step = by_name[STEP]
    lines = [
        summary_line(next(r for r in records if r["name"] == STEP)).replace("perfkit record", "perfkit breakdown", 1)
    ]
    total = sum(step)
    unit = records[0]["unit"]
    for name in [r["name"] for r in records if r["name"] != STEP]:
        values = by_name.get(name, [])
        mean = sum(values) / len(values) if values else math.nan
        share = sum(values) / total if total else math.nan
        lines.append(f"  {name:<20} {units.format_quantity(mean, unit):>12}  {share:6.1%} of step")
    return "\n".join(lines)


def _emit(records: list[dict[str, Any]], text: str) -> None:
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is not None and getattr(shell, "kernel", None) is not None:
        from IPython.display import display

        payload = {"format_version": FORMAT_VERSION, "records": records}
        display({MIMETYPE: payload, "text/plain": text}, raw=True)
    else:
        print(text)


def record(name: str, samples: Any, *, unit: str, at: dict[str, Any] | None = None, note: str | None = None) -> None:
    """Record one metric's samples (e.g. seconds per call from perfkit.bench) in the notebook."""
    payload = make_record(name, samples, unit=unit, at=at, note=note)
    _emit([payload], summary_line(payload))


def record_breakdown(steps: Any, *, unit: str = "ms", at: dict[str, Any] | None = None) -> None:
    """Record a decode-step breakdown: the step, every phase and the unattributed remainder.

    `steps` is `perfkit.probe.spans.capture()`'s `cap.steps()` (one dict of seconds per step) or the
    capture itself. The phases are whatever names the steps hold (any engine's: `schedule`,
    `forward`, ...), the bundled engine's PHASES first in their order, then the others as first
    seen. Samples of all metrics are paired by step index, so a share (phase / step) is computed
    per step. Unattributed time is recorded as its own metric, never given to a phase.
    """
    if hasattr(steps, "steps") and callable(steps.steps):
        steps = steps.steps()
    if not isinstance(steps, list) or not all(isinstance(s, dict) for s in steps):
        raise UserError("record_breakdown: expected capture().steps(), a list of dicts of seconds")
    if units.dimension(unit) != "time":
        raise UserError(f"record_breakdown: unit must be a time unit, got {unit!r}")
    scale = units.factor("s", unit)
    named = dict.fromkeys(k for step in steps for k in step if k not in (STEP, UNATTRIBUTED))
    order = [p for p in PHASES if p in named] + [p for p in named if p not in PHASES]
    if not named:
        order = list(PHASES)  # no phase ran: every phase is 0, the step is all unattributed
    columns: dict[str, list[float]] = {name: [] for name in (STEP, *order, UNATTRIBUTED)}
    for i, step in enumerate(steps):
        if STEP not in step:
            raise UserError(f"record_breakdown: step {i} has no {STEP!r} time: {sorted(step)}")
        total = float(step[STEP])
        phases = {p: float(step.get(p, 0.0)) for p in order}
        rest = float(step[UNATTRIBUTED]) if UNATTRIBUTED in step else total - sum(phases.values())
        columns[STEP].append(total * scale)
        for p in order:
            columns[p].append(phases[p] * scale)
        columns[UNATTRIBUTED].append(rest * scale)
    records = [make_record(name, values, unit=unit, at=at, breakdown=STEP) for name, values in columns.items()]
    _emit(records, breakdown_summary(records))


def record_profile_lines(text: str, *, names: list[str] | None = None, at: dict[str, Any] | None = None) -> list[str]:
    """Record what `[perfkit-prof]` lines in `text` say (a service's workers' logs): the names recorded.

    For each span name (or those in `names`), one sample per process: that process's mean
    duration in ms, from its latest line. A probe that drives a remote engine can so judge what the
    engine's own workers measured; the note says how many processes and calls it rests on.
    """
    from perfkit.probe import proflines

    by_name = proflines.latest(proflines.parse(text))
    wanted = [n for n in by_name if names is None or n in names]
    missing = sorted(set(names or []) - set(by_name))
    if missing:
        raise UserError(f"record_profile_lines: no profile lines for {', '.join(missing)}")
    for name in wanted:
        rows = by_name[name]
        calls = sum(r.n for r in rows)
        note = f"means of {len(rows)} processes' profile lines ({calls} calls); slowest {rows[0].process}"
        record(
            name, [r.mean for r in sorted(rows, key=lambda r: (r.rank or 0, r.pid or 0))], unit="ms", at=at, note=note
        )
    return wanted
