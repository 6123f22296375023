"""The bisection's search against known truth, by simulation: which commit changed the cost is known.

Each commit's replicates are whole simulated processes: an offset per process (5%), autocorrelated
samples with heavy tails inside one, so an interval that ignored the processes would be too narrow.
Intervals come from perfkit.stats (the one path every verdict's interval takes).
"""

from __future__ import annotations

import os
import random

import pytest

from perfkit import stats
from perfkit.experiment.bisect import search as bisect
from perfkit.experiment.records.results import HypothesisResult
from perfkit.experiment.records.verdict import Measured

SEEDS = range(40)


def process(rng: random.Random, mean: float, noise: float, n: int = 20) -> list[float]:
    """One process's samples: its own offset, AR(1) drift and heavy-tailed (t, 3 df) noise."""
    offset = 1 + rng.gauss(0, 0.05)
    out, drift = [], 0.0
    for _ in range(n):
        drift = 0.6 * drift + rng.gauss(0, noise)
        tail = rng.gauss(0, 1) / max(0.2, (sum(rng.gauss(0, 1) ** 2 for _ in range(3)) / 3) ** 0.5)
        out.append(mean * offset * (1 + drift + noise * 0.5 * tail))
    return out


def result(replicates: list[list[float]], bound: float = 8.0) -> HypothesisResult:
    est = stats.mean_estimate(replicates)
    verdict = "confirmed" if est.high < bound else "refuted" if est.low > bound else "inconclusive"
    measured = Measured("mean", "ms", est.value, est.low, est.high, replicates=len(replicates))
    return HypothesisResult("h", "x", "under 8 ms", "at_most", "< 8 ms", verdict, None, measured, None)


class Commits:
    """Simulated commits: their true mean and noise; `fails` are commits whose probe errors."""

    def __init__(self, means, *, noise=None, fails=(), loaded=None, seed=0):
        self.means, self.noise, self.fails = means, noise or {}, set(fails)
        self.loaded = loaded or {}  # commit: how much slower its first process ran, beside other work
        self.rng = random.Random(seed)
        self.processes: dict[int, list[list[float]]] = {}
        self.calls: list[tuple[int, int]] = []

    def __call__(self, index: int, replicates: int) -> bisect.Point:
        self.calls.append((index, replicates))
        if index in self.fails:
            return bisect.Point(replicates, None, "error: the probe failed at this commit")
        have = self.processes.setdefault(index, [])
        while len(have) < replicates:  # the cache keeps earlier replicates: only the new ones are measured
            slower = self.loaded.get(index, 1.0) if not have else 1.0
            have.append([x * slower for x in process(self.rng, self.means[index], self.noise.get(index, 0.03))])
        return bisect.point(replicates, result(have[:replicates]))


def slow_from(count: int, at: int, factor: float = 3.0, base: float = 4.0) -> list[float]:
    return [base * (factor if i >= at else 1.0) for i in range(count)]


def culprits(outcome: bisect.Outcome) -> list[int]:
    return [c.after for c in outcome.changes if c.decided]


@pytest.mark.parametrize("seed", SEEDS)
def test_the_commit_that_made_it_3x_slower_is_named(seed):
    commits = Commits(slow_from(12, 7), seed=seed)
    outcome = bisect.search(12, commits, first=3, most=12)
    assert outcome.verdict == "found" and culprits(outcome) == [7]
    (change,) = outcome.changes
    assert change.before == 6 and change.moved.endswith("higher")
    assert len({i for i, _ in commits.calls}) <= 6  # a bisection, not every commit: 2 ends and about log2(10)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_noisy_commit_that_does_not_change_the_cost_is_not_blamed(seed):
    noise = {i: 0.25 for i in range(3, 7)}  # commits 3 to 6: 8x the noise, the same mean
    commits = Commits(slow_from(12, 7), noise=noise, seed=seed)
    outcome = bisect.search(12, commits, first=3, most=12)
    assert not any(c.after in noise for c in outcome.changes)
    assert culprits(outcome) in ([7], [])  # named right, or honestly left undecided
    if not culprits(outcome):
        assert outcome.verdict == "undecided"


def test_a_commit_whose_probe_fails_is_skipped_and_a_neighbour_measured_instead():
    commits = Commits(slow_from(12, 7), fails={5}, seed=1)
    outcome = bisect.search(12, commits, first=3, most=12)
    assert outcome.verdict == "found" and culprits(outcome) == [7]
    assert outcome.points[5].skipped == "error: the probe failed at this commit"
    assert 6 in outcome.points and outcome.points[6].usable  # the middle's neighbour, measured instead


def test_commits_that_cannot_be_measured_next_to_the_change_leave_it_undecided_between_the_two_measured():
    outcome = bisect.search(12, Commits(slow_from(12, 7), fails={5, 6}, seed=1), first=3, most=12)
    assert outcome.verdict == "undecided" and culprits(outcome) == []
    (change,) = outcome.changes  # the change is 5, 6 or 7: no commit is named
    assert (change.before, change.after) == (4, 7)
    assert (
        change.moved.startswith("the commits between could not be measured (#5: error") and "#6: error" in change.moved
    )


def test_when_the_culprit_itself_cannot_be_measured_the_answer_is_undecided_between_its_neighbours():
    commits = Commits(slow_from(12, 7), fails={7}, seed=2)
    outcome = bisect.search(12, commits, first=3, most=12)
    assert outcome.verdict == "undecided" and culprits(outcome) == []
    (change,) = outcome.changes
    assert (change.before, change.after) == (6, 8) and "#7: error: the probe failed" in change.moved


@pytest.mark.parametrize("seed", SEEDS)
def test_two_culprits_in_one_range_are_both_found(seed):
    means = [4.0 * (2.0 if i >= 3 else 1.0) * (2.0 if i >= 9 else 1.0) for i in range(13)]
    outcome = bisect.search(13, Commits(means, seed=seed), first=3, most=12)
    assert outcome.verdict == "found" and culprits(outcome) == [3, 9]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("first", [2, 3])
def test_a_second_culprit_is_not_hidden_behind_the_first_by_one_wide_interval(seed, first):
    # the repository test's history (tests/test_bisect_repository.py): 4 ms, the probe broken at 5,
    # 12 ms from 7, 36 ms from 10; commit 6's first process ran 1.4x slower beside other work. With two
    # processes an interval is 12.7 standard errors wide: 6 against 8 is often not told apart while 8
    # against 11 is, and letting 6-8 go as "no change" then missed the 7th (25 of 100 seeds, first 2)
    means = [4.0] * 7 + [12.0] * 3 + [36.0] * 2
    outcome = bisect.search(12, Commits(means, fails={5}, loaded={6: 1.4}, seed=seed), first=first, most=4 * first)
    assert outcome.verdict == "found" and culprits(outcome) == [7, 10]


def test_no_change_between_the_ends_is_said_and_rarely_a_false_culprit():
    wrong = 0
    for seed in range(100):
        outcome = bisect.search(12, Commits([4.0] * 12, seed=seed), first=3, most=12)
        if outcome.verdict != "no change":
            wrong += 1
        else:
            assert outcome.words.startswith("the two ends cannot be told apart with 12 replicates")
    assert wrong <= 5  # ~2% expected: three looks at two non-overlapping 95% intervals


def test_a_change_smaller_than_the_noise_never_names_a_wrong_commit():
    for seed in range(40):
        outcome = bisect.search(12, Commits(slow_from(12, 7, factor=1.04), seed=seed), first=3, most=6)
        assert set(culprits(outcome)) <= {7}, outcome.changes


def test_an_end_that_cannot_be_measured_is_said_not_searched():
    outcome = bisect.search(12, Commits(slow_from(12, 7), fails={0}), first=3, most=12)
    assert outcome.verdict == "unmeasured" and outcome.words.startswith("the good end could not be measured")


def test_more_replicates_are_asked_for_only_while_two_commits_cannot_be_told_apart():
    commits = Commits(slow_from(12, 7), seed=3)
    bisect.search(12, commits, first=3, most=12)
    # a 3x change needs no more than the first three, but where it is named: twice that, to confirm it
    assert {(i, r) for i, r in commits.calls if r > 3} == {(6, 6), (7, 6)}
    close = Commits(slow_from(12, 7, factor=1.15), seed=3)
    bisect.search(12, close, first=3, most=12)
    assert max(r for _, r in close.calls) > 3  # a 15% change does, and only up to the most
    assert max(r for _, r in close.calls) <= 12


def test_the_good_end_by_default_is_the_newest_committed_run_that_confirmed_the_claim(tmp_path):
    from records import result as stored_result
    from records import store

    from perfkit.errors import UserError
    from perfkit.experiment.bisect.measure import default_good
    from perfkit.paths import Project

    project = Project(tmp_path)
    (tmp_path / "hypotheses").mkdir()
    with pytest.raises(UserError, match="give --good REV"):
        default_good(project, "h")
    store(project, "20260101-000000", stored_result("h", "confirmed"), git_commit="a" * 40, git_dirty=False)
    store(project, "20260102-000000", stored_result("h", "confirmed"), git_commit="b" * 40, git_dirty=True)
    store(project, "20260103-000000", stored_result("h", "refuted"), git_commit="c" * 40, git_dirty=False)
    store(project, "20260104-000000", stored_result("h", "confirmed"), git_commit=None)  # outside git
    commit, how = default_good(project, "h")
    assert commit == "b" * 40  # the newest that held at a known commit; the refuted one after it is the bad side
    assert how == "the ledger's run 20260102-000000, where h was confirmed (its work tree had changes)"


@pytest.mark.parametrize("seed", range(20))
def test_several_commits_at_once_find_the_same_culprits_in_fewer_rounds(seed):
    means = [4.0 * (2.0 if i >= 5 else 1.0) * (2.0 if i >= 17 else 1.0) for i in range(24)]
    one = Commits(means, seed=seed)
    alone = bisect.search(24, one, first=3, most=12)
    batches: list[list[tuple[int, int]]] = []
    many = Commits(means, seed=seed)

    def together(wanted):
        batches.append(wanted)
        return [many(i, r) for i, r in wanted]

    grouped = bisect.search(24, many, first=3, most=12, at_once=3, many=together)
    assert culprits(alone) == culprits(grouped) == [5, 17]
    assert 3 in {len(b) for b in batches}  # three commits inside a segment at a time
    assert max(len(b) for b in batches) <= 5  # more replicates: at most a chain's, its two ends and those three
    rounds = len(batches) + sum(1 for i, r in many.calls) - sum(len(b) for b in batches)
    assert rounds < len(one.calls)  # fewer waits for a measurement than one commit at a time


def test_a_killed_bisects_worktrees_are_removed_by_the_next_and_a_live_ones_are_kept(tmp_path):
    """Issue 45: a bisect killed with SIGKILL left its worktrees on disk and registered with git, never
    pruned. The next bisect removes those whose owner is gone, and keeps a running one's."""
    import subprocess
    import sys

    from perfkit.experiment.bisect.worktrees import OWNER, Worktrees, resolve

    top = tmp_path / "repo"
    top.mkdir()
    for args in (["init", "-q"], ["commit", "-q", "--allow-empty", "-m", "one"]):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@e", "-C", str(top), *args], check=True)
    head = resolve(top, "HEAD")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid no process has now
    runs = top / "runs"
    for name, owner in (("bisect-killed", gone.pid), ("bisect-running", os.getpid())):
        trees = Worktrees(top, runs / name / "worktrees").__enter__()  # entered, never exited: as if killed
        trees.at(head)
        (runs / name / "worktrees" / OWNER).write_text(str(owner))
    with Worktrees(top, runs / "bisect-next" / "worktrees") as trees:
        trees.at(head)
    listed = subprocess.run(["git", "-C", str(top), "worktree", "list"], capture_output=True, text=True).stdout
    assert not (runs / "bisect-killed" / "worktrees").exists() and "bisect-killed" not in listed, listed
    assert (runs / "bisect-running" / "worktrees").exists() and "bisect-running" in listed  # its owner lives
    assert not (runs / "bisect-next" / "worktrees").exists() and "bisect-next" not in listed


def test_probe_from_commit_over_a_commit_without_the_record_skips_it_in_one_line(tmp_path, capsys):
    """Issue 45, class 11: `--probe-from commit` over a commit whose tree had no hypotheses/ (git keeps no
    empty folder) gave a FileNotFoundError traceback. That end is now a commit that cannot be measured."""
    import subprocess

    from perfkit.cli import main

    top = tmp_path / "repo"
    (top / "hypotheses").mkdir(parents=True)
    (top / "notebooks").mkdir()

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@e", "-C", str(top), *args], check=True)

    git("init", "-q")
    assert main(["--root", str(top), "new", "probe", "sort_speed"]) == 0
    git("add", "-A")
    git("commit", "-q", "-m", "the probe, no record yet")
    (top / "hypotheses" / "sort-10k-under-2ms.yaml").write_text(
        "id: sort-10k-under-2ms\nclaim: Sorting 10k floats takes under 2 ms.\n"
        "rationale: numpy sorts 10k floats in well under a millisecond.\n"
        "expect: {kind: at_most, metric: sort_speed, value: 2, unit: ms, at: {n: 10000}}\n"
        "probe: {notebook: sort_speed.ipynb, params: {n: 10000}}\n"
    )
    git("add", "-A")
    git("commit", "-q", "-m", "the record")
    capsys.readouterr()
    argv = ["--root", str(top), "bisect", "sort-10k-under-2ms", "--good", "HEAD~1", "--bad", "HEAD"]
    assert main([*argv, "--probe-from", "commit", "--replicates", "2"]) == 3  # an end could not be measured
    said = capsys.readouterr()
    assert "Traceback" not in said.err + said.out
    assert "could not measure an end: the good end could not be measured: cannot be measured here: " in said.out
    assert "no such hypothesis: sort-10k-under-2ms" in said.out
