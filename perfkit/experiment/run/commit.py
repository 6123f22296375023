"""A run's change to the committed ledger, as one unit: its results file, its plots and LEDGER.md.

Everything a run adds to hypotheses/ledger/ is first staged in runs/<run-id>/commit/ (the results
file, the ledger-sized plots) with a journal saying "pending". Applying the commit copies the staged
files into place, results first, then rewrites LEDGER.md from every results file, then marks the
journal "done". A run killed part-way (SIGKILL, a power cut) leaves a pending journal; the next
`perfkit run`, `perfkit ledger` or `ledger --check` finds it, and the first two roll it forward,
so a plot never stays beside a result it does not belong to.

Runs in one project take turns: applying a commit holds an exclusive lock on runs/.ledger.lock,
and reads the other results under it, so four runs at once never lose one another's ledger row.
SIGINT and SIGTERM that arrive while the commit is applied wait until it is done (it takes
milliseconds), then stop the run as usual.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from perfkit.errors import UserError
from perfkit.experiment.outputs import ledger
from perfkit.experiment.records.history import history
from perfkit.experiment.records.results import RunResults, checked_text, load_all_results, results_path
from perfkit.experiment.run import redraw
from perfkit.files import read_json, write_atomic, write_json
from perfkit.paths import Project

JOURNAL_VERSION = 1  # runs/<run-id>/commit/journal.json: {"run_id", "status": pending | done}
LOCK_NAME = ".ledger.lock"


def staging_dir(project: Project, run_id: str) -> Path:
    return project.runs_dir / run_id / "commit"


@contextmanager
def locked(project: Project, say: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold the project's ledger lock (other runs' ledger updates wait for it)."""
    project.runs_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(project.runs_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if say:
                say("waiting for another run in this project to finish updating the ledger")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


@contextmanager
def signals_deferred() -> Iterator[None]:
    """SIGINT/SIGTERM wait until the block ends, then act (the main thread only can swap handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[tuple[int, object]] = []
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in previous:
        signal.signal(s, lambda signum, frame: caught.append((signum, frame)))
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for signum, frame in caught[:1]:
            handler = previous[signum]
            if callable(handler):
                handler(signum, frame)
            elif handler == signal.SIG_DFL:
                raise KeyboardInterrupt


def pending(project: Project) -> list[Path]:
    """Journals of commits that were started and never finished, oldest run first."""
    if not project.runs_dir.is_dir():
        return []
    found = []
    for journal in sorted(project.runs_dir.glob("*/commit/journal.json")):
        try:
            if read_json(journal, project.relative(journal)).get("status") == "pending":
                found.append(journal)
        except Exception:  # an unreadable journal: its commit never started (the journal is written first)
            continue
    return found


def _staged(project: Project, stage: Path) -> tuple[str, bytes, RunResults]:
    """What a journal's commit stages, read and checked before anything is written: its run id (the
    name of the run folder holding it, never a path of its own), the staged results file's bytes and
    what its reader makes of them. A UserError of one line when any of it is unusable."""
    journal = stage / "journal.json"
    shown = project.relative(journal)
    drop = f"; delete {project.relative(stage)} to drop this unfinished commit"
    try:
        run_id = read_json(journal, shown).get("run_id")
    except (UserError, AttributeError):
        raise UserError(f"{shown}: not a commit journal{drop}") from None
    if run_id != stage.parent.name:
        raise UserError(f"{shown}: its run_id {run_id!r} is not its run's ({stage.parent.name!r}){drop}")
    path = stage / "results.json"
    try:
        staged = path.read_bytes()
        results = RunResults.from_json(json.loads(staged), project.relative(path))
    except OSError as exc:
        raise UserError(f"{project.relative(path)}: cannot read the staged results: {exc.strerror}{drop}") from None
    except (ValueError, RecursionError, UserError) as exc:  # not JSON, or not results its reader accepts
        raise UserError(f"{project.relative(path)}: the staged results are unusable: {exc}{drop}") from None
    if results.run_id != run_id:
        raise UserError(f"{project.relative(path)}: results of run {results.run_id!r}, not {run_id!r}{drop}")
    return run_id, staged, results


def _apply(project: Project, stage: Path, all_results: list[RunResults] | None) -> None:
    run_id, staged, results = _staged(project, stage)
    write_atomic(results_path(project, run_id), staged)
    for hypothesis in results.hypotheses:  # only the plots of what this run committed
        plot = stage / "plots" / f"{hypothesis.id}.png"
        if plot.is_file():
            write_atomic(project.plots_dir / plot.name, plot.read_bytes())
    ledger.write(project, all_results)
    write_json(stage / "journal.json", {"run_id": run_id, "status": "done"}, version=JOURNAL_VERSION)


def finish_pending(project: Project) -> list[str]:
    """Roll forward the commits killed runs left half-applied (caller holds the lock); their run ids."""
    done = []
    for journal in pending(project):
        _apply(project, journal.parent, None)
        done.append(journal.parent.parent.name)
    return done


def apply(project: Project, results: RunResults, earlier: list[RunResults]) -> Path:
    """Commit a run: its staged plots (drawn into staging_dir/plots), its results and LEDGER.md.

    The caller holds the lock and read `earlier` (every committed results file) under it.
    """
    where = staging_dir(project, results.run_id)
    with signals_deferred():
        staged = where / "results.json"
        write_atomic(staged, checked_text(results, project.relative(results_path(project, results.run_id))))
        write_json(where / "journal.json", {"run_id": results.run_id, "status": "pending"}, version=JOURNAL_VERSION)
        _apply(project, where, [r for r in earlier if r.run_id != results.run_id] + [results])
    return results_path(project, results.run_id)


def rewrite(project: Project, say=print) -> list[str]:
    """`perfkit ledger`: finish what killed runs left half-applied, redraw plots that do not match their
    rows or that older drawing code drew (from the runs' samples, perfkit/experiment/run/redraw.py), then
    LEDGER.md; the run ids finished."""
    with locked(project):
        finished = finish_pending(project)
        all_results = load_all_results(project)  # read once, and their history found once: there may be thousands
        entries = history(all_results)
        for line in [*ledger.redraw_plots(project, entries), *redraw.redraw(project, entries)]:
            say(line)
        ledger.write(project, all_results, entries)
    return finished


def check(project: Project) -> tuple[list[str], list[str]]:
    """`perfkit ledger --check`: the ledger's own problems and warnings, and commits left half-applied."""
    problems, warnings = ledger.check(project)
    for journal in pending(project):
        run_id = journal.parent.parent.name
        problems.insert(
            0, f"run {run_id} was stopped while committing its results and plots; `perfkit ledger` finishes it"
        )
    return problems, warnings
