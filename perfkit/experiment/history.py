"""The ledger's history: per hypothesis, its measurements in run order, and the one that stands.

A run that only re-read a stored measurement (every execution reused, the same record and verdict)
is no new measurement; the standing one is the latest unprofiled measurement. Every output
(perfkit/experiment/outputs/), `perfkit diff` and the writer read the history through here.
"""

from __future__ import annotations

from dataclasses import dataclass

from perfkit.experiment.results import HypothesisResult, RunResults


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


def standing(runs: list[Entry]) -> Entry:
    """The entry the table shows: the latest unprofiled measurement (a profiled one only if none is)."""
    plain = [e for e in runs if not (e.run and e.run.profile)]
    return (plain or runs)[-1]
