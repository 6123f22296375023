"""The ledger's history: per hypothesis, its measurements in run order, and the one that stands.

A run that only re-read a stored measurement (every execution reused, the same record and verdict)
is no new measurement. The standing one is the latest *fit* measurement: a run whose replicates were
measured on a busy machine, whose probe failed, that ran under a profiler or whose time budget left the
hypothesis unmeasured is an attempt, kept in
the history ("not measured: ...") but never standing over a fit measurement, never a flip. Every
output (perfkit/experiment/outputs/), `perfkit diff` and the writer read the history through here.
"""

from __future__ import annotations

from dataclasses import dataclass

from perfkit.experiment.records.results import HypothesisResult, RunResults
from perfkit.experiment.records.verdict import NOT_MEASURED, UNFIT_REASON


@dataclass(frozen=True)
class Entry:
    run_id: str
    result: HypothesisResult
    run: RunResults | None = None  # the run it came from: its commit, mode, machine, profiler


def _measurement(result: HypothesisResult) -> tuple:
    """What a result says was measured and concluded (not when, nor how it was reached)."""
    return (
        result.hash,
        result.verdict,
        result.measured,
        tuple(sorted((x.key, x.replicate, x.run_id or "") for x in result.executions)),
    )


def same_measurement(result: HypothesisResult, previous: HypothesisResult | None) -> bool:
    """Whether `result` only re-reads `previous`: every execution reused, the same record and verdict."""
    return (
        previous is not None
        and bool(result.executions)
        and all(x.reused for x in result.executions)
        and _measurement(previous) == _measurement(result)
    )


def history(all_results: list[RunResults]) -> dict[str, list[Entry]]:
    """Per hypothesis id, its measurements in run order (a run that only reused the previous one is no new row)."""
    out: dict[str, list[Entry]] = {}
    for run in sorted(all_results, key=lambda r: r.run_id):
        for result in run.hypotheses:
            runs = out.setdefault(result.id, [])
            if runs and same_measurement(result, runs[-1].result):
                continue
            runs.append(Entry(run.run_id, result, run))
    return {k: out[k] for k in sorted(out)}


def attempt_of(result: HypothesisResult, profile: str | None) -> str | None:
    """Why a result is only an attempt, not a measurement that may stand: 'machine busy', 'the probe
    failed', 'profiled (torch)'; None for a fit measurement."""
    if profile:
        return f"profiled ({profile})"
    if result.verdict == "error":
        return "the probe failed"
    if result.verdict == "inconclusive" and result.measured is None and (result.reason or "").startswith(UNFIT_REASON):
        return "machine busy"
    if result.verdict == "inconclusive" and not result.executions and (result.reason or "").startswith(NOT_MEASURED):
        return "the run's time budget"  # said as "not measured: the run's time budget", as the others are
    return None


def attempt(entry: Entry) -> str | None:
    """`attempt_of` for an entry of the history."""
    return attempt_of(entry.result, entry.run.profile if entry.run else None)


def standing(runs: list[Entry]) -> Entry:
    """The entry the table shows: the latest fit measurement; when there is none, the latest unprofiled
    attempt (an error or a busy machine is then what there is to say), else the latest."""
    fit = [e for e in runs if attempt(e) is None]
    plain = [e for e in runs if not (e.run and e.run.profile)]
    return (fit or plain or runs)[-1]


def before(runs: list[Entry], entry: Entry) -> Entry | None:
    """The fit measurement a new entry is compared with (for a flip): the latest fit one before it."""
    return befores(runs)[runs.index(entry)]


def befores(runs: list[Entry]) -> list[Entry | None]:
    """`before` for every entry, in one pass (a ledger of thousands of runs reads them all)."""
    out: list[Entry | None] = []
    fit: Entry | None = None
    for e in runs:
        out.append(fit)
        if attempt(e) is None:
            fit = e
    return out
