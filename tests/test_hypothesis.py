import re
import shutil
from pathlib import Path

import nbformat
import pytest

from perfkit.cli import main
from perfkit.experiment.records.hypothesis import ValidationFailed, load_hypotheses
from perfkit.paths import Project

FIXTURES = Path(__file__).parent / "fixtures"


def make_project(tmp_path: Path, *yaml_files: Path) -> Project:
    (tmp_path / "hypotheses").mkdir()
    (tmp_path / "notebooks").mkdir()
    shutil.copy(FIXTURES / "project" / "notebooks" / "fixture_probe.ipynb", tmp_path / "notebooks")
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "perfkit", "display_name": "perfkit", "language": "python"}
    nb.cells.append(nbformat.v4.new_code_cell("x = 1"))
    nbformat.write(nb, str(tmp_path / "notebooks" / "no_parameters.ipynb"))
    for path in yaml_files:
        shutil.copy(path, tmp_path / "hypotheses" / path.name)
    return Project(tmp_path)


# file -> (line, field, words in the message)
MALFORMED = {
    "unknown-key": (9, "expect.factr", "unknown key"),
    "wrong-type": (7, "expect.value", "expected a number, got a string"),
    "missing-notebook": (6, "probe.notebook", "no such notebook: notebooks/no_such_probe.ipynb"),
    "undeclared-parameter": (9, "probe.params.contex", "does not declare parameter 'contex'"),
    "wrong-param-type": (7, "probe.params.n", "expected an integer"),
    "missing-field": (1, "rationale", "missing"),
    "wrong-name": (1, "id", "must equal the file name"),
    "bad-yaml": (3, None, "not valid YAML"),
    "bad-unit": (8, "expect.unit", "unknown unit 'msec'"),
    "no-parameters-cell": (6, "probe.notebook", "no cell tagged `parameters`"),
    "scaling-over-unswept": (4, "expect.over", "the probe sweeps 'n', not 'mode'"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_record_names_file_line_and_field(tmp_path, name):
    project = make_project(tmp_path, FIXTURES / "malformed" / f"{name}.yaml")
    with pytest.raises(ValidationFailed) as caught:
        load_hypotheses(project)
    line, field, words = MALFORMED[name]
    errors = caught.value.errors
    matching = [e for e in errors if e.field == field and words in e.message]
    assert matching, [str(e) for e in errors]
    assert matching[0].line == line
    assert matching[0].path == f"hypotheses/{name}.yaml"
    prefix = f"hypotheses/{name}.yaml:{line}: " + (f"{field}: " if field else "")
    assert str(matching[0]).startswith(prefix)


def test_validate_exits_2_prints_every_error_and_writes_nothing(tmp_path, capsys):
    project = make_project(tmp_path, *sorted((FIXTURES / "malformed").glob("*.yaml")))
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert main(["--root", str(project.root), "validate"]) == 2
    err = capsys.readouterr().err
    for name, (line, _field, _) in MALFORMED.items():
        assert f"hypotheses/{name}.yaml:{line}: " in err
    assert "Traceback" not in err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_valid_fixture_records_load(tmp_path):
    project = make_project(tmp_path, *sorted((FIXTURES / "project" / "hypotheses").glob("*.yaml")))
    hypotheses = load_hypotheses(project)
    by_id = {h.id: h for h in hypotheses}
    assert [h.id for h in hypotheses] == sorted(by_id)
    scaling = by_id["fx-scaling"]
    assert scaling.expect.kind == "scaling" and scaling.probe.sweep.values == (1000, 4000, 16000)
    assert scaling.probe.sweep.quick == (1000, 4000)
    assert by_id["fx-cost-refuted"].expect.unit == "s"
    assert by_id["fx-floor"].expect.floor == "floor"
    assert load_hypotheses(project, ["fx-share"])[0].id == "fx-share"


def test_hash_ignores_formatting_but_not_content(tmp_path):
    project = make_project(tmp_path, FIXTURES / "project" / "hypotheses" / "fx-cost-confirmed.yaml")
    path = project.hypotheses_dir / "fx-cost-confirmed.yaml"
    first = load_hypotheses(project)[0].hash
    path.write_text("# a comment\n" + path.read_text())
    assert load_hypotheses(project)[0].hash == first
    path.write_text(path.read_text().replace("value: 1\n", "value: 2\n"))
    assert load_hypotheses(project)[0].hash != first


def test_unknown_id_is_a_user_error(tmp_path):
    project = make_project(tmp_path, FIXTURES / "project" / "hypotheses" / "fx-share.yaml")
    with pytest.raises(Exception, match="no such hypothesis: nope"):
        load_hypotheses(project, ["nope"])


def test_shipped_hypotheses_are_valid():
    root = Path(__file__).resolve().parents[1]
    assert load_hypotheses(Project(root))


def test_a_sample_count_the_record_leaves_to_the_notebook_is_known_by_the_notebooks_default(tmp_path):
    """What a replicate measured with when params did not set the count: the planner's cost and split
    start from it (a count it did not know would make fewer samples look free)."""
    root = Path(__file__).resolve().parents[1]
    shutil.copytree(root / "notebooks", tmp_path / "notebooks")
    (tmp_path / "hypotheses").mkdir()
    record = (root / "hypotheses" / "spec-beats-ar-long-context.yaml").read_text()
    record = re.sub(r", repeats: \d+\}", "}", record)  # params and quick leave the count to the notebook
    (tmp_path / "hypotheses" / "spec-beats-ar-long-context.yaml").write_text(record)
    (h,) = load_hypotheses(Project(tmp_path))
    assert "repeats" not in h.probe.params and "repeats" not in h.probe.quick
    assert h.probe.samples == {"repeats": (5, 10)} and h.probe.sample_defaults == {"repeats": 5}  # the notebook's
