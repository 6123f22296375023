"""Probe notebooks reach git without outputs: the clean filter `make` registers."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from repos import git

from perfkit.experiment.repo import strip
from perfkit.experiment.run import plan

ROOT = Path(__file__).resolve().parents[1]


def test_every_shipped_notebook_is_stored_clean():
    notebooks = sorted((ROOT / "notebooks").glob("*.ipynb"))
    assert len(notebooks) >= 8  # the shipped probes (a glob that found none would pass for nothing)
    for path in notebooks:
        text = path.read_text(encoding="utf-8")
        assert strip.dumps(strip.strip(json.loads(text))) == text, path.name


def test_saving_after_run_all_leaves_git_diff_empty_and_the_cache_key_unchanged(tmp_path):
    repo = tmp_path / "repo"
    (repo / "notebooks").mkdir(parents=True)
    shutil.copy(ROOT / "notebooks" / "mask_build.ipynb", repo / "notebooks")
    shutil.copy(ROOT / ".gitattributes", repo)
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    git(repo, "config", "filter.perfkit-notebook.clean", f"{sys.executable} -m perfkit.experiment.repo.strip")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "clean")
    path = repo / "notebooks" / "mask_build.ipynb"
    key = plan.notebook_code(path)
    nb = nbformat.read(str(path), as_version=4)
    for i, cell in enumerate(nb.cells):  # Run All, then save, in JupyterLab
        if cell.cell_type == "code":
            cell.execution_count = i + 1
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="x" * 10_000 + "\n")]
            cell.metadata["execution"] = {"iopub.status.idle": "2026-12-01T00:00:00Z"}
    nb.metadata["widgets"] = {"state": {}}
    nbformat.write(nb, str(path))
    assert path.stat().st_size > 50_000
    assert git(repo, "diff", "--stat", "notebooks/") == ""
    assert plan.notebook_code(path) == key
    nb.cells[-1].source += "\nprint('changed')"  # a change to the code is a change
    nbformat.write(nb, str(path))
    assert "mask_build.ipynb" in git(repo, "diff", "--stat", "notebooks/")
    assert plan.notebook_code(path) != key


@pytest.mark.parametrize("text", ["[]", '{"cells": 5}', '{"cells": [5]}', '{"metadata": 1, "cells": []}', "{bad", "1"])
def test_a_file_that_is_no_notebook_is_stored_as_it_is_with_one_line(text):

    done = subprocess.run(
        [sys.executable, "-m", "perfkit.experiment.repo.strip"], input=text, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout == text  # git stores it unchanged, and says why once
    assert done.stderr.startswith("perfkit clean filter: stored as it is") and len(done.stderr.splitlines()) == 1


def test_language_info_goes_and_a_projects_extra_keys_go_too(tmp_path):
    project = tmp_path / "repo" / "sub"
    (project / "hypotheses").mkdir(parents=True)
    (project / "notebooks").mkdir()
    (project / "pyproject.toml").write_text('[tool.perfkit]\nstrip = ["metadata.jupytext", "cell.metadata.tags"]\n')
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x = 1", metadata={"tags": ["parameters"], "keep": 1})]
    nb.metadata.update(language_info={"name": "python", "version": "3.11.9"}, jupytext={"a": 1}, kernelspec={"k": 1})
    text = nbformat.writes(nb)

    def clean(*args: str) -> dict:
        done = subprocess.run(
            [sys.executable, "-m", "perfkit.experiment.repo.strip", *args],
            input=text,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path / "repo",  # git runs the filter at the top of the work tree, naming the file (%f)
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    plain = clean()
    assert "language_info" not in plain["metadata"] and plain["metadata"]["jupytext"] == {"a": 1}
    assert plain["cells"][0]["metadata"] == {"tags": ["parameters"], "keep": 1}
    configured = clean("sub/notebooks/probe.ipynb")
    assert set(configured["metadata"]) == {"kernelspec"}  # language_info by default, jupytext as configured
    assert configured["cells"][0]["metadata"] == {"keep": 1}
    (project / "pyproject.toml").write_text('[tool.perfkit]\nstrip = ["outputs"]\n')
    done = subprocess.run(
        [sys.executable, "-m", "perfkit.experiment.repo.strip", "sub/notebooks/probe.ipynb"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path / "repo",
    )
    assert done.returncode == 0 and "jupytext" in json.loads(done.stdout)["metadata"]  # the defaults still apply
    assert 'strip must be a list of keys like "metadata.jupytext"' in done.stderr


def test_a_repository_set_up_before_experiment_had_rooms_keeps_working_and_init_names_the_new_paths(tmp_path):
    """An earlier perfkit wrote `-m perfkit.experiment.strip` and `-m perfkit.experiment.merge` into a
    repository's git config, and kernelspecs that run `-m perfkit.experiment.kernel`: those paths still
    work, and `perfkit init` run again rewrites the git entries (keeping their interpreter)."""
    from perfkit.experiment import kernel as old_kernel
    from perfkit.experiment.repo import init
    from perfkit.experiment.run import kernel

    repo = tmp_path / "repo"
    (repo / "notebooks").mkdir(parents=True)
    shutil.copy(ROOT / "notebooks" / "mask_build.ipynb", repo / "notebooks")
    shutil.copy(ROOT / ".gitattributes", repo)
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    old_filter = f"{sys.executable} -m perfkit.experiment.strip %f"
    git(repo, "config", "filter.perfkit-notebook.clean", old_filter)
    git(repo, "config", "merge.perfkit-ledger.driver", "/opt/py -m perfkit.experiment.merge %A %P")
    path = repo / "notebooks" / "mask_build.ipynb"
    nb = nbformat.read(str(path), as_version=4)
    nb.cells[-1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="x" * 10_000 + "\n")]
    nbformat.write(nb, str(path))
    git(repo, "add", ".")  # through the old path's clean filter
    stored = git(repo, "show", ":notebooks/mask_build.ipynb")
    assert "x" * 100 not in stored and json.loads(stored)["cells"]
    assert old_kernel.launch_kernel is kernel.launch_kernel

    init.init(repo)
    assert git(repo, "config", "--get", "filter.perfkit-notebook.clean").strip() == (
        f"{sys.executable} -m perfkit.experiment.repo.strip %f"
    )
    assert git(repo, "config", "--get", "merge.perfkit-ledger.driver").strip() == (
        "/opt/py -m perfkit.experiment.repo.merge %A %P"  # the interpreter the user chose stays
    )
    custom = "my-own-filter %f"
    git(repo, "config", "filter.perfkit-notebook.clean", custom)
    init.init(repo)
    assert git(repo, "config", "--get", "filter.perfkit-notebook.clean").strip() == custom  # a choice stands
