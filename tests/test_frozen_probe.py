"""Every replicate executes the bytes of the notebook the plan hashed, not the file as edited since (issue 24).

The probe here edits its own notebook on disk when it runs: the first replicate's execution turns
`VALUE = 1.0` into `VALUE = 2.0`, so a replicate that read notebooks/ again would record 2.0 under the
key of the code that records 1.0, and a later run would reuse it.
"""

import shutil
from pathlib import Path

import nbformat
import pytest
from records import run, shared_machine

from perfkit.experiment.records.results import read_execution
from perfkit.experiment.run import cluster
from perfkit.paths import Project

FIXTURES = Path(__file__).parent / "fixtures" / "project"
NOTEBOOK = "self_editing.ipynb"

RECORD = """\
import perfkit

VALUE = 1.0
perfkit.record("work", [VALUE] * 5, unit="ms")
"""
# edits the notebook next to it (the probe's working directory is notebooks/); the words are built
# at run time so the edit does not touch this cell
EDIT = """\
import pathlib

path = pathlib.Path(notebook)
path.write_text(path.read_text().replace("VALUE = " + "1.0", "VALUE = " + "2.0"))
"""
RECORD_YAML = f"""\
id: self-editing
claim: The probe records 1 ms.
rationale: It says so.
expect:
  kind: cost
  metric: work
  value: 1
  unit: ms
  factor: 2
probe:
  notebook: {NOTEBOOK}
tags: [fixture]
"""


def _probe() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"display_name": "perfkit", "language": "python", "name": "perfkit"}
    params = nbformat.v4.new_code_cell(f'notebook = "{NOTEBOOK}"')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(RECORD), nbformat.v4.new_code_cell(EDIT)]
    return nb


@pytest.fixture
def project(tmp_path):
    root = tmp_path / "project"
    shutil.copytree(FIXTURES / "notebooks", root / "notebooks")  # the project's other files stay as they are
    (root / "hypotheses").mkdir()
    (root / "hypotheses" / "self-editing.yaml").write_text(RECORD_YAML)
    nbformat.write(_probe(), str(root / "notebooks" / NOTEBOOK))
    return Project(root)


def _run(project: Project, **options):
    lines: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        shared_machine(mp)
        report = run(project, ids=["self-editing"], max_replicates=2, timeout_s=60, out=lines.append, **options)
    return report, lines


def _recorded(project: Project, run_id: str) -> dict[tuple[str, int], list[float]]:
    """(key, replicate) -> the `work` samples each execution of the run recorded."""
    found = {}
    for path in sorted((project.runs_dir / run_id / "executions").glob("*/r*/execution.json")):
        x = read_execution(path)
        assert x.status == "ok", x.reason
        found[(x.key, x.replicate)] = [s for r in x.records if r.name == "work" for s in r.samples]
    return found


def test_replicates_run_the_hashed_bytes_and_an_edit_during_a_run_does_not_poison_the_cache(project):
    path = project.notebooks_dir / NOTEBOOK
    before = path.read_bytes()
    first, lines = _run(project, replicates=2)
    assert first.executed == 2 and first.reused == 0, lines
    assert b"VALUE = 2.0" in path.read_bytes()  # the probe did edit its notebook while the run executed
    got = _recorded(project, first.run_id)
    assert sorted(r for _, r in got) == [0, 1]
    assert all(samples == [1.0] * 5 for samples in got.values()), got  # every replicate ran the bytes hashed
    (frozen,) = (project.runs_dir / first.run_id / "probes").glob(f"*/{NOTEBOOK}")
    assert frozen.read_bytes() == before  # the run keeps the copy it executed

    second, lines = _run(project, replicates=2)
    assert second.executed == 2 and second.reused == 0, lines  # the edited code is not the cached one
    again = _recorded(project, second.run_id)
    assert {k for k, _ in again}.isdisjoint({k for k, _ in got})
    assert all(samples == [2.0] * 5 for samples in again.values()), again


def test_a_cluster_executes_the_hashed_bytes_though_the_notebook_changed_before_it_was_shipped(project, monkeypatch):
    pytest.importorskip("distributed")
    path = project.notebooks_dir / NOTEBOOK
    shipping = cluster.ship

    def edited_then_shipped(client, shipped_project, *args, **kwargs):  # an edit between the plan and the shipping
        path.write_text(path.read_text().replace("VALUE = 1.0", "VALUE = 2.0"))
        return shipping(client, shipped_project, *args, **kwargs)

    monkeypatch.setattr(cluster, "ship", edited_then_shipped)
    # the probe edits the project's notebook, not the worker's unpacked copy of notebooks/ (its working directory)
    report, lines = _run(project, replicates=1, cluster="local:1", overrides={"notebook": str(path)})
    assert report.executed == 1, lines
    assert b"VALUE = 2.0" in path.read_bytes()
    got = _recorded(project, report.run_id)
    assert list(got.values()) == [[1.0] * 5], got  # the bytes the key was made of, not the notebook as shipped
