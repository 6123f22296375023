"""Does perfkit decide on the machine you have? Every shipped hypothesis, quick, on a quiet machine, beside a
busy loop on one core, and beside a bursty neighbour (3 s on, 3 s off), in a copy of this repository.

    .venv/bin/python benchmarks/busy_machine.py [--only quiet,busy,bursty] [--keep DIR] [--jobs N|auto]

Each condition runs `perfkit run --all --quick --force` (everything measured afresh, planned from the
committed ledger within the quick budget, as `make run` in a fresh clone does) in its own copy of the
project, with the neighbour started first (pinned to the last CPU) and stopped after.
It prints, per condition: the wall time, the verdicts, how many replicates were unfit and how many verdicts
rest on replicates that load made unfit ("discarded"), the mean foreign load the replicates recorded, and
which verdicts flipped between confirmed and refuted against the quiet run. A benchmark, not a test: the
figures are the machine's, printed side by side from one sitting.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONDITIONS = ("quiet", "busy", "bursty")
LEFT_BEHIND = ("runs", ".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache", "*.egg-info")

NEIGHBOUR = """
import os, sys, time
os.sched_setaffinity(0, [int(sys.argv[1])])
on, off = float(sys.argv[2]), float(sys.argv[3])
while True:
    end = time.monotonic() + on
    while time.monotonic() < end:
        pass
    time.sleep(off)
"""


def neighbour(condition: str) -> subprocess.Popen | None:
    """The foreign load of a condition: nothing, a busy loop, or one 3 s on and 3 s off; on the last CPU."""
    if condition == "quiet":
        return None
    cpu = max(os.sched_getaffinity(0))
    on, off = ("3600", "0") if condition == "busy" else ("3", "3")
    return subprocess.Popen([sys.executable, "-c", NEIGHBOUR, str(cpu), on, off])


def copy_project(into: Path) -> Path:
    """This repository without its runs and environments: what `make run` in a fresh clone measures (the
    committed ledger is there: the run plans its first round from it, within the quick budget)."""
    shutil.copytree(ROOT, into, ignore=shutil.ignore_patterns(*LEFT_BEHIND))
    return into


def measure(condition: str, where: Path, jobs: list[str]) -> dict:
    project = copy_project(where / condition)
    perfkit = Path(sys.executable).with_name("perfkit")
    loader = neighbour(condition)
    started = time.monotonic()
    try:
        done = subprocess.run(
            [str(perfkit), "run", "--all", "--quick", "--force", *jobs], cwd=project, capture_output=True, text=True
        )
    finally:
        if loader is not None:
            loader.kill()
            loader.wait()
    wall = time.monotonic() - started
    (where / f"{condition}.log").write_text(done.stdout + done.stderr)
    return {"wall_s": wall, "rc": done.returncode, **summarize(project)}


def summarize(project: Path) -> dict:
    from perfkit.experiment.records.results import load_all_results
    from perfkit.experiment.records.verdict import UNFIT_REASON
    from perfkit.paths import Project

    runs = load_all_results(Project(project))
    if not runs:
        return {"verdicts": {}, "by_id": {}, "executions": 0, "unfit": 0, "discarded": 0, "load": None}
    run = runs[-1]
    executions = [x for h in run.hypotheses for x in h.executions]
    distinct = {x.id: x for x in executions}.values()
    loads = [x.load["cores"] for x in distinct if x.load]
    verdicts: dict[str, int] = {}
    for h in run.hypotheses:
        verdicts[h.verdict] = verdicts.get(h.verdict, 0) + 1
    return {
        "verdicts": verdicts,
        "by_id": {h.id: h.verdict for h in run.hypotheses},
        "executions": len(distinct),
        "unfit": sum(1 for x in distinct if x.unfit),
        "discarded": sum(1 for h in run.hypotheses if (h.reason or "").startswith(UNFIT_REASON)),
        "load": sum(loads) / len(loads) if loads else None,
        "undecided": sorted(h.id for h in run.hypotheses if h.verdict == "inconclusive"),
    }


def flips(a: dict, b: dict) -> list[str]:
    decided = {"confirmed", "refuted"}
    return sorted(h for h, v in a.items() if v in decided and b.get(h) in decided and b[h] != v)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(CONDITIONS), help="conditions, comma-separated")
    parser.add_argument("--keep", type=Path, help="measure in this folder and keep it (default: a temporary one)")
    parser.add_argument("--jobs", help="perfkit run's --jobs (default: its own, one at a time; N or auto)")
    args = parser.parse_args()
    wanted = [c for c in args.only.split(",") if c]
    unknown = sorted(set(wanted) - set(CONDITIONS))
    if unknown:
        parser.error(f"unknown condition {', '.join(unknown)} (known: {', '.join(CONDITIONS)})")
    jobs = ["--jobs", args.jobs] if args.jobs else []
    where = args.keep or Path(tempfile.mkdtemp(prefix="perfkit-busy-"))
    where.mkdir(parents=True, exist_ok=True)
    print(f"{len(os.sched_getaffinity(0))} CPUs; measuring in {where}", flush=True)
    figures = {}
    for condition in wanted:
        print(f"{condition}: perfkit run --all --quick --force{''.join(' ' + j for j in jobs)} ...", flush=True)
        figures[condition] = measure(condition, where, jobs)
        f = figures[condition]
        print(
            f"{condition}: {f['wall_s']:.0f} s (exit {f['rc']}), {f['executions']} executions, {f['unfit']} unfit, "
            f"{f['discarded']} verdicts on discarded replicates; "
            + ", ".join(f"{n} {v}" for v, n in sorted(f["verdicts"].items()))
            + (f"; mean foreign load {f['load']:.2f} cores" if f["load"] is not None else "")
            + (f"; undecided: {', '.join(f['undecided'])}" if f.get("undecided") else ""),
            flush=True,
        )
    quiet = figures.get("quiet")
    print("\n| machine | wall | confirmed | refuted | inconclusive | error | unfit replicates | flips vs quiet |")
    print("|---|---|---|---|---|---|---|---|")
    for condition, f in figures.items():
        v = f["verdicts"]
        flipped = "-" if quiet is None or condition == "quiet" else str(len(flips(quiet["by_id"], f["by_id"])))
        print(
            f"| {condition} | {f['wall_s'] / 60:.1f} min | {v.get('confirmed', 0)} | {v.get('refuted', 0)} "
            f"| {v.get('inconclusive', 0)} | {v.get('error', 0)} | {f['unfit']} of {f['executions']} | {flipped} |"
        )
    if quiet is not None:
        for condition, f in figures.items():
            for h in flips(quiet["by_id"], f["by_id"]) if condition != "quiet" else []:
                print(f"flip ({condition}): {h}: {quiet['by_id'][h]} quiet, {f['by_id'][h]} {condition}")
    if not args.keep:
        print(f"(logs and projects left in {where})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
