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

import json
import shlex
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlparse

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
# How the pull-request workflow installs perfkit (one argument to `pip install`); from a package index
# it would be "perfkit[review]".
{install}
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
      - name: "install perfkit as `install` in [tool.perfkit] says (no torch: nothing is measured here)"
        run: |
          spec=$(python - <<'SETTING'
          import pathlib, tomllib
          pyproject, own = pathlib.Path("pyproject.toml"), pathlib.Path("perfkit.toml")
          if pyproject.is_file():
              table = tomllib.loads(pyproject.read_text()).get("tool", {}).get("perfkit", {})
          else:
              table = tomllib.loads(own.read_text()) if own.is_file() else {}
          print(table.get("install", ""))
          SETTING
          )
          if [ -z "$spec" ]; then
            echo "::error::set install in [tool.perfkit]: how pip gets perfkit (a pinned git URL, a wheel here)"
            exit 1
          fi
          pip install "$spec"
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
        if path.exists() or path.is_symlink():
            return
        _written(path, relative, text)
        self.done.append(f"wrote {relative}")

    def lines_of(self, relative: str) -> list[str]:
        """The lines of a file of the user's that init adds to; a UserError when it is not a readable file."""
        path = self.root / relative
        if not path.exists():
            return []
        if not path.is_file():
            raise UserError(f"{path}: expected a file perfkit init can add lines to, found a folder or a device")
        try:
            return path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"{path}: cannot read it: {getattr(exc, 'strerror', None) or exc}") from None

    def append_lines(self, relative: str, lines: tuple[str, ...], *, header: str = "") -> None:
        have = self.lines_of(relative)
        missing = [line for line in lines if line not in have]
        if not missing:
            return
        text = "\n".join(have) + ("\n" if have else "")
        _written(self.root / relative, relative, text + (header if header else "") + "\n".join(missing) + "\n")
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


def _written(path: Path, relative: str, text: str) -> None:
    """write_atomic, with a folder that cannot be written said in one line naming the file."""
    try:
        write_atomic(path, text)
    except OSError as exc:
        raise UserError(f"{path}: cannot write {relative}: {exc.strerror or exc}") from None


def _their_notebook_filter(have: list[str]) -> str | None:
    """A line of the user's .gitattributes that gives notebooks a filter of their own (nbstripout, jupytext):
    perfkit's would silently replace it (git takes the last matching line), so theirs is kept."""
    for line in have:
        words = line.split()
        if len(words) > 1 and words[0].endswith(".ipynb") and not words[0].startswith("#"):
            filters = [w for w in words[1:] if w.startswith("filter=")]
            if filters and filters[-1] != "filter=perfkit-notebook":
                return line.strip()
    return None


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
    theirs = _their_notebook_filter(step.lines_of(".gitattributes"))
    if theirs is not None:
        step.append_lines(".gitattributes", tuple(a for a in ATTRIBUTES if "filter=" not in a))
        step.done.append(
            f"kept your notebook filter ({theirs!r} in .gitattributes): perfkit's was not added (git would "
            "have used it instead of yours)"
        )
    else:
        step.append_lines(".gitattributes", ATTRIBUTES)
    if in_git:
        python = shlex.quote(sys.executable)
        if theirs is None:
            step.git_config("filter.perfkit-notebook.clean", f"{python} -m perfkit.experiment.repo.strip %f")
        step.git_config("merge.perfkit-ledger.name", "perfkit: render LEDGER.md again from both sides' results")
        step.git_config("merge.perfkit-ledger.driver", f"{python} -m perfkit.experiment.repo.merge %A %P")


def install_requirement(root: Path) -> tuple[str | None, str]:
    """How a CI runner of the repository at `root` can install the perfkit running here, as one argument to
    `pip install` (its review extra), and how that was found; (None, why) when it cannot be said.

    From the installation's own record (PEP 610 direct_url.json): a VCS install pins its commit; a wheel or
    folder inside the repository is named by its path there; a checkout installed from its folder is named by
    its remote and commit when it has a remote; no record means a package index, pinned to this version."""
    dist = metadata.distribution("perfkit")
    recorded = dist.read_text("direct_url.json")
    if not recorded:
        return f"perfkit[review]=={dist.version}", "from a package index"
    info = json.loads(recorded)
    url = info.get("url", "")
    if "vcs_info" in info:
        vcs = info["vcs_info"]
        return f"perfkit[review] @ {vcs.get('vcs', 'git')}+{url}@{vcs.get('commit_id', '')}".rstrip("@"), "from git"
    if not url.startswith("file:"):
        return f"perfkit[review] @ {url}", "from a URL"
    path = Path(unquote(urlparse(url).path))
    try:
        inside = path.resolve().relative_to(root.resolve())
        return f"{'.' if inside == Path('.') else './' + inside.as_posix()}[review]", "from a path in this repository"
    except ValueError:
        pass
    if info.get("dir_info") is not None and (remote := _pinned_remote(path)) is not None:
        return f"perfkit[review] @ git+{remote}", "from the checkout's remote"
    return None, f"perfkit here was installed from {path}, which a CI runner cannot reach"


def _pinned_remote(checkout: Path) -> str | None:
    """`URL@COMMIT` of a checkout's origin and HEAD, when origin is a URL another machine can clone."""
    origin, head = git_try(checkout, "remote", "get-url", "origin"), git_try(checkout, "rev-parse", "HEAD")
    if origin is None or head is None or origin.returncode or head.returncode:
        return None
    url = origin.stdout.strip()
    if not url.startswith(("https://", "ssh://", "git@")):
        return None
    return f"{url}@{head.stdout.strip()}"


def _settings(step: Init, project: Project) -> None:
    """A [tool.perfkit] table in pyproject.toml, or perfkit.toml when there is no pyproject.toml."""
    settings = config.where(project)
    requirement, how = install_requirement(step.root)
    if requirement is None:
        line = f'# install = "..."  # {how}: a pinned git URL, or a wheel committed here'
    else:
        line = f"install = {json.dumps(requirement)}  # {how}"
    table = TABLE.replace("{install}", line)
    if settings.name == "perfkit.toml":
        step.write("perfkit.toml", table.replace("[tool.perfkit]\n", "# perfkit settings (no pyproject.toml here)\n"))
        return
    text = settings.read_text(encoding="utf-8")
    if "[tool.perfkit]" not in text:
        _written(settings, "pyproject.toml", text.rstrip("\n") + "\n" + table)
        step.done.append("added a [tool.perfkit] table to pyproject.toml")


def _workflow(step: Init, project: Project) -> None:
    """The pull-request workflow, and a word when the settings do not yet say how it gets perfkit."""
    written = len(step.done)
    step.write(".github/workflows/perfkit.yml", WORKFLOW)
    if len(step.done) > written and config.read(project).install is None:
        requirement, how = install_requirement(step.root)
        step.done.append(
            f"note: the workflow installs perfkit as `install` in {config.where(project).name} says, and it says "
            f"nothing yet: {how}; set it to a pinned git URL or a wheel committed here"
            if requirement is None
            else f"note: add install = {json.dumps(requirement)} to [tool.perfkit]: the workflow installs perfkit so"
        )


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
        _workflow(step, project)
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
    parser.add_argument("dir", nargs="?", default=None, help="the repository (default: here)")
    parser.add_argument("--ci", choices=["github"], help="also write the pull-request workflow")
    parser.add_argument("--root", help=argparse.SUPPRESS)  # `perfkit --root DIR init`: DIR
    args = parser.parse_args(argv)
    if args.root is not None and args.dir is not None and Path(args.dir).resolve() != Path(args.root).resolve():
        raise UserError(f"perfkit --root {args.root} init {args.dir}: two different folders; name one")
    args.dir = args.root or args.dir or "."
    done = init(Path(args.dir), ci=args.ci)
    where = "" if Path(args.dir).resolve() == Path.cwd().resolve() else f" --root {shlex.quote(args.dir)}"
    print("nothing to do: this repository is set up for perfkit" if not done else "")
    print("next:")
    print(f"  perfkit{where} validate")
    print(f"  perfkit{where} run --all --quick")
    print(f"  git add hypotheses notebooks .gitattributes .gitignore {config.where(Project(Path(args.dir))).name}")
    return 0
