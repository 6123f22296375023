"""Issue 47: change points over a series of runs, against known truth and against Apache Otava; the
examples of docs/history.md, run as written.

The series are simulated runs of known truth: each run's estimate carries the run's own offset (its
processes, the machine that day: heavy-tailed, autocorrelated from one run to the next), some drift
slowly, one run is an outlier; one hypothesis has a 15% step at a known run, the others none.
"""

from __future__ import annotations

import html
import math
import random

import numpy as np
import pytest
from records import result, store

from perfkit import changepoints
from perfkit.cli import main
from perfkit.experiment.records import series
from perfkit.experiment.records.results import RunResults
from perfkit.paths import Project


def otava_series(seed: int) -> list[float]:
    """Series of known shapes (steps up and down, an outlier, heavy tails, autocorrelation, drift, none),
    from Python's own generator: the same values where Otava computed its answer."""
    rng = random.Random(seed)
    shape = seed % 6
    n = 60 + (seed * 37) % 140
    out, level, prev = [], 100.0, 0.0
    steps = {int(n * f): s for f, s in [(0.3, 1.15), (0.7, 0.9)][: 1 + seed % 2]}
    for i in range(n):
        if shape != 5 and i in steps:
            level *= steps[i]
        noise = rng.gauss(0, 2.0)
        if shape == 2:
            noise = rng.gauss(0, 2.0) / max(0.2, abs(rng.gauss(0, 1)))  # heavy tails
        if shape == 3:
            prev = 0.7 * prev + noise
            noise = prev
        value = level + noise + (0.05 * i if shape == 4 else 0.0)
        if shape == 1 and i == n // 2:
            value += 40.0
        out.append(round(value, 6))
    return out


#: apache-otava 0.8.0, `otava.analysis.compute_change_points(otava_series(seed))` (its defaults: window 50,
#: max_pvalue 0.001), run in a separate environment (its pins, numpy 2.2 and scipy < 1.17, are not perfkit's)
OTAVA = {0: [18], 1: [29, 48, 49, 67], 2: [39], 3: [15, 51, 119, 137], 4: [20, 44], 5: [], 6: [42], 7: [53, 125],
         8: [21], 9: [18, 23, 33, 46, 69, 79, 96, 103], 10: [45, 56], 11: [], 12: [25], 13: [36, 84], 14: [47],
         15: [58, 87, 104, 133, 136, 165, 175], 16: [27], 17: [], 18: [49], 19: [18, 44], 20: [30],
         21: [29, 32, 41, 75, 95, 123], 22: [31, 52, 104, 161], 23: [], 24: [32], 25: [43, 101], 26: [51, 54, 142],
         27: [4, 17, 23, 55, 70], 28: [34, 67], 29: [], 30: [57], 31: [26, 60], 32: [37], 33: [14, 28, 48, 57, 111],
         34: [51, 59, 70, 115, 165], 35: [], 36: [39], 37: [50, 118, 122], 38: [19],
         39: [17, 23, 30, 72, 79, 94, 101]}  # fmt: skip


def _each_significant(values: list[float], indices: list[int]) -> bool:
    """Whether every change point passes the t-test between the segments beside it in the final set."""
    x = np.asarray(values)
    edges = [0, *indices, x.size]
    return all(
        changepoints._segments_test(x[edges[k] : edges[k + 1]], x[edges[k + 1] : edges[k + 2]])[0]
        <= changepoints.CHANGE_PVALUE
        for k in range(len(indices))
    )


def test_the_change_points_are_otavas_on_the_same_series_but_where_its_merge_keeps_a_stale_test():
    """The same split (E-divisive in windows of 50) and merge. Where the two differ, Otava 0.8.0 retests
    the two change points right of a dropped one, not its left neighbour, whose right segment grew: it
    then keeps a point that fails the test between its final neighbours, or drops one that passes."""
    differ = []
    for seed, expected in OTAVA.items():
        values = otava_series(seed)
        found = [c.index for c in changepoints.change_points(values)]
        assert _each_significant(values, found), seed
        if found != expected:
            differ.append(seed)
            assert not _each_significant(values, expected) or set(found) > set(expected), (seed, found, expected)
    assert len(differ) <= 4, differ  # 21, 26, 27 of these 40


def _run_estimates(rng: np.random.Generator, n: int, *, step_at: int | None, step: float = 1.15,
                   drift: float = 0.0, outlier: int | None = None) -> list[tuple[float, float, float]]:  # fmt: skip
    """(estimate, low, high) per run: a 10 ms truth, each run off by its processes and the machine that
    day (Student t with 3 df, 1.5% scale, AR(1) 0.3 from run to run: 2.6% between runs, more than
    their own intervals say), drifting `drift` over the series."""
    out, carried = [], 0.0
    for i in range(n):
        carried = 0.3 * carried + 0.015 * float(rng.standard_t(3)) * math.sqrt(1 - 0.09)
        truth = 10.0 * (step if step_at is not None and i >= step_at else 1.0) * (1 + drift * i / n)
        value = truth * math.exp(carried) * (1.6 if i == outlier else 1.0)
        half = value * 0.04 * float(rng.uniform(0.6, 1.6))  # each run's own interval, from its processes
        out.append((value, value - half, value + half))
    return out


def _series(points: list[tuple[float, float, float]], hid: str = "h") -> series.Series:
    from perfkit.experiment.records.verdict import Measured

    made = tuple(
        series.Point(f"2026{i:04d}-000000", None, None, "", "confirmed", Measured("mean", "ms", v, lo, hi), None)
        for i, (v, lo, hi) in enumerate(points)
    )
    return series.Series.of(hid, "mean (ms)", "a machine", made)


def _confirmed(points) -> list[series.Change]:
    return [c for c in series.changes(_series(points)) if c.status == "confirmed"]


def test_false_alarms_and_detection_by_simulation_against_known_truth():
    """Per series of 200 runs: how often a change is confirmed where there is none (an outlier run in a
    third of them), how often a 15% step is found at its run (within one) and a 5% step at all; and how
    often a slow drift of 5% over the whole series is reported (it is a real move, said as a change)."""
    rng = np.random.default_rng(47)
    trials = 60
    false = sum(bool(_confirmed(_run_estimates(rng, 200, step_at=None, outlier=100 if t % 3 == 0 else None)))
                for t in range(trials))  # fmt: skip
    found = small = drift = 0
    for _ in range(trials):
        at = int(rng.integers(30, 170))
        got = _confirmed(_run_estimates(rng, 200, step_at=at, outlier=20))
        found += len(got) == 1 and abs(got[0].index - at) <= 1 and got[0].moved.low > 1.08
        small += any(abs(c.index - at) <= 3 for c in _confirmed(_run_estimates(rng, 200, step_at=at, step=1.05)))
        drift += bool(_confirmed(_run_estimates(rng, 200, step_at=None, drift=0.05)))
    print(f"of {trials} series of 200 runs: false alarms {false}; 15% steps found alone at their run {found}; "
          f"5% steps found {small}; a 5% drift reported {drift}")  # fmt: skip
    assert false <= 0.05 * trials  # the rate docs/history.md states: at most 5% of series without a change
    assert found >= 0.95 * trials


def test_a_change_with_one_run_after_it_is_pending_and_a_small_one_is_not_confirmed():
    rng = np.random.default_rng(3)
    points = _run_estimates(rng, 60, step_at=None)
    pending = series.changes(_series([*points, (15.0, 14.4, 15.6)]))
    assert [c.status for c in pending] == ["pending"] and pending[0].index == 60
    small = [
        (v * (1.02 if i >= 30 else 1.0), lo, hi) for i, (v, lo, hi) in enumerate(_run_estimates(rng, 60, step_at=None))
    ]
    assert not any(c.status == "confirmed" for c in series.changes(_series(small)))
    assert series.changes(_series(points[:5])) == []  # too short to tell


def _stored(project: Project, n: int, *, step_at: int, rng) -> list[RunResults]:
    """`n` runs of four hypotheses: `slow` steps up 15% at run `step_at`; `odd` has one outlier run,
    `drifting` drifts 3% over the series, `steady` neither."""
    truths = {
        "slow": _run_estimates(rng, n, step_at=step_at),
        "steady": _run_estimates(rng, n, step_at=None),
        "odd": _run_estimates(rng, n, step_at=None, outlier=50),
        "drifting": _run_estimates(rng, n, step_at=None, drift=0.03),
    }
    stored = []
    for i in range(n):
        hs = []
        for hid, points in truths.items():
            value, low, high = points[i]
            hs.append(result(hid, "confirmed" if value < 11.2 else "refuted", value=value,
                             run_id=f"2026{i:04d}-000000", width=(high - low) / (2 * value)))  # fmt: skip
        run_id = f"2026{i // 28 + 1:02d}{i % 28 + 1:02d}-{i:06d}"  # in run order, as run ids are
        stored.append(store(project, run_id, *hs, git_commit=f"{i:06d}" + "c" * 34, git_dirty=False))
    return stored


def test_perfkit_changes_names_the_run_of_a_15_percent_step_in_200_runs_and_only_it(tmp_path, capsys):
    project = Project(tmp_path)
    (tmp_path / "hypotheses").mkdir()
    stored = _stored(project, 200, step_at=137, rng=np.random.default_rng(7))
    step_run = stored[137].run_id
    assert main(["--root", str(tmp_path), "changes"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("slow: mean (ms) +1") and f"at run {step_run} (000137cccc)" in lines[0]
    assert "; confirmed" in lines[0] and "verdict confirmed → refuted" in lines[0]
    from test_docs import ROOT, block

    assert lines[0] == block(ROOT / "docs" / "history.md", "changes-line")  # the page shows this line as printed
    assert main(["--root", str(tmp_path), "changes", "--check"]) == 1  # for CI: a confirmed change fails it
    capsys.readouterr()
    assert main(["--root", str(tmp_path), "changes", "--since", stored[150].run_id]) == 0
    assert capsys.readouterr().out.startswith("no change points since run ")
    assert main(["--root", str(tmp_path), "changes", "--since", "000130cccc"]) == 0  # a commit
    assert f"at run {step_run}" in capsys.readouterr().out
    import subprocess

    for args in (["init", "-q"], ["commit", "-q", "--allow-empty", "-m", "now"]):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@e", "-C", str(tmp_path), *args], check=True)
    assert main(["--root", str(tmp_path), "changes", "--since", "HEAD"]) == 0  # no run at it: the commit's time
    assert capsys.readouterr().out.startswith("no change points since run 20")
    assert main(["--root", str(tmp_path), "changes", "--since", "yesterday"]) == 2
    assert "--since 'yesterday': expected a run id" in capsys.readouterr().err


def test_perfkit_history_prints_and_draws_a_series_with_its_change_marked(tmp_path, capsys):
    project = Project(tmp_path)
    (tmp_path / "hypotheses").mkdir()
    stored = _stored(project, 80, step_at=40, rng=np.random.default_rng(11))
    out = tmp_path / "slow.png"
    assert main(["--root", str(tmp_path), "history", "slow", "--plot", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("slow: mean (ms) on an unnamed machine, 80 runs")
    rows = text.splitlines()
    marked = [i for i, line in enumerate(rows) if line.startswith("  --- change: +")]
    assert len(marked) == 1 and rows[marked[0] + 1].lstrip().startswith(stored[40].run_id)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["--root", str(tmp_path), "history", "nothing-here"]) == 2
    assert "no such hypothesis: nothing-here" in capsys.readouterr().err
    assert main(["--root", str(tmp_path), "history", "slow", "--plot", str(tmp_path)]) == 2  # a folder is there


@pytest.mark.parametrize("hid", ["mask-build-200ms", "spec-beats-ar-short-context"])
def test_perfkit_history_draws_a_shipped_hypothesis_from_the_committed_results(tmp_path, capsys, hid):
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / f"{hid}.png"
    assert main(["--root", str(root), "history", hid, "--plot", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"{hid}: ") and " runs" in text.splitlines()[0]
    assert out.stat().st_size > 10_000


def test_a_quantity_on_several_machine_kinds_says_whether_they_disagree():
    from perfkit.experiment.outputs.changes import machines_disagree

    rng = np.random.default_rng(5)
    here = _series(_run_estimates(rng, 20, step_at=None))
    same = series.Series.of("h", "mean (ms)", "another machine", _series(_run_estimates(rng, 20, step_at=None)).points)
    faster = [(v * 0.8, lo * 0.8, hi * 0.8) for v, lo, hi in _run_estimates(rng, 20, step_at=None)]
    other = series.Series.of("h", "mean (ms)", "a faster machine", _series(faster).points)
    (agree,) = machines_disagree([here, same])
    assert agree.endswith(": they agree within the runs' intervals"), agree
    (apart,) = machines_disagree([here, other])
    assert "a faster machine is -2" in apart and "against a machine" in apart, apart
    assert machines_disagree([here]) == []  # one machine kind: nothing to compare


def test_the_report_lists_each_hypothesis_change_points_as_perfkit_changes_says_them(tmp_path, capsys):
    from perfkit.experiment.outputs import report
    from perfkit.experiment.records.results import load_all_results

    project = Project(tmp_path)
    (tmp_path / "hypotheses").mkdir()
    stored = _stored(project, 80, step_at=40, rng=np.random.default_rng(11))
    page = report.render(load_all_results(project), None, None)
    assert main(["--root", str(tmp_path), "changes"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert page.count("<b>Change points</b>") == 1 and f"at run {stored[40].run_id}" in line
    assert f"<li>{html.escape(line)}</li>" in page
