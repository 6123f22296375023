"""Other commits of the user's repository, checked out beside it: what `perfkit bisect` measures.

Each commit is a detached git worktree under runs/bisect-<stamp>/, removed (with git's record of
it) when the bisect ends, however it ends; what a bisect killed with SIGKILL left, the next one
removes. The user's HEAD, index and work tree are never touched: `git worktree add` writes only the
new folder and an entry under .git/worktrees/.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from perfkit.errors import UserError
from perfkit.paths import Project, git, git_try
from perfkit.processes import alive


@dataclass(frozen=True)
class Commit:
    sha: str
    subject: str

    @property
    def short(self) -> str:
        return self.sha[:10]


def top_of(project: Project) -> Path:
    """The top of the git repository holding the project; a UserError outside one."""
    done = git_try(project.root, "rev-parse", "--show-toplevel")
    if done is None or done.returncode != 0 or not done.stdout.strip():
        raise UserError(f"{project.root} is not in a git repository: perfkit bisect measures its commits")
    return Path(done.stdout.strip())


def resolve(top: Path, revision: str) -> Commit:
    """The commit a revision names (a sha, a branch, HEAD~3, a tag); a UserError naming it otherwise."""
    if not revision or revision.startswith("-"):
        raise UserError(f"{revision!r} is not a revision")
    done = git_try(top, "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}")
    if done is None or done.returncode != 0:
        raise UserError(f"{revision!r} names no commit in {top}")
    sha = done.stdout.strip()
    return Commit(sha, git(top, "log", "-1", "--format=%s", sha).strip())


def between(top: Path, good: Commit, bad: Commit) -> list[Commit]:
    """good, then every commit after it up to bad on bad's first-parent line, oldest first."""
    if good.sha == bad.sha:
        raise UserError(f"--good and --bad are the same commit ({good.short})")
    ancestor = git_try(top, "merge-base", "--is-ancestor", good.sha, bad.sha)
    if ancestor is None or ancestor.returncode != 0:
        raise UserError(f"--good {good.short} is not an ancestor of --bad {bad.short}: nothing lies between them")
    lines = git(top, "log", "--first-parent", "--reverse", "--format=%H %s", f"{good.sha}..{bad.sha}").splitlines()
    if not lines or not any(line.startswith(bad.sha) for line in lines):
        raise UserError(f"{bad.short} is not on a first-parent line from {good.short}")
    return [good] + [Commit(*line.split(" ", 1)) if " " in line else Commit(line, "") for line in lines]


class Worktrees:
    """Detached worktrees of commits under `folder`, made on first use and all removed on exit."""

    def __init__(self, top: Path, folder: Path):
        self.top = top
        self.folder = folder
        self.made: dict[str, Path] = {}

    def __enter__(self) -> Worktrees:
        self._sweep()
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / OWNER).write_text(str(os.getpid()), encoding="utf-8")
        return self

    def _sweep(self) -> None:
        """What a killed bisect left (its owner's process gone): its worktrees removed and git's record pruned.
        A bisect still running beside this one (its owner alive) keeps its own."""
        for other in self.folder.parent.parent.glob(f"*/{self.folder.name}"):
            try:
                pid = int((other / OWNER).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if other == self.folder or alive(pid):
                continue
            for path in other.iterdir():
                if path.is_dir():
                    git_try(self.top, "worktree", "remove", "--force", "--force", str(path))
            shutil.rmtree(other, ignore_errors=True)
        git_try(self.top, "worktree", "prune")

    def __exit__(self, *exc) -> None:
        self.remove()

    def at(self, commit: Commit) -> Path:
        """The top of a worktree holding `commit`, made now if it is not yet."""
        if commit.sha not in self.made:
            path = self.folder / commit.short
            self.folder.mkdir(parents=True, exist_ok=True)
            self.made[commit.sha] = path  # before git makes it: an interrupt mid-way leaves nothing behind either
            try:
                git(self.top, "worktree", "add", "--detach", "--quiet", str(path), commit.sha)
            except UserError:
                self.made.pop(commit.sha)
                shutil.rmtree(path, ignore_errors=True)
                raise
        return self.made[commit.sha]

    def remove(self) -> None:
        """Remove every worktree made and git's record of it; what cannot be removed is deleted."""
        for path in self.made.values():
            git_try(self.top, "worktree", "remove", "--force", "--force", str(path))
            shutil.rmtree(path, ignore_errors=True)
        self.made.clear()
        git_try(self.top, "worktree", "prune")
        (self.folder / OWNER).unlink(missing_ok=True)
        if self.folder.is_dir() and not any(self.folder.iterdir()):
            self.folder.rmdir()


OWNER = ".owner"  # the pid of the bisect that made a worktrees folder: one whose process is gone left litter
