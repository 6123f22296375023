"""The one set of record builders the tests share: hypotheses, executions, metrics, results, runs, the
fixture project, and processes simulated from a known truth.

Each builder fills what a test does not care about with a fixed, valid value, so a test names only
what it is about. `run` starts a real `perfkit run` (perfkit.experiment.run.runner) with RunOptions.
"""

from __future__ import annotations

import math
import shutil
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from perfkit.experiment.records import results
from perfkit.experiment.records.hypothesis import Hypothesis
from perfkit.experiment.records.kinds.base import Expect
from perfkit.experiment.records.probe import Probe, Sweep
from perfkit.experiment.records.results import Execution, Floor, HypothesisResult, Measured, MetricSummary, RunResults
from perfkit.paths import Project
from perfkit.samples import MetricRecord


def hypothesis(expect: Expect, sweep: Sweep | None = None, *, id: str = "h", notebook: str = "p.ipynb") -> Hypothesis:
    """A hypothesis record as loaded, without a file behind it."""
    return Hypothesis(
        id=id,
        claim="c",
        rationale="r",
        expect=expect,
        probe=Probe(notebook=notebook, sweep=sweep),
        tags=(),
        path=Path(f"{id}.yaml"),
        hash="0",
    )


def execution(*records: MetricRecord, **fields: Any) -> Execution:
    """An execution that ended "ok" in run "r" with these records (any field can be given)."""
    base = {"key": "k", "notebook": "p.ipynb", "params": {}, "status": "ok", "wall_s": 1.0, "run_id": "r"}
    return Execution(**(base | fields), records=tuple(records))


def metric(name, mean, *, n=30, unit="ms", spread=0.02, at=None, breakdown=None, seed=0) -> MetricRecord:
    """n samples of `name` around `mean` with a relative spread, the same for the same arguments."""
    rng = np.random.default_rng(seed + zlib.crc32(name.encode()))
    samples = tuple(float(x) for x in mean * (1 + spread * rng.standard_normal(n)))
    return MetricRecord(name=name, unit=unit, samples=samples, at=at, breakdown=breakdown)


def result(hid: str, verdict: str, value: float | None = 1.0, run_id: str = "r1", **fields: Any) -> HypothesisResult:
    """A stored result: `value` ms measured within `width` (default ±10%) by one execution keyed by `run_id`."""
    width = fields.pop("width", 0.1)
    measured = (
        None
        if value is None
        else Measured(label="mean", unit="ms", value=value, low=value * (1 - width), high=value * (1 + width))
    )
    base = {
        "id": hid,
        "hash": "0",
        "claim": f"claim of {hid}",
        "kind": "cost",
        "expected": "≈ 1 ms (×2)",
        "verdict": verdict,
        "reason": None,
        "measured": measured,
        "off_by": None,
        "plot": f"plots/{hid}.png",
        "executions": (Execution(key=run_id, notebook="fixture_probe.ipynb", params={}, status="ok", run_id=run_id),),
    }
    return HypothesisResult(**(base | fields))


def of(h: Hypothesis, verdict: str, value: float | None = 1.0, run_id: str = "r1", **fields: Any) -> HypothesisResult:
    """`result` for a loaded hypothesis: its id, hash, claim and kind."""
    return result(h.id, verdict, value, run_id, hash=h.hash, claim=h.claim, kind=h.expect.kind, **fields)


def run_results(run_id: str, *hypotheses: HypothesisResult, **fields: Any) -> RunResults:
    """A run's results as stored."""
    base = {
        "run_id": run_id,
        "created": "2025-01-01T00:00:00Z",
        "command": "perfkit run",
        "quick": True,
        "git_commit": None,
        "git_dirty": None,
    }
    return RunResults(**(base | fields), hypotheses=tuple(hypotheses))


def store(project: Project, run_id: str, *hypotheses: HypothesisResult, **fields: Any) -> RunResults:
    """Write a run's results file into the project, as a finished run would."""
    stored = run_results(run_id, *hypotheses, **fields)
    results.write_results(project, stored)
    return stored


FIXTURES = Path(__file__).parent / "fixtures" / "project"


def fixture_project(root: Path, *ids: str) -> Project:
    """The fixture project (tests/fixtures/project) at `root`: its notebooks and the hypothesis records
    named (every one when none is)."""
    shutil.copytree(FIXTURES / "notebooks", root / "notebooks")
    if ids:
        (root / "hypotheses").mkdir()
        for hid in ids:
            shutil.copy(FIXTURES / "hypotheses" / f"{hid}.yaml", root / "hypotheses")
    else:
        shutil.copytree(FIXTURES / "hypotheses", root / "hypotheses")
    return Project(root)


def quiet_or_skip(bound_s: float = 60.0, busy_cores: float = 0.3) -> None:
    """For a test of the `alone` group that times the machine itself: wait, at most `bound_s`, for a second
    in which other processes use under `busy_cores` of it; else skip, saying how busy it stayed."""
    import time

    import psutil

    deadline = time.monotonic() + bound_s
    while True:
        busy = sum(psutil.cpu_percent(interval=1.0, percpu=True)) / 100.0
        if busy < busy_cores:
            return
        if time.monotonic() >= deadline:
            pytest.skip(f"the machine was never quiet for a second in {bound_s:g} s ({busy:.2f} cores busy)")


def shared_cores(mp) -> None:
    """What a test of a run's mechanics sets with its MonkeyPatch `mp` for the machine it shares (another test
    runs beside it, as in `make test`): no replicate waiting for its cores to be free (up to 10 s each, in a
    strict project). Load is measured through, as on any shared machine: the fitness judgement stays."""
    from perfkit.experiment.run import schedule

    mp.setattr(schedule.fitness, "wait_for_cores", lambda threads, *, on=None, timeout_s=None: 0.0)


def shared_machine(mp) -> None:
    """`shared_cores`, and a fixed source hash: a test edits no perfkit code, but a suite run beside an edit
    must not see it."""
    from perfkit.experiment.run import runner

    mp.setattr(runner, "source_tree_hash", lambda: "fixed-source")
    shared_cores(mp)


def run(project: Project, *, out=print, **options: Any):
    """`perfkit run` in this process: RunOptions from the keywords (`ids` a list), lines to `out`."""
    from perfkit.experiment.run import runner
    from perfkit.experiment.run.options import RunOptions

    ids = tuple(options.pop("ids", ()))
    return runner.run(project, RunOptions(ids=ids, **options), out=out)


# ---------------------------------------------------------------- simulated processes, of known truth


def process(rng, mean, n=40, *, offset_sd=0.05, rho=0.6, df=4):
    """One kernel process: an offset for the whole process, AR(1) drift and Student-t noise around it."""
    noise = rng.standard_t(df, n) / math.sqrt(df / (df - 2))
    drift = np.empty(n)
    drift[0] = noise[0]
    for i in range(1, n):
        drift[i] = rho * drift[i - 1] + math.sqrt(1 - rho * rho) * noise[i]
    return mean * (1 + rng.normal(0, offset_sd)) * (1 + 0.05 * drift)


def replicates(rng, metrics: dict[str, float], r: int, **shape) -> list[Execution]:
    return [
        execution(
            *(MetricRecord(name=n, unit="ms", samples=tuple(process(rng, m, **shape))) for n, m in metrics.items()),
            replicate=i,
        )
        for i in range(r)
    ]


def sample_results(run_id="20250101-000000") -> RunResults:
    """A run's results with one hypothesis whose every field is set (a floor, a metric with no interval)."""
    return RunResults(
        run_id=run_id,
        created="2025-01-01T00:00:00Z",
        command="perfkit run --all",
        quick=True,
        git_commit="abc",
        git_dirty=False,
        hypotheses=(
            HypothesisResult(
                id="h",
                hash="123",
                claim="c",
                kind="cost",
                expected="≈ 200 ms (×3)",
                verdict="refuted",
                reason=None,
                measured=Measured(label="mean", unit="ms", value=0.18, low=0.16, high=0.21),
                off_by="1,100x below the expected 200 ms",
                floor=Floor(metric="f", value=1.0, unit="ms", note="n", low=0.9, high=1.1, replicates=3),
                plot="plots/h.png",
                warnings=("w",),
                metrics=(
                    MetricSummary(
                        name="m", unit="ms", at={"ctx": 1}, n=3, mean=None, low=None, high=None, std=math.nan
                    ),
                ),
                executions=(
                    Execution(
                        key="k",
                        notebook="p.ipynb",
                        params={"ctx": 1},
                        status="ok",
                        run_id=run_id,
                        reused=False,
                        wall_s=2.5,
                    ),
                ),
            ),
        ),
    )
