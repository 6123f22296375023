"""`perfkit bisect`: each commit between a good and a bad one measured in a worktree of its own.

The hypothesis record and its probe come from the project as it is (a new hypothesis can be
bisected over old commits), or from each commit (`--probe-from commit`); the code under test
always comes from the commit, checked out under runs/bisect/<stamp>/worktrees/ and removed when
the bisect ends (perfkit.experiment.bisect.worktrees). Every commit is an ordinary run with the ledger
left alone: its evidence stays under runs/, and its execution key holds the commit's code, so a
second bisect, or one that was interrupted, reuses what was measured. The search itself is
perfkit.experiment.bisect.search; what this module adds is the I/O around it and the bisect's record,
runs/bisect/<stamp>/bisect.json, and its plot.
"""

from __future__ import annotations

import shlex
import threading
from collections.abc import Callable
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from perfkit.errors import UserError
from perfkit.experiment.bisect import search as bisect
from perfkit.experiment.bisect import worktrees
from perfkit.experiment.records.hypothesis import load_hypotheses
from perfkit.experiment.records.probe import MAX_REPLICATES
from perfkit.experiment.records.results import load_all_results
from perfkit.experiment.run import cluster as remote
from perfkit.experiment.run import rundir, runner
from perfkit.experiment.run.options import BISECT_GROWTH as MORE
from perfkit.experiment.run.options import BISECT_REPLICATES as DEFAULT_REPLICATES
from perfkit.experiment.run.options import RunOptions, check_cluster
from perfkit.files import write_json
from perfkit.paths import Project

BISECT_VERSION = 1  # runs/bisect/<stamp>/bisect.json


@dataclass(frozen=True)
class BisectOptions:
    id: str
    good: str | None = None
    bad: str = "HEAD"
    replicates: int = DEFAULT_REPLICATES
    max_replicates: int | None = None
    quick: bool = False
    jobs: int = 1
    cluster: str | None = None
    probe_from: str = "tree"  # "tree": the record and probe as they are now; "commit": each commit's own

    @classmethod
    def from_args(cls, args) -> BisectOptions:
        """What `perfkit bisect`'s parser read: each field by its name, a flag not given keeping its default."""
        given = {f.name: getattr(args, f.name) for f in fields(cls) if getattr(args, f.name, None) is not None}
        return cls(**{k: v for k, v in given.items() if v is not False})

    @property
    def most(self) -> int:
        return max(self.replicates, self.max_replicates or self.replicates * MORE)

    @property
    def at_once(self) -> int:
        """Commits measured at once: `--jobs` of them on a cluster; here one, its replicates `--jobs` at a time
        (two commits measured side by side on one machine would each be the other's load)."""
        return self.jobs if self.cluster else 1


@dataclass(frozen=True)
class Bisected:
    """A finished (or interrupted) bisect: the commits, what each measured, and where it changed."""

    options: BisectOptions
    commits: list[worktrees.Commit]
    outcome: bisect.Outcome
    folder: Path
    good_from: str  # how the good end was chosen

    def exit_code(self) -> int:
        """0: every change named to one commit; 1: no change between the ends; 3: undecided or unmeasured."""
        return {"found": 0, "no change": 1}.get(self.outcome.verdict, 3)

    def to_json(self) -> dict[str, Any]:
        points = self.outcome.points
        return {
            "hypothesis": self.options.id,
            "good": self.commits[0].sha,
            "bad": self.commits[-1].sha,
            "good_from": self.good_from,
            "probe_from": self.options.probe_from,
            "verdict": self.outcome.verdict,
            "words": self.outcome.words,
            "commits": [
                {
                    "sha": c.sha,
                    "subject": c.subject,
                    **(_point_json(points[i]) if i in points else {"measured": None}),
                }
                for i, c in enumerate(self.commits)
            ],
            "changes": [
                {
                    "before": self.commits[c.before].sha,
                    "after": self.commits[c.after].sha,
                    "moved": c.moved,
                    "decided": c.decided,
                }
                for c in self.outcome.changes
            ],
        }


def _point_json(p: bisect.Point) -> dict[str, Any]:
    r = p.result
    m = r.measured if r is not None else None
    return {
        "replicates": p.replicates,
        "run_id": p.run_id,
        "verdict": r.verdict if r is not None else None,
        "reason": r.reason if r is not None else None,
        "skipped": p.skipped,
        "measured": None
        if m is None
        else {"label": m.label, "unit": m.unit, "value": m.value, "low": m.low, "high": m.high},
    }


def default_good(project: Project, hid: str) -> tuple[str, str]:
    """(commit, how it was chosen): the commit of the newest committed run in which the claim held."""
    for run in reversed(load_all_results(project)):
        for h in run.hypotheses:
            if h.id == hid and h.verdict == "confirmed" and run.git_commit:
                dirty = " (its work tree had changes)" if run.git_dirty else ""
                return run.git_commit, f"the ledger's run {run.run_id}, where {hid} was confirmed{dirty}"
    raise UserError(f"the ledger has no run in which {hid} was confirmed at a known commit: give --good REV")


class Measurer:
    """measure(index, replicates) for the search: one perfkit run of the hypothesis at that commit."""

    def __init__(self, project: Project, options: BisectOptions, commits, trees, say: Callable[[str], None]):
        self.project, self.options, self.commits, self.trees, self.say = project, options, commits, trees, say
        self.prefix = project.root.resolve().relative_to(worktrees.top_of(project).resolve())
        self.client: Any = None  # one cluster for every commit (--cluster)

    def many(self, wanted: list[tuple[int, int]]) -> list[bisect.Point]:
        """Several commits measured at once, each run in a thread of its own (on the cluster)."""
        for index, _ in wanted:  # git makes the worktrees one at a time
            self.trees.at(self.commits[index])
        found: list[bisect.Point | None] = [None] * len(wanted)
        failed: list[BaseException] = []

        def one(k: int, index: int, replicates: int) -> None:
            try:
                found[k] = self(index, replicates)
            except BaseException as exc:  # said in the calling thread
                failed.append(exc)

        threads = [threading.Thread(target=one, args=(k, *w), daemon=True) for k, w in enumerate(wanted)]
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():  # short waits: Ctrl-C reaches this thread at once
                thread.join(0.5)
        if failed:
            raise failed[0]
        return found

    def project_at(self, commit: worktrees.Commit) -> Project:
        checked_out = self.trees.at(commit) / self.prefix
        if self.options.probe_from == "commit":
            return Project(checked_out, runs=self.project.runs_dir)
        return Project(self.project.root, code=checked_out)

    def __call__(self, index: int, replicates: int) -> bisect.Point:
        commit = self.commits[index]
        self.say(
            f"bisect: {commit.short} {commit.subject[:60]} ({index + 1} of {len(self.commits)}), "
            f"{replicates} replicates"
        )
        o = self.options
        run_options = RunOptions(
            ids=(o.id,),
            quick=o.quick,
            replicates=replicates,
            max_replicates=replicates,  # the search, not the run, decides when more would tell commits apart
            jobs=o.jobs,
            cluster=o.cluster,
            ledger=False,
            command=f"perfkit bisect {shlex.quote(o.id)} (at {commit.short})",
        )
        try:
            report = runner.run(
                self.project_at(commit),
                run_options,
                out=lambda line: self.say(f"  {commit.short[:7]} {line}"),
                client=self.client,
            )
        except UserError as exc:
            return bisect.Point(replicates, None, f"cannot be measured here: {exc}")
        (result,) = report.results.hypotheses
        found = bisect.point(replicates, result, report.run_id)
        shown = found.skipped or f"{result.verdict}, {result.measured.text(level=True)}"
        self.say(f"bisect: {commit.short}: {shown}")
        return found


def check(options: BisectOptions) -> None:
    """Every option checked before anything is checked out or measured."""
    if options.probe_from not in ("tree", "commit"):
        raise UserError(f"--probe-from takes tree or commit, not {options.probe_from!r}")
    if not 2 <= options.replicates <= MAX_REPLICATES:
        raise UserError(
            f"--replicates must be from 2 to {MAX_REPLICATES}: commits are told apart by between-process intervals"
        )
    if options.max_replicates is not None and not options.replicates <= options.max_replicates <= MAX_REPLICATES:
        raise UserError(f"--max-replicates must be from --replicates ({options.replicates}) to {MAX_REPLICATES}")
    if options.jobs < 1:
        raise UserError(f"--jobs must be at least 1 here (auto is perfkit run's), got {options.jobs}")
    if options.cluster:
        check_cluster(options.cluster)


def run(project: Project, options: BisectOptions, *, say: Callable[[str], None] = print) -> Bisected:
    """Bisect between options.good and options.bad; a KeyboardInterrupt leaves every measurement under runs/."""
    check(options)
    if options.probe_from == "tree":
        load_hypotheses(project, [options.id])  # a missing or malformed record stops here, before any checkout
    top = worktrees.top_of(project)
    good_from = "--good"
    good = options.good
    if good is None:
        good, good_from = default_good(project, options.id)
    commits = worktrees.between(top, worktrees.resolve(top, good), worktrees.resolve(top, options.bad))
    folder = rundir.claim_folder(project.runs_dir / "bisect", datetime.now(UTC))
    say(
        f"bisect {options.id}: {len(commits)} commits from {commits[0].short} (good: {good_from}) "
        f"to {commits[-1].short}; {options.replicates} to {options.most} replicates a commit; under "
        f"{project.relative(folder)}"
    )
    with worktrees.Worktrees(top, folder / "worktrees") as trees:
        measure = Measurer(project, options, commits, trees, say)
        many = measure.many if options.at_once > 1 else None
        search = bisect.Search(
            len(commits), measure, first=options.replicates, most=options.most, at_once=options.at_once, many=many
        )
        outcome = search.out
        try:
            if options.cluster:
                measure.client = remote.connect(options.cluster)
            search.run()
        finally:  # interrupted too: what was measured is said and kept
            if measure.client is not None:
                remote.close(measure.client)
            if outcome.verdict == "running":
                outcome.verdict, outcome.words = "interrupted", "interrupted: run the same bisect again to go on"
            found = Bisected(options, commits, outcome, folder, good_from)
            write_json(folder / "bisect.json", found.to_json(), version=BISECT_VERSION)
    return found
