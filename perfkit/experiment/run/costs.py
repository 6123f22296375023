"""`perfkit overhead`: what perfkit itself costs, measured side by side in one run.

Without options, what a span or `@timed` costs per call (perfkit/machine/overhead.py). With
`--replicates N`, first what a replicate costs before its first measuring cell, warm (forked from its
round's template, perfkit/experiment/run/warm.py) and fresh (`--fresh-processes`), on a probe that imports
what the shipped ones do (torch when installed, numpy, matplotlib, perfkit): N real runs of each,
alternating, in a project made for the purpose in a temporary folder; then the span table.
"""

from __future__ import annotations

import argparse
import re
import statistics
import tempfile
from pathlib import Path

from perfkit.machine import overhead

PROBE = """import importlib.util
import numpy as np
import matplotlib.pyplot as plt
import perfkit
if importlib.util.find_spec("torch") is not None:
    import torch
perfkit.record("work", [float(np.sum(np.arange(1000)))] * 5, unit="count")
"""

HYPOTHESIS = """id: replicate-cost
claim: A probe that only imports costs nothing to measure.
rationale: It records a constant; what a replicate costs before it is all set-up.
expect: {kind: at_least, metric: work, value: 1, unit: count}
probe: {notebook: costs.ipynb}
"""


def _project(root: Path):
    import nbformat

    from perfkit.experiment.run.scaffold import probe_notebook
    from perfkit.paths import Project

    (root / "hypotheses").mkdir(parents=True)
    (root / "notebooks").mkdir()
    nbformat.write(probe_notebook("replicate: int = 0", PROBE), str(root / "notebooks" / "costs.ipynb"))
    (root / "hypotheses" / "replicate-cost.yaml").write_text(HYPOTHESIS, encoding="utf-8")
    return Project(root)


def measure(rounds: int) -> dict[str, list[float]]:
    """Seconds per replicate: set-up and wall, warm and fresh, and each warm round's template."""
    from perfkit.experiment.run import runner
    from perfkit.experiment.run.options import RunOptions

    out: dict[str, list[float]] = {k: [] for k in ("warm", "fresh", "warm_wall", "fresh_wall", "template")}
    with tempfile.TemporaryDirectory(prefix="perfkit-costs-") as tmp:
        project = _project(Path(tmp))
        for round_ in range(rounds):
            # alternating, and which goes first too: drift on a busy machine, and the first run's cold file
            # cache (torch read from disk), hit both ways alike
            for how in ("warm", "fresh") if round_ % 2 == 0 else ("fresh", "warm"):
                lines: list[str] = []
                options = RunOptions(
                    ids=("replicate-cost",), quick=True, replicates=1, budget_s=0, force=True, ledger=False,
                    fresh_processes=how == "fresh", retry_unfit=False,
                )  # fmt: skip
                report = runner.run(project, options, out=lines.append)
                for x in (x for h in report.results.hypotheses for x in h.executions):
                    if x.setup_s is not None:  # filed by what it was: a warm one that fell back ran fresh
                        ran = "warm" if x.warm else "fresh"
                        out[ran].append(x.setup_s)
                        out[f"{ran}_wall"].append(x.wall_s)
                for line in lines:
                    found = re.search(r"a template with \d+ modules imported in ([0-9.]+) s", line)
                    if found:
                        out["template"].append(float(found.group(1)))
    return out


def report(found: dict[str, list[float]]) -> str:
    def shown(values: list[float]) -> str:
        if not values:
            return "   n/a"
        return f"{statistics.median(values):6.2f} s [{min(values):.2f}, {max(values):.2f}]"

    lines = [
        f"{'a replicate, before its first measuring cell':<48} {'median [min, max]':>26}",
        f"{'warm: forked from its round template':<48} {shown(found['warm']):>26}",
        f"{'fresh: executor and kernel started anew':<48} {shown(found['fresh']):>26}",
        f"{'the round template (once per round, shared)':<48} {shown(found['template']):>26}",
        f"{'whole replicate, warm':<48} {shown(found['warm_wall']):>26}",
        f"{'whole replicate, fresh':<48} {shown(found['fresh_wall']):>26}",
    ]
    if found["warm"] and found["fresh"]:
        lines.append(
            f"fresh / warm set-up: {statistics.median(found['fresh']) / statistics.median(found['warm']):.1f}x "
            f"({len(found['warm'])} replicates each)"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="perfkit overhead", add_help=False)
    parser.add_argument("--replicates", type=int, default=0, metavar="N")
    known, rest = parser.parse_known_args(argv)
    if "-h" in rest or "--help" in rest:
        print(__doc__.strip().splitlines()[0])
        print("  --replicates N   first, what a replicate costs before it measures, warm and fresh (N runs each)")
        return overhead.main(rest)
    if known.replicates < 0:
        parser.error("--replicates must be 0 or more")
    if known.replicates:
        print(report(measure(known.replicates)))
        print()
    return overhead.main(rest)
