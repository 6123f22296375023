import shutil
from pathlib import Path

import nbformat
import pytest

from perfkit.cli import main
from perfkit.experiment.hypothesis import ValidationFailed, load_hypotheses
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


def test_the_cache_key_ignores_outputs_and_prose_but_not_code_or_the_environment(tmp_path):
    import nbformat

    from perfkit.experiment import plan

    path = tmp_path / "n.ipynb"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# probe"), nbformat.v4.new_code_cell("x = 1")])
    nbformat.write(nb, str(path))
    before = plan.notebook_code(path)
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="1\n")]
    nb.cells[1].execution_count = 7
    nb.cells[0].source = "# probe, reworded"
    nbformat.write(nb, str(path))
    assert plan.notebook_code(path) == before
    nb.cells[1].source = "x = 2"
    nbformat.write(nb, str(path))
    assert plan.notebook_code(path) != before
    base = plan.environment_key({"HOME": "/root", "PATH": "/bin", "TORCHINDUCTOR_CACHE_DIR": "/tmp/x"})
    assert base["env"] == {}
    for name, value in (("OMP_NUM_THREADS", "1"), ("CUDA_VISIBLE_DEVICES", "3"), ("TORCHINDUCTOR_MAX_AUTOTUNE", "1")):
        assert plan.environment_key({name: value})["env"] == {name: value}
    key = plan.execution_key(before, {}, "src", None, base, "code")
    assert key == plan.execution_key(before, {}, "src", None, dict(base), "code")
    assert key != plan.execution_key(before, {}, "src", None, {**base, "torch": "2.12.0"}, "code")
    assert key != plan.execution_key(before, {}, "src", "torch", base, "code")
    assert key != plan.execution_key(before, {}, "src", None, base, "other code under test")


def test_an_integer_too_large_for_a_float_is_refused_in_one_line_per_field(tmp_path, capsys):
    big = "1" + "0" * 400  # YAML reads it as an int; as a float it overflows
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "hypotheses").mkdir()
    cell = nbformat.v4.new_code_cell("n: int = 1", metadata={"tags": ["parameters"]})
    kernel = {"kernelspec": {"name": "perfkit", "display_name": "perfkit", "language": "python"}}
    nbformat.write(nbformat.v4.new_notebook(cells=[cell], metadata=kernel), str(tmp_path / "notebooks" / "p.ipynb"))
    (tmp_path / "hypotheses" / "h.yaml").write_text(
        f"id: h\nclaim: c\nrationale: r\nexpect:\n  kind: at_most\n  metric: m\n  value: {big}\n  unit: ms\n"
        f"probe:\n  notebook: p.ipynb\n  params: {{n: {big}}}\n  resources: {{GPU: {big}}}\n"
    )
    assert main(["--root", str(tmp_path), "validate"]) == 2
    err = capsys.readouterr().err
    assert "h.yaml:7: expect.value: expected a finite number, got an integer of about 401 digits" in err
    assert "probe.params.n: an integer of about 401 digits is too large" in err
    assert "probe.resources.GPU: expected a number from 0 to 1024, got an integer of about 401 digits" in err
    assert "Traceback" not in err


def test_a_notebooks_folder_linked_out_of_the_project_and_an_overlong_id_are_refused(tmp_path, capsys):
    outside = tmp_path / "outside"
    shutil.copytree(FIXTURES / "project" / "notebooks", outside)
    root = tmp_path / "project"
    (root / "hypotheses").mkdir(parents=True)
    (root / "notebooks").symlink_to(outside, target_is_directory=True)
    record = (FIXTURES / "project" / "hypotheses" / "fx-share.yaml").read_text()
    (root / "hypotheses" / "fx-share.yaml").write_text(record)
    long_id = "x" * 121
    (root / "hypotheses" / f"{long_id}.yaml").write_text(record.replace("id: fx-share", f"id: {long_id}"))
    assert main(["--root", str(root), "validate"]) == 2
    err = capsys.readouterr().err
    assert "fx-share.yaml" in err and "notebooks/ is a link to" in err and "outside the project" in err
    assert f"{long_id}.yaml:1: id: {long_id!r} is not a slug (at most 120" in err


def test_a_flat_record_of_more_values_than_a_record_needs_is_refused_while_scanned(tmp_path, capsys):
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "hypotheses").mkdir()
    values = ", ".join(["1"] * 120_000)  # 360 kB: under the byte limit, far over what a record holds
    (tmp_path / "hypotheses" / "h.yaml").write_text(f"id: h\nclaim: c\nprobe:\n  params: {{n: [{values}]}}\n")
    assert main(["--root", str(tmp_path), "validate"]) == 2
    assert "hypotheses/h.yaml:4: more than 10,000 values; a record never needs that" in capsys.readouterr().err
