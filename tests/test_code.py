"""The code under test in the key (perfkit/experiment/records/code.py): what changes it, what does not,
and what it touches."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from repos import git

from perfkit.errors import UserError
from perfkit.experiment.records import code, config
from perfkit.experiment.run.kernel import on_path, project_root
from perfkit.machine import fitness
from perfkit.paths import Project


@pytest.fixture
def repo(tmp_path) -> Project:
    root = tmp_path / "repo"
    for folder in ("ownlib", "hypotheses/ledger", "notebooks", "runs/r1"):
        (root / folder).mkdir(parents=True)
    (root / "ownlib" / "__init__.py").write_text("def work():\n    return 1\n")
    (root / "hypotheses" / "h.yaml").write_text("id: h\n")
    (root / "notebooks" / "probe.ipynb").write_text("{}")
    (root / "notebooks" / "helpers.py").write_text("X = 1\n")
    (root / ".gitignore").write_text("runs/\n*.log\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "-c", "user.email=t@e", "-c", "user.name=t", "commit", "-q", "-m", "x")
    return Project(root)


def digest(project: Project, names=None) -> str:
    return code.state(project, names).digest


def test_only_the_code_under_test_moves_the_key_and_the_index_is_never_touched(repo):
    root = repo.root
    index = (root / ".git" / "index").read_bytes()
    head = git(root, "rev-parse", "HEAD")
    first = digest(repo)
    for path, text in (
        ("runs/r1/manifest.json", "{}"),  # evidence
        ("hypotheses/h.yaml", "id: h\nclaim: edited\n"),  # records: keyed by their own hash
        ("hypotheses/LEDGER.md", "edited"),
        ("notebooks/probe.ipynb", '{"cells": []}'),  # probes: keyed by their code cells
        ("build.log", "ignored by .gitignore"),
    ):
        (root / path).write_text(text)
        assert digest(repo) == first, path
    (root / "ownlib" / "__init__.py").write_text("def work():\n    return 2\n")
    edited = digest(repo)
    assert edited != first
    (root / "ownlib" / "new.py").write_text("untracked, not ignored: part of the code\n")
    assert digest(repo) != edited
    (root / "notebooks" / "helpers.py").write_text("X = 2\n")  # a module a probe imports
    assert digest(repo) not in (first, edited)
    assert (root / ".git" / "index").read_bytes() == index and git(root, "rev-parse", "HEAD") == head


def test_same_size_edits_right_after_the_commit_are_each_seen(repo):
    """Racy git: an edit within the index's own second, of the same size, must not look unchanged."""
    seen = {digest(repo)}
    for i in range(2, 7):
        (repo.root / "ownlib" / "__init__.py").write_text(f"def work():\n    return {i}\n")
        now = digest(repo)
        assert now not in seen, i
        seen.add(now)


def test_a_run_names_the_files_that_changed(repo):
    before = code.state(repo).to_json()
    (repo.root / "ownlib" / "__init__.py").write_text("def work():\n    return 3\n")
    assert code.changes(repo, before, code.state(repo)) == ["ownlib/__init__.py changed"]
    for i in range(5):
        (repo.root / "ownlib" / f"m{i}.py").write_text("")
    said = code.changes(repo, before, code.state(repo))
    assert said[0].endswith("and 3 more changed") and said[0].count(".py") == 3
    older = before | {"packages": before["packages"] | {"numpy": "2.1.0"}}
    said = code.changes(repo, older, code.state(repo))
    assert [x for x in said if x.startswith("numpy")] == [f"numpy 2.1.0 -> {code.state(repo).packages['numpy']}"]
    (repo.root / "ownlib" / "drafter.safetensors").write_bytes(b"\x00" * 64)  # new weights: named first, all of them
    said = code.changes(repo, before, code.state(repo))
    assert said[0] == "the weights changed: ownlib/drafter.safetensors" and said[1].endswith("and 3 more changed")


def test_configured_paths_and_packages_narrow_what_counts(repo):
    names = ("ownlib", "numpy")
    first = code.state(repo, names)
    assert set(first.parts) == {"ownlib"} and set(first.packages) == {"numpy"}
    (repo.root / "README.md").write_text("not under ownlib/")
    assert digest(repo, names) == first.digest
    (repo.root / "ownlib" / "__init__.py").write_text("def work():\n    return 4\n")
    assert digest(repo, names) != first.digest
    with pytest.raises(UserError, match="no_such_thing is neither a path in the project nor an installed"):
        code.state(repo, ("no_such_thing",))


def test_outside_git_the_files_are_hashed(tmp_path):
    root = tmp_path / "plain"
    (root / "ownlib").mkdir(parents=True)
    (root / "hypotheses").mkdir()
    (root / "ownlib" / "__init__.py").write_text("A = 1\n")
    project = Project(root)
    first = code.state(project)
    assert first.tree is None and "files" in first.how
    (root / "hypotheses" / "h.yaml").write_text("id: h\n")
    assert digest(project) == first.digest
    (root / "ownlib" / "__init__.py").write_text("A = 2\n")
    assert digest(project) != first.digest


def test_settings_are_read_from_tool_perfkit_and_unknown_keys_refused(tmp_path):
    project = Project(tmp_path)
    assert config.read(project) == config.Settings()
    (tmp_path / "perfkit.toml").write_text('code = ["ownlib"]\ncluster = "local:2"\n')
    assert config.read(project).code == ("ownlib",) and config.read(project).cluster == "local:2"
    (tmp_path / "pyproject.toml").write_text('[tool.perfkit]\ncode = ["src"]\nclustr = "x"\n')
    with pytest.raises(UserError, match=r"pyproject.toml: \[tool.perfkit\] has no key clustr"):
        config.read(project)
    (tmp_path / "pyproject.toml").write_text("[tool.perfkit]\ncode = []\n")
    with pytest.raises(UserError, match="code must be a list of paths and package names"):
        config.read(project)
    (tmp_path / "pyproject.toml").write_text("[tool.perfkit]\nfitness = {foreign_share = 0.1}\n")
    assert config.read(project).fitness.foreign_share == 0.1 and config.read(project).fitness.episodes == 0.25
    assert config.read(project).fitness.strict  # limits are the strict mode's
    (tmp_path / "pyproject.toml").write_text('[tool.perfkit]\nfitness = "strict"\n')
    assert config.read(project).fitness == fitness.Limits(mode="strict")
    (tmp_path / "pyproject.toml").write_text("[tool.perfkit]\nfitness = {foreign_share = 0}\n")
    with pytest.raises(UserError, match=r"pyproject.toml:2: \[tool.perfkit\] fitness.foreign_share must be a share"):
        config.read(project)
    (tmp_path / "pyproject.toml").write_text('[tool.perfkit]\ncode = ["src"]\nfitness = "idle"\n')
    with pytest.raises(UserError, match=r'pyproject.toml:3: \[tool.perfkit\] fitness must be "shared", "strict" or'):
        config.read(project)


def test_the_kernel_finds_the_project_and_puts_it_first_on_the_import_path(tmp_path, monkeypatch):
    import sys

    (tmp_path / "p" / "hypotheses").mkdir(parents=True)
    (tmp_path / "p" / "notebooks" / "deeper").mkdir(parents=True)
    assert project_root(tmp_path / "p" / "notebooks" / "deeper") == tmp_path / "p"
    assert project_root(tmp_path) is None
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    on_path(tmp_path / "p")
    on_path(tmp_path / "p")  # once
    assert sys.path[0] == str(tmp_path / "p") and sys.path.count(str(tmp_path / "p")) == 1
    import os

    assert os.environ["PYTHONPATH"] == f"{tmp_path / 'p'}{os.pathsep}/elsewhere"


def test_a_record_may_name_more_code_under_test(tmp_path):
    from perfkit.experiment.records.hypothesis import load_hypotheses

    fixtures = Path(__file__).parent / "fixtures" / "project"
    (tmp_path / "hypotheses").mkdir()
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "fixture_probe.ipynb").write_bytes(
        (fixtures / "notebooks" / "fixture_probe.ipynb").read_bytes()
    )
    record = (fixtures / "hypotheses" / "fx-cost-confirmed.yaml").read_text()
    (tmp_path / "hypotheses" / "fx-cost-confirmed.yaml").write_text(
        record.replace("probe:\n", "probe:\n  code: [ownlib, numpy]\n")
    )
    (h,) = load_hypotheses(Project(tmp_path))
    assert h.probe.code == ("ownlib", "numpy")
    (tmp_path / "hypotheses" / "fx-cost-confirmed.yaml").write_text(
        record.replace("probe:\n", "probe:\n  code: [../secrets]\n")
    )
    with pytest.raises(UserError, match=r"fx-cost-confirmed.yaml:\d+: probe.code.0: expected a path under the project"):
        load_hypotheses(Project(tmp_path))


def test_init_in_perfkits_own_repository_changes_nothing(tmp_path):
    from perfkit.experiment.repo.init import init

    root = Path(__file__).resolve().parents[1]
    clone = tmp_path / "perfkit"
    subprocess.run(["git", "clone", "-q", str(root), str(clone)], check=True)
    for key, value in (
        ("filter.perfkit-notebook.clean", "python -m perfkit.experiment.repo.strip"),
        ("merge.perfkit-ledger.name", "perfkit ledger merge"),
        ("merge.perfkit-ledger.driver", "python -m perfkit.experiment.repo.merge %A %P"),
    ):
        git(clone, "config", key, value)  # as `make` leaves them
    said: list[str] = []
    done = init(clone, say=said.append)
    assert [line for line in done if "Jupyter kernel" not in line] == []
    assert git(clone, "status", "--porcelain") == ""


def test_perfkits_own_source_in_every_key_covers_the_engine_its_kernels_and_weights():
    import perfkit
    from perfkit.experiment.run import plan as planning

    root = Path(perfkit.__file__).resolve().parent
    hashed = {p.relative_to(root).as_posix() for p in planning.source_files()}
    # a moved plan.py once hashed experiment/ alone: an engine change then reused stale measurements
    for part in ("engine/decode.py", "kernels/verify_mask.py", "engine/checkpoints/target.safetensors", "stats.py"):
        assert part in hashed
    assert not any("__pycache__" in p or p.endswith(".pyc") for p in hashed)
