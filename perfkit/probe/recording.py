"""The probe side: what a notebook calls to record its measurements.

Records live in the executed notebook itself, as display outputs with their own mimetype next to
a readable summary: the runner reads them back from the notebook, and a person running the
notebook in JupyterLab, with no run around it, sees the summary.

(The module is not called `record` so that the package attribute `perfkit.record` stays the
function, whatever was imported first.)
"""

from __future__ import annotations

import math
import os
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


ONCE = "one process:"  # the warning every record of a notebook would repeat
_said: set[str] = set()


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
            if warning.startswith(ONCE):  # true of every record this process makes: said at its first
                if ONCE in _said:
                    continue
                _said.add(ONCE)
                warning += " (said once per notebook: it holds for every record here)"
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


def record_profile_lines(
    lines: Any = None,
    *,
    source: Any = None,
    names: list[str] | None = None,
    at: dict[str, Any] | None = None,
    prefix: str = "",
) -> list[str]:
    """Record what a service's workers' `[perfkit-prof]` lines say; returns the metric names recorded.

    `lines` is either
      - a window, `perfkit.profile_window(source)` (a log path, a `Server`, `"journal:UNIT"`,
        `"docker:CONTAINER"`): each process's calls *in the window*, its last line inside less its
        last line before (n and total exact, mean = total / n), or
      - a list of windows (one per request, say): what follows, once per window, or
      - a string of log text: each process's whole life so far (its latest line); `source=` a log
        file's path or a started server reads its whole log so.
    For each span name (every one seen, or those in `names`) three metrics are recorded:
      - `{prefix}{name}`: one sample per process (per rank) and window, its mean in ms, in rank order;
      - `{prefix}{name}_slowest_rank`: one sample per window, the largest of its processes' means (a
        claim about every rank is a claim about the slowest);
      - `{prefix}{name}_calls`: one sample, the calls counted (all processes, all windows).
    The notes say which processes and how many calls each rests on; p99 is each process's
    cumulative one (a quantile cannot be differenced). A name without lines is a UserError that
    says what was seen.

        with perfkit.profile_window(server) as w:
            drive(server.url)
        perfkit.record_profile_lines(w, names=["prepare_for_verify"], prefix="server_")  # or w.record(...)
    """
    from perfkit.probe import proflines

    lines = _log_text(source) if source is not None else lines
    if isinstance(lines, str) and "\n" not in lines and proflines.PREFIX not in lines and os.path.isfile(lines):
        raise UserError(f"record_profile_lines: {lines!r} is a file's name, not its text: pass source={lines!r}")
    windows = list(lines) if isinstance(lines, list | tuple) else [lines]
    if isinstance(lines, str):
        groups, where = [proflines.latest(proflines.parse(lines))], "the text"
    elif windows and all(callable(getattr(w, "figures", None)) for w in windows):
        groups = [w.figures() for w in windows]
        where = windows[0].describe() + (f" (and {len(windows) - 1} more windows)" if len(windows) > 1 else "")
    else:
        raise UserError(f"record_profile_lines: expected log text or profile_windows, got {type(lines).__name__}")
    everywhere = set.intersection(*(set(g) for g in groups))
    missing = [n for n in names or [] if n not in everywhere]
    if missing or not everywhere:
        raise UserError(_nothing_for(missing, everywhere, where))
    recorded = []
    for name in names if names is not None else sorted(everywhere):
        seen = [getattr(w, "lines", None) for w in windows] if not isinstance(lines, str) else [None]
        recorded += _record_processes([g[name] for g in groups], prefix + name, at, seen)
    return recorded


def _log_text(source: Any) -> str:
    """The whole log of `source`: a file's path, or a server this probe started (its `log_path`)."""
    path = getattr(source, "log_path", source)
    if not isinstance(path, str | os.PathLike) or str(path).startswith(("journal:", "docker:")):
        raise UserError(
            f"record_profile_lines: source={source!r} is read over a window: "
            "`with perfkit.profile_window(source) as w: ...`, then record_profile_lines(w)"
        )
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError as exc:
        raise UserError(f"record_profile_lines: cannot read {path}: {exc.strerror}") from None


def _nothing_for(missing: list[str], found: set[str], where: str) -> str:
    seen = f"names with calls: {', '.join(sorted(found))}" if found else "no call of any name"
    return (
        f"record_profile_lines: no profile lines for {', '.join(missing) or 'any name'} in {where} ({seen}). "
        "A process prints a line every PERFKIT_PROFILE_EVERY calls (default 50); for a window, start the server "
        "with PERFKIT_PROFILE_INTERVAL=1 (a line of every name every second) and open the window with "
        "settle= a bit longer"
    )


def _processes_note(rows: list, window: Any) -> str:
    """Which processes one window's (or the text's) figures rest on: calls each, the slowest, p99."""
    from perfkit.probe import proflines

    many = len({r.origin for r in rows}) > 1
    who = [proflines.label(r, with_origin=many) for r in rows]
    slowest = max(range(len(rows)), key=lambda i: rows[i].mean)
    span = "in the window" if window is not None else "since each process started"
    plural = "processes'" if len(rows) != 1 else "process's"
    note = (
        f"means of {len(rows)} {plural} profile lines ({sum(r.n for r in rows)} calls {span}: "
        + ", ".join(f"{w} {r.n}" for w, r in zip(who, rows, strict=True))
        + f"); slowest {who[slowest]}; p99 worst {max(r.p99 for r in rows):.3g} ms"
        + (" (cumulative since each process started: a quantile cannot be differenced)" if window else "")
    )
    if window is not None:
        counted = {r.key for r in rows}
        idle = sorted({r.process for r in window.inside if r.name == rows[0].name and r.key not in counted})
        note += f"; no call in the window from {', '.join(idle)}" if idle else ""
        note += "".join(f"; {n}" for n in window.notes)
    return note


def _record_processes(groups: list[list], metric: str, at: dict[str, Any] | None, windows: list) -> list[str]:
    """The three records of one name (see record_profile_lines): `groups` holds its rows per window."""
    order = [sorted(rows, key=lambda r: (r.rank is None, r.rank or 0, r.origin, r.pid or 0)) for rows in groups]
    notes = [_processes_note(rows, window) for rows, window in zip(order, windows, strict=True)]
    slowest = [max(rows, key=lambda r: r.mean) for rows in order]
    calls = sum(r.n for rows in order for r in rows)
    span = "since each process started" if windows[0] is None else f"in {len(order)} window" + "s" * (len(order) > 1)
    note = notes[0] if len(notes) == 1 else f"{len(notes)} windows, one sample each; the first: {notes[0]}"
    records = [
        make_record(metric, [r.mean for rows in order for r in rows], unit="ms", at=at, note=note),
        make_record(f"{metric}_slowest_rank", [r.mean for r in slowest], unit="ms", at=at, note=note),
        make_record(f"{metric}_calls", [calls], unit="count", at=at, note=f"calls {span}"),
    ]
    _emit(records, "\n".join(summary_line(r) for r in records))
    return [r["name"] for r in records]
