"""Where a project keeps its hypotheses, probes, runs and ledger.

Every path the framework reads or writes comes from one `Project`, so tests (and users with
several investigations) can point perfkit at another directory with `--root` or PERFKIT_ROOT.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from perfkit import environment
from perfkit.errors import UserError

PACKAGE_DIR = Path(__file__).resolve().parent  # perfkit/ itself, wherever it is installed
PACKAGE_HOME = PACKAGE_DIR.parent  # the folder holding the perfkit package (a checkout or site-packages)


@dataclass(frozen=True)
class Project:
    """A directory holding hypotheses/, notebooks/ and runs/.

    `code` is where the code under test is when it is not the project itself (`perfkit bisect`
    measures each commit in a git worktree of its own); `runs` where the evidence goes when the
    records come from such a worktree too (`--probe-from commit`): the project's own runs/.
    """

    root: Path
    code: Path | None = None
    runs: Path | None = None

    @property
    def code_root(self) -> Path:
        """Where the code under test is: first on a probe's import path, and what its key hashes."""
        return self.code or self.root

    @property
    def hypotheses_dir(self) -> Path:
        return self.root / "hypotheses"

    @property
    def notebooks_dir(self) -> Path:
        return self.root / "notebooks"

    @property
    def runs_dir(self) -> Path:
        return self.runs or self.root / "runs"

    @property
    def ledger_path(self) -> Path:
        return self.hypotheses_dir / "LEDGER.md"

    @property
    def ledger_dir(self) -> Path:
        """Committed compact results and small plots the ledger is generated from."""
        return self.hypotheses_dir / "ledger"

    @property
    def results_dir(self) -> Path:
        return self.ledger_dir / "results"

    @property
    def plots_dir(self) -> Path:
        return self.ledger_dir / "plots"

    def check_confined(self) -> None:
        """Refuse to write through a link out of the project: runs/, the ledger and its results and plots."""
        root = self.root.resolve()
        if self.runs is not None:  # another project's runs/, which that project checked
            root = self.runs.resolve().parent
        for path in (self.runs_dir, self.ledger_dir, self.results_dir, self.plots_dir, self.ledger_path):
            if (path.exists() or path.is_symlink()) and not path.resolve().is_relative_to(root):
                raise UserError(
                    f"{self.relative(path)} leads outside the project (to {path.resolve()}); "
                    "perfkit writes only inside it"
                )

    def relative(self, path: Path) -> str:
        """A path as the user sees it: relative to the project root when inside it."""
        try:
            return Path(path).resolve().relative_to(self.root.resolve()).as_posix()
        except ValueError:
            return str(path)


def cache_dir() -> Path:
    """This user's cache of what perfkit measured or read once (the bandwidth of a machine, the key that
    signs a project's cache of results): $PERFKIT_CACHE_DIR, else ~/.cache/perfkit."""
    return environment.folder("PERFKIT_CACHE_DIR") or Path.home() / ".cache" / "perfkit"


def find_project(root: str | os.PathLike | None = None) -> Project:
    """The project at `root`, at PERFKIT_ROOT, or the nearest directory above cwd with hypotheses/."""
    if root is None:
        root = environment.folder("PERFKIT_ROOT")
    if root is not None:
        path = Path(root).resolve()
        if not (path / "hypotheses").is_dir():
            raise UserError(f"{path} is not a perfkit project: it has no hypotheses/ directory")
        return Project(path)
    here = Path.cwd().resolve()
    for candidate in (here, *here.parents):
        if (candidate / "hypotheses").is_dir() and (candidate / "notebooks").is_dir():
            return Project(candidate)
    raise UserError(
        f"no perfkit project found at or above {here} (a directory with hypotheses/ and notebooks/); "
        "pass --root DIR or set PERFKIT_ROOT"
    )


def git(directory: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """`git ARGS` run in `directory` (with `env` instead of this process's environment): its output, or a
    UserError saying what git said."""
    try:
        done = subprocess.run(["git", *args], cwd=directory, capture_output=True, text=True, env=env, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UserError(f"git {' '.join(args)}: {exc}") from None
    if done.returncode != 0:
        raise UserError(f"git {' '.join(args)}: {done.stderr.strip() or 'failed'}")
    return done.stdout


def git_try(directory: Path, *args: str) -> subprocess.CompletedProcess | None:
    """`git ARGS` whose exit status is an answer (check-ignore, config --get): None when git cannot run."""
    try:
        return subprocess.run(["git", *args], cwd=directory, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None


def git_state(directory: Path) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the git checkout holding `directory`; (None, None) outside one or without git."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=directory, capture_output=True, text=True, timeout=20)
        status = subprocess.run(
            ["git", "status", "--porcelain"], cwd=directory, capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.TimeoutExpired):
        return None, None
    if commit.returncode != 0:
        return None, None
    return commit.stdout.strip(), bool(status.stdout.strip()) if status.returncode == 0 else None


def format_literal(path: str | Path) -> str:
    """`path` as a format string that gives itself back: papermill formats every path it is given
    with the parameters (`str.format`), so a brace in a folder's or a notebook's name stays a brace."""
    return str(path).replace("{", "{{").replace("}", "}}")
