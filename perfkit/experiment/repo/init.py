"""`perfkit init [DIR]`: set up an existing repository for performance investigations with perfkit.

It adds what a project needs and nothing it has: hypotheses/ (with an example record and an empty
ledger), notebooks/ (with a working example probe), runs/ kept out of git, the .gitattributes lines
and git config for the notebook clean filter and the LEDGER.md merge driver (registered through
this interpreter's `python -m perfkit...`, so they work after a plain `pip install`), a
`[tool.perfkit]` table (pyproject.toml, or perfkit.toml when there is none) and, with `--ci github`,
the pull-request workflow. A file that exists is never overwritten; a second `perfkit init` changes
nothing. Every step is printed.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable
from pathlib import Path

from perfkit.errors import UserError
from perfkit.experiment.outputs import ledger
from perfkit.experiment.records import code, config
from perfkit.experiment.run import kernel, scaffold
from perfkit.files import write_atomic
from perfkit.paths import Project, git_try

EXAMPLE = "example_sort"
ATTRIBUTES = ("notebooks/*.ipynb filter=perfkit-notebook", "hypotheses/LEDGER.md merge=perfkit-ledger")
RECORD = """id: example-sort-under-100ms
claim: Sorting a million floats with numpy takes under 100 ms on this machine.
rationale: |
  The example probe perfkit init wrote (notebooks/{notebook}.ipynb). Replace its work() with your
  own code and this record with your claim: its expected cost, and the probe that measures it.
expect:
  kind: at_most
  metric: {notebook}
  value: 100
  unit: ms
probe:
  notebook: {notebook}.ipynb
  params: {{n: 1000000}}
  quick: {{n: 100000}}
tags: [example]
"""
TABLE = """
[tool.perfkit]
# What the code under test is (part of every measurement's cache key): paths under this folder and
# installed distributions. Default: the whole git working tree and every installed package.
# code = ["src", "mypackage"]
# cluster = "local:2"  # where `perfkit run` sends its executions (a Dask scheduler address)
"""
WORKFLOW = """# perfkit in pull requests: records valid, ledger up to date, and what the PR did to the verdicts.
# It measures nothing (a shared CI runner is not a fit machine): measure where you measure, commit
# hypotheses/ledger/, and this workflow reviews it.
name: perfkit
on:
  pull_request:
permissions:
  contents: read
  pull-requests: write
  checks: write
jobs:
  review:
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout@v4
        with:
          fetch-depth: 0 # the merge base must be reachable for `perfkit diff`
      - uses: actions/setup-python@v5
        with:
          python-version: "3.11"
      - name: "install what the review commands need (no torch: nothing is measured here)"
        run: pip install 'perfkit[review]'
      - run: perfkit validate
      - run: perfkit ledger --check
      - name: what changed
        run: |
          set +e
          base=$(git merge-base "origin/${{ github.base_ref }}" HEAD)
          head="${{ github.event.pull_request.head.repo.full_name }}/raw/${{ github.event.pull_request.head.sha }}"
          # github.com/OWNER/REPO/raw/SHA/...: images that render in private repositories and from forks
          perfkit diff "$base" --md --junit perfkit-diff.xml \\
            --plots-url "https://github.com/$head/hypotheses/ledger/" \\
            --base-plots-url "https://github.com/${{ github.repository }}/raw/$base/hypotheses/ledger/" \\
            > perfkit-diff.md
          echo "status=$?" >> "$GITHUB_OUTPUT"
          cat perfkit-diff.md >> "$GITHUB_STEP_SUMMARY"
        id: diff
      - run: perfkit report --out perfkit-report
        if: always()
      - uses: actions/upload-artifact@v4
        if: always()
        with:
          name: perfkit-report
          path: perfkit-report/
      - name: "comment (from a fork the token cannot: the job summary has it)"
        env:
          GH_TOKEN: ${{ github.token }}
        run: |
          n="${{ github.event.pull_request.number }}"
          gh pr comment "$n" --body-file perfkit-diff.md --edit-last \\
            || gh pr comment "$n" --body-file perfkit-diff.md \\
            || echo "::notice::this token may not comment (a pull request from a fork): the job summary has the diff"
      - uses: mikepenz/action-junit-report@v4
        if: always()
        with:
          report_paths: perfkit-diff.xml
          check_name: perfkit diff
      - if: steps.diff.outputs.status != '0'
        run: exit 1
"""


class Init:
    """One `perfkit init`: each step adds what is missing and says so."""

    def __init__(self, root: Path, say: Callable[[str], None]):
        self.root, self.say, self.done = root, say, []

    def write(self, relative: str, text: str) -> None:
        path = self.root / relative
        if path.exists():
            return
        write_atomic(path, text)
        self.done.append(f"wrote {relative}")

    def append_lines(self, relative: str, lines: tuple[str, ...], *, header: str = "") -> None:
        path = self.root / relative
        have = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
        missing = [line for line in lines if line not in have]
        if not missing:
            return
        text = "\n".join(have) + ("\n" if have else "")
        write_atomic(path, text + (header if header else "") + "\n".join(missing) + "\n")
        self.done.append(f"added to {relative}: {'; '.join(missing)}")

    def git_config(self, key: str, value: str) -> None:
        now = git_try(self.root, "config", "--get", key)
        if now is None:
            return  # no git
        was = now.stdout.strip() if now.returncode == 0 else ""
        moved = _moved(was)
        if was and moved == was:
            return  # set already (perhaps to another interpreter): the user's choice stands
        if moved != was:
            value = moved  # set by an earlier perfkit, naming a module where it no longer lives: its interpreter stays
        done = git_try(self.root, "config", key, value)
        if done is not None and done.returncode == 0:
            self.done.append(f"git config {key} {shlex.quote(value)}")


#: modules a repository's git config named before experiment/ had rooms (those paths still work)
MOVED = {
    "perfkit.experiment.strip": "perfkit.experiment.repo.strip",
    "perfkit.experiment.merge": "perfkit.experiment.repo.merge",
}


def _moved(command: str) -> str:
    """`command` with a module of MOVED that it runs (`-m old`) named where it lives now."""
    for old, new in MOVED.items():
        command = command.replace(f" -m {old} ", f" -m {new} ")
    return command


def _ignores_runs(root: Path) -> bool:
    done = git_try(root, "check-ignore", "-q", "runs/any-run/manifest.json")
    return done is not None and done.returncode == 0


def _records(step: Init, project: Project) -> None:
    """The folders, an example probe and record when there is no probe yet, and an empty ledger."""
    for folder in ("hypotheses", "hypotheses/ledger/results", "hypotheses/ledger/plots", "notebooks"):
        if not (step.root / folder).is_dir():
            (step.root / folder).mkdir(parents=True)
            step.done.append(f"made {folder}/")
    if not any(project.notebooks_dir.glob("*.ipynb")):
        step.done.append(f"wrote {scaffold.new_probe(project, EXAMPLE)} (an example probe)")
        step.write(f"hypotheses/{EXAMPLE.replace('_', '-')}-under-100ms.yaml", RECORD.format(notebook=EXAMPLE))
    step.write("hypotheses/LEDGER.md", ledger.render([]))
    for folder in ("hypotheses/ledger/results", "hypotheses/ledger/plots"):
        if not any((step.root / folder).iterdir()):  # git keeps no empty folder
            step.write(f"{folder}/.gitkeep", "")


def _git_setup(step: Init, in_git: bool) -> None:
    """runs/ ignored, the attributes, and the filter and merge driver through this interpreter."""
    if not in_git or not _ignores_runs(step.root):
        step.append_lines(
            ".gitignore", ("runs/", ".ipynb_checkpoints/"), header="# perfkit: a run's evidence stays local\n"
        )
    step.append_lines(".gitattributes", ATTRIBUTES)
    if in_git:
        python = shlex.quote(sys.executable)
        step.git_config("filter.perfkit-notebook.clean", f"{python} -m perfkit.experiment.repo.strip %f")
        step.git_config("merge.perfkit-ledger.name", "perfkit: render LEDGER.md again from both sides' results")
        step.git_config("merge.perfkit-ledger.driver", f"{python} -m perfkit.experiment.repo.merge %A %P")


def _settings(step: Init, project: Project) -> None:
    """A [tool.perfkit] table in pyproject.toml, or perfkit.toml when there is no pyproject.toml."""
    settings = config.where(project)
    if settings.name == "perfkit.toml":
        step.write("perfkit.toml", TABLE.replace("[tool.perfkit]\n", "# perfkit settings (no pyproject.toml here)\n"))
        return
    text = settings.read_text(encoding="utf-8")
    if "[tool.perfkit]" not in text:
        write_atomic(settings, text.rstrip("\n") + "\n" + TABLE)
        step.done.append("added a [tool.perfkit] table to pyproject.toml")


def init(root: Path, *, ci: str | None = None, say: Callable[[str], None] = print) -> list[str]:
    """Set up `root` (a git repository) for perfkit; returns what was done (empty: nothing was missing)."""
    root = root.resolve()
    if not root.is_dir():
        raise UserError(f"{root}: no such folder")
    if ci not in (None, "github"):
        raise UserError(f"--ci: expected github, got {ci!r}")
    in_git = code.git_top(root) is not None
    step = Init(root, say)
    project = Project(root)
    _records(step, project)
    _git_setup(step, in_git)
    _settings(step, project)
    if ci == "github":
        step.write(".github/workflows/perfkit.yml", WORKFLOW)
    installed = kernel.install()
    if installed:
        step.done.append(
            f"registered the `perfkit` Jupyter kernel ({installed}): it puts the project on the import path"
        )
    for line in step.done:
        say(line)
    if not in_git:
        say("note: not a git repository: no git filter or merge driver was set up (run `git init`, then again)")
    return step.done


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="perfkit init", description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", nargs="?", default=".", help="the repository (default: here)")
    parser.add_argument("--ci", choices=["github"], help="also write the pull-request workflow")
    args = parser.parse_args(argv)
    done = init(Path(args.dir), ci=args.ci)
    where = "" if Path(args.dir).resolve() == Path.cwd().resolve() else f" --root {shlex.quote(args.dir)}"
    print("nothing to do: this repository is set up for perfkit" if not done else "")
    print("next:")
    print(f"  perfkit{where} validate")
    print(f"  perfkit{where} run --all --quick")
    print(f"  git add hypotheses notebooks .gitattributes .gitignore {config.where(Project(Path(args.dir))).name}")
    return 0
