"""Does the ledger stay small and fast as runs pile up? `perfkit ledger` over N synthetic results files.

    .venv/bin/python benchmarks/ledger_scale.py [--runs 100,1000,10000] [--hypotheses 22] [--keep DIR]

Each synthetic run measures every hypothesis afresh (a new execution key each time, so no run is a mere
re-read): a 10 ms truth with run-to-run noise, one hypothesis stepping up 15% two thirds of the way.
For each N it prints the seconds `perfkit ledger` took in a fresh process (reading every results file,
the history, the change points, the plots' check and the write), cold (every file read and validated,
the project's cache of them written: records/readcache.py) and warm (from that cache), the largest
resident memory of any of them so far, and the size of LEDGER.md. A benchmark, not a test: the
figures are this machine's.
"""

from __future__ import annotations

import argparse
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from perfkit.experiment.records.results import Execution, HypothesisResult, RunResults, write_results
from perfkit.experiment.records.verdict import Measured
from perfkit.paths import Project


def _result(hid: str, run_id: str, value: float) -> HypothesisResult:
    half = value * 0.04
    return HypothesisResult(
        id=hid,
        hash="0" * 16,
        claim=f"{hid} takes at most 11 ms",
        kind="at_most",
        expected="≤ 11 ms",
        verdict="confirmed" if value + half < 11 else "refuted" if value - half > 11 else "inconclusive",
        reason=None,
        measured=Measured("mean", "ms", value, value - half, value + half, replicates=3, samples=60),
        off_by=None,
        executions=tuple(
            Execution(
                key=f"{run_id}-{hid}-{r}",
                notebook="probe.ipynb",
                params={"n": 1000},
                status="ok",
                run_id=run_id,
                replicate=r,
            )  # fmt: skip
            for r in range(3)
        ),
    )


def make_project(root: Path, runs: int, hypotheses: int) -> Project:
    (root / "hypotheses").mkdir(parents=True)
    (root / "notebooks").mkdir()
    project = Project(root)
    rng = random.Random(runs)
    ids = [f"claim-{k:02d}" for k in range(hypotheses)]
    for i in range(runs):
        run_id = f"20260101-{i:06d}"  # run ids sort in run order
        step = 1.15 if i >= 2 * runs // 3 else 1.0
        hs = tuple(_result(hid, run_id, 10.0 * (step if k == 0 else 1.0) * (1 + rng.gauss(0, 0.02)))
                   for k, hid in enumerate(ids))  # fmt: skip
        write_results(project, RunResults(run_id, "2026-01-01T00:00:00+00:00", "perfkit run", True, f"{i:040x}",
                                          False, hs, machine="a synthetic machine"))  # fmt: skip
    return project


def _ledger(perfkit: Path, root: Path) -> tuple[float, float]:
    """Seconds `perfkit ledger` took in a fresh process, and its peak resident memory in MB."""
    t0 = time.perf_counter()
    subprocess.run([str(perfkit), "--root", str(root), "ledger"], check=True, stdout=subprocess.DEVNULL)
    took = time.perf_counter() - t0
    return took, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", default="100,1000,10000")
    parser.add_argument("--hypotheses", type=int, default=22)
    parser.add_argument("--keep", default=None, metavar="DIR", help="build the projects here and keep them")
    args = parser.parse_args()
    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="perfkit-ledger-scale-"))
    perfkit = Path(sys.executable).with_name("perfkit")
    print(f"{'runs':>7}  {'files MB':>8}  {'cold s':>7}  {'warm s':>7}  {'peak MB':>7}  {'LEDGER.md kB':>12}")
    for n in [int(x) for x in args.runs.split(",")]:
        root = base / f"runs-{n}"
        project = make_project(root, n, args.hypotheses) if not root.exists() else Project(root)
        size = sum(p.stat().st_size for p in project.results_dir.glob("*.json")) / 1e6
        (project.runs_dir / ".cache" / "results.pickle").unlink(missing_ok=True)
        cold, _ = _ledger(perfkit, root)  # every file read and validated; the cache written
        warm, peak_mb = _ledger(perfkit, root)  # from the cache
        kb = (root / "hypotheses" / "LEDGER.md").stat().st_size / 1e3
        print(f"{n:>7}  {size:>8.1f}  {cold:>7.1f}  {warm:>7.1f}  {peak_mb:>7.0f}  {kb:>12.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
