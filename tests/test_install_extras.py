"""What each way of installing perfkit brings, checked where nothing else is importable.

Each environment holds exactly the distributions pip would install for it, found by walking the
requirements in perfkit's own metadata (Requires-Dist, markers and extras evaluated as pip does),
linked from this checkout's .venv (nothing is downloaded), and perfkit itself, pip-installed from a
wheel of this source.

- `pip install 'perfkit[review]'`: validate, ledger --check, diff and report work with the review
  extra's distributions alone; torch, JupyterLab, Dask and a Jupyter kernel are not among them, and
  `perfkit run` there says in one line what is missing.
- `pip install perfkit`: no torch. A user's own probe (the one `perfkit init` writes, on numpy)
  runs to a verdict; the bundled engine's commands say in one line how to get torch.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from repos import ROOT, sh

NOT_FOR_REVIEW = {"torch", "jupyterlab", "distributed", "ipykernel", "psutil"}  # no kernel is started


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def perfkit_requirements(extra: str | None) -> list[Requirement]:
    """perfkit's core requirements (extra None), or those its `extra` adds."""
    out = []
    for text in metadata.distribution("perfkit").requires or []:
        req = Requirement(text)
        core = req.marker is None or req.marker.evaluate({"extra": ""})
        if (extra is None and core) or (extra is not None and not core and req.marker.evaluate({"extra": extra})):
            out.append(req)
    return out


def closure(requirements: list[Requirement]) -> set[str]:
    """The distributions pip installs for these requirements, transitively (markers and extras as pip reads them)."""
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = list(requirements)
    while todo:
        req = todo.pop()
        key = (canonical(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        for text in metadata.distribution(req.name).requires or []:
            sub = Requirement(text)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in ("", *req.extras)):
                todo.append(sub)
    return {name for name, _ in seen}


def environment(folder: Path, distributions: set[str], wheel: Path | None, *, pip: bool = False) -> dict[str, str]:
    """A virtual environment with these distributions (linked from .venv) and perfkit's wheel (None: no perfkit;
    `pip`: and pip of its own, as a CI runner's Python has); its env vars."""
    site = folder / "site"
    site.mkdir(parents=True)
    for name in sorted(distributions):
        dist = metadata.distribution(name)
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")} - {"__pycache__"}
        for top in tops:
            if not (site / top).exists():
                (site / top).symlink_to(Path(str(dist.locate_file(top))))
    venv = folder / "v"
    sh(ROOT, sys._base_executable, "-m", "venv", *([] if pip else ["--without-pip"]), str(venv))
    python = venv / "bin" / "python"
    purelib = sh(ROOT, str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    (Path(purelib) / "linked.pth").write_text(f"{site}\n")
    if wheel is not None:
        sh(ROOT, sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PERFKIT_", "VIRTUAL_ENV", "PYTHONPATH"))}
    return env | {"PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", "MPLBACKEND": "Agg"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """perfkit's wheel as `make dist` builds it (beside an sdist; twine has checked both)."""
    out = tmp_path_factory.mktemp("dist") / "dist"
    sh(ROOT, "make", "--no-print-directory", "dist", f"DIST={out}", "BUILD_FLAGS=--no-isolation")
    assert [p.name for p in sorted(out.iterdir())] == ["perfkit-0.1.0-py3-none-any.whl", "perfkit-0.1.0.tar.gz"]
    return out / "perfkit-0.1.0-py3-none-any.whl"


def test_the_review_extra_brings_no_torch_notebook_runner_jupyterlab_or_dask():
    review = closure(perfkit_requirements("review"))
    with_core = closure(perfkit_requirements(None) + perfkit_requirements("review"))
    assert {"numpy", "pyyaml", "matplotlib", "pillow", "nbformat", "papermill"} <= review
    assert not review & NOT_FOR_REVIEW, review & NOT_FOR_REVIEW
    assert not with_core & {"torch", "jupyterlab", "distributed"}  # what `pip install 'perfkit[review]'` gets
    assert "torch" in closure(perfkit_requirements("engine"))


def test_validate_ledger_check_diff_and_report_run_with_the_review_extra_alone(tmp_path, wheel):
    env = environment(tmp_path / "review", closure(perfkit_requirements("review")), wheel)
    for missing in ("torch", "ipykernel", "psutil", "distributed"):
        assert sh(ROOT, "python", "-c", f"import {missing}", env=env, check=False).returncode != 0, missing
    assert "valid" in sh(ROOT, "perfkit", "validate", env=env).stdout
    assert "up to date" in sh(ROOT, "perfkit", "ledger", "--check", env=env).stdout
    diff = sh(ROOT, "perfkit", "diff", "HEAD", "--md", env=env)
    assert diff.stdout.startswith("### perfkit: ") and "unchanged" in diff.stdout, diff.stdout
    sh(ROOT, "perfkit", "report", "--out", str(tmp_path / "report"), "--single-file", env=env)
    page = next((tmp_path / "report").glob("*.html")).read_text()
    assert page.count("data:image/png;base64,") >= 10  # every hypothesis's plot, drawn without torch
    project = tmp_path / "project"  # a copy: a run that got further must not write into this checkout
    for part in ("hypotheses", "notebooks"):
        shutil.copytree(ROOT / part, project / part)
    shutil.copy(ROOT / "pyproject.toml", project)
    run = sh(project, "perfkit", "run", "--all", "--quick", env=env, check=False)
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "Traceback" not in run.stderr, run.stderr
    assert "which is not installed here" in run.stderr and run.stderr.rstrip().endswith("pip install perfkit")


def test_a_plain_install_has_no_torch_yet_runs_a_users_probe_and_says_how_to_get_the_engine(tmp_path, wheel):
    env = environment(tmp_path / "plain", closure(perfkit_requirements(None)), wheel)
    env["PERFKIT_CACHE_DIR"] = str(tmp_path / "cache")  # no machine rates measured before, with torch
    assert sh(ROOT, "python", "-c", "import torch", env=env, check=False).returncode != 0
    project = tmp_path / "project"
    project.mkdir()
    sh(project, "git", "init", "-q", "-b", "main")
    sh(project, "perfkit", "init", env=env)
    run = sh(project, "perfkit", "run", "example-sort-under-100ms", "--quick", "--replicates", "2", env=env)
    assert "confirmed" in run.stdout, run.stdout + run.stderr
    assert "bandwidth  not measured: the rates are measured with torch" in sh(project, "perfkit", "env", env=env).stdout
    engine = sh(project, "perfkit", "engine", "bench", env=env, check=False)
    assert engine.returncode == 2 and engine.stderr.count("\n") == 1, engine.stderr
    assert "pip install 'perfkit[engine]'" in engine.stderr and "Traceback" not in engine.stderr


def test_a_repository_of_ones_own_gets_perfkit_from_a_wheel_and_its_review_workflow_installs_it_offline(
    tmp_path, wheel
):
    repo = tmp_path / "ownproject"
    (repo / "vendor").mkdir(parents=True)
    sh(repo, "git", "init", "-q", "-b", "main")
    shipped = repo / "vendor" / wheel.name  # committed with the repository, so its CI runner has it
    shutil.copy(wheel, shipped)
    review = closure(perfkit_requirements(None) + perfkit_requirements("review"))
    user = environment(tmp_path / "user", review | {"ipykernel"}, shipped)
    said = sh(repo, "perfkit", "init", "--ci", "github", env=user).stdout
    assert "note:" not in said, said  # the setting says how, so there is nothing to add
    settings = tomllib.loads((repo / "perfkit.toml").read_text())
    assert settings["install"] == f"./vendor/{wheel.name}[review]"
    workflow = yaml.safe_load((repo / ".github" / "workflows" / "perfkit.yml").read_text())
    steps = workflow["jobs"]["review"]["steps"]
    install = next(s["run"] for s in steps if s.get("name", "").startswith("install perfkit"))
    runner = environment(tmp_path / "runner", review, None, pip=True) | {"PIP_NO_INDEX": "1"}  # no index at all
    assert sh(repo, "python", "-c", "import perfkit", env=runner, check=False).returncode != 0
    sh(repo, "bash", "-e", "-c", install, env=runner)
    assert "valid" in sh(repo, "perfkit", "validate", env=runner).stdout
    where = sh(repo, "python", "-c", "import perfkit; print(perfkit.__file__)", env=runner).stdout
    assert where.startswith(str(tmp_path / "runner" / "v")), where  # the wheel's copy, not this checkout
    (repo / "perfkit.toml").write_text("# no install setting\n")
    missing = sh(repo, "bash", "-e", "-c", install, env=runner, check=False)
    assert missing.returncode == 1 and "::error::set install in [tool.perfkit]" in missing.stdout, missing


def test_init_names_how_a_ci_runner_gets_perfkit_or_says_it_cannot(tmp_path, monkeypatch):
    from perfkit.experiment.repo import init

    class Installed:
        def __init__(self, recorded):
            self.version, self.recorded = "0.1.0", recorded

        def read_text(self, name):
            return None if self.recorded is None else json.dumps(self.recorded)

    root = tmp_path / "repo"
    root.mkdir()
    cases = [
        (None, "perfkit[review]==0.1.0"),
        ({"url": "https://github.com/o/perfkit.git", "vcs_info": {"vcs": "git", "commit_id": "abc123"}},
         "perfkit[review] @ git+https://github.com/o/perfkit.git@abc123"),
        ({"url": (root / "vendor" / "perfkit-0.1.0-py3-none-any.whl").as_uri(), "archive_info": {}},
         "./vendor/perfkit-0.1.0-py3-none-any.whl[review]"),
        ({"url": "https://example.org/perfkit-0.1.0-py3-none-any.whl", "archive_info": {}},
         "perfkit[review] @ https://example.org/perfkit-0.1.0-py3-none-any.whl"),
        ({"url": (tmp_path / "elsewhere").as_uri(), "dir_info": {"editable": True}}, None),
    ]  # fmt: skip
    for recorded, expected in cases:
        monkeypatch.setattr(init.metadata, "distribution", lambda name, r=recorded: Installed(r))
        requirement, how = init.install_requirement(root)
        assert requirement == expected, (recorded, requirement, how)
    assert "which a CI runner cannot reach" in how
