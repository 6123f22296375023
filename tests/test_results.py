import json
import math

import pytest
from records import sample_results

from perfkit import files
from perfkit.errors import RecordError
from perfkit.experiment.records import results
from perfkit.experiment.records.results import Execution
from perfkit.paths import Project
from perfkit.samples import MetricRecord


def test_run_results_round_trip(tmp_path):
    project = Project(tmp_path)
    original = sample_results()
    path = results.write_results(project, original)
    text = path.read_text()
    assert json.loads(text)["format_version"] == results.FORMAT_VERSION
    assert '"std": "nan"' in text  # strict JSON: NaN travels as a string
    (loaded,) = results.load_all_results(project)
    assert loaded.hypotheses[0].metrics[0].std != loaded.hypotheses[0].metrics[0].std  # NaN back
    assert loaded.hypotheses[0].measured == original.hypotheses[0].measured
    assert loaded.hypotheses[0].floor == original.hypotheses[0].floor
    assert loaded.hypotheses[0].executions == original.hypotheses[0].executions
    assert files.dumps({**loaded.to_json(), "format_version": results.FORMAT_VERSION}) == text


def test_execution_round_trip(tmp_path):
    record = Execution(
        key="k",
        notebook="p.ipynb",
        params={"n": 1},
        status="timeout",
        wall_s=3.0,
        run_id="r",
        reason="timed out after 1 s in cell 3",
        cell_index=3,
        records=(MetricRecord(name="t", unit="ms", samples=(1.0, math.inf), at={"n": 1}),),
    )
    results.write_execution(tmp_path / "execution.json", record)
    back = results.read_execution(tmp_path / "execution.json")
    assert back == record


def test_newer_format_is_refused_and_older_is_upgraded(tmp_path, monkeypatch):
    project = Project(tmp_path)
    path = results.write_results(project, sample_results())
    data = json.loads(path.read_text())
    data["format_version"] = results.FORMAT_VERSION + 1
    path.write_text(json.dumps(data))
    with pytest.raises(RecordError, match="newer than this perfkit"):
        results.load_all_results(project)

    # a format history entry: version 0 called the verdict "outcome"
    def upgrade_0(old):
        for h in old["hypotheses"]:
            h["verdict"] = h.pop("outcome")
        return old

    monkeypatch.setitem(results.UPGRADES, 0, upgrade_0)
    monkeypatch.setitem(results.UPGRADES, 1, lambda old: old)
    data["format_version"] = 0
    data["hypotheses"][0]["outcome"] = data["hypotheses"][0].pop("verdict")
    path.write_text(json.dumps(data))
    (loaded,) = results.load_all_results(project)
    assert loaded.hypotheses[0].verdict == "refuted"


def test_malformed_results_name_the_file_and_field(tmp_path):
    project = Project(tmp_path)
    path = results.write_results(project, sample_results())
    data = json.loads(path.read_text())
    data["hypotheses"][0]["verdict"] = "maybe"
    path.write_text(json.dumps(data))
    with pytest.raises(RecordError) as caught:
        results.load_all_results(project)
    assert caught.value.field == "hypotheses[0].verdict"
    assert caught.value.path.endswith("20250101-000000.json")


IMPOSSIBLE = [  # (where in the stored file, the value, the field the error names): numbers their meaning forbids
    (("pace_s",), 1e-300, "pace_s"),  # it once starved the run: "would have needed about 3993806709... s"
    (("pace_s",), 0, "pace_s"),
    (("hypotheses", 0, "measured", "confidence"), 5, "hypotheses[0].measured.confidence"),
    (("hypotheses", 0, "measured", "confidence"), 0.01, "hypotheses[0].measured.confidence"),
    (("hypotheses", 0, "measured", "between"), 1.5, "hypotheses[0].measured.between"),
    (("hypotheses", 0, "measured", "between_machines"), -0.1, "hypotheses[0].measured.between_machines"),
    (("hypotheses", 0, "measured", "replicates"), 0, "hypotheses[0].measured.replicates"),
    (("hypotheses", 0, "measured", "value"), 0.5, "hypotheses[0].measured.value"),  # outside [0.16, 0.21]
    (("hypotheses", 0, "metrics", 0, "between"), "nan", "hypotheses[0].metrics[0].between"),
    (("hypotheses", 0, "metrics", 0, "n"), 0, "hypotheses[0].metrics[0].n"),
    (("hypotheses", 0, "metrics", 0, "replicates"), 4, "hypotheses[0].metrics[0].replicates"),  # of n=3
    (("hypotheses", 0, "executions", 0, "wall_s"), -1, "hypotheses[0].executions[0].wall_s"),
    (("hypotheses", 0, "executions", 0, "setup_s"), 1e12, "hypotheses[0].executions[0].setup_s"),
]


@pytest.mark.parametrize(("where", "value", "field"), IMPOSSIBLE)
def test_a_stored_number_its_meaning_forbids_is_refused_naming_file_and_field(tmp_path, where, value, field):
    """A hand-edited or corrupted results file is read as strictly as a record: a share outside [0, 1], a
    level outside (50%, 100%), a pace or a time no machine has, an estimate outside its own interval."""
    project = Project(tmp_path)
    path = results.write_results(project, sample_results())
    data = json.loads(path.read_text())
    node = data
    for step in where[:-1]:
        node = node[step]
    node[where[-1]] = value
    path.write_text(json.dumps(data))
    with pytest.raises(RecordError) as caught:
        results.load_all_results(project)
    assert caught.value.field.endswith(field) and caught.value.path.endswith("20250101-000000.json"), caught.value


def test_format_1_files_are_upgraded_to_one_execution_shape(tmp_path):
    """A committed version-1 results file (`cached`) and a version-1 execution.json (`cached_from`)."""
    project = Project(tmp_path)
    data = sample_results().to_json()
    data["format_version"] = 1
    (ref,) = data["hypotheses"][0]["executions"]
    for key in ("reason", "cell_index", "ename", "evalue", "reused"):
        ref.pop(key)
    ref.update(cached=True, run_id="20240101-000000")
    project.results_dir.mkdir(parents=True)
    (project.results_dir / "20250101-000000.json").write_text(json.dumps(data))
    (loaded,) = results.load_all_results(project)
    (x,) = loaded.hypotheses[0].executions
    assert x.reused and x.run_id == "20240101-000000" and x.wall_s == 2.5

    old = {
        "format_version": 1,
        "key": "k",
        "notebook": "p.ipynb",
        "params": {},
        "status": "ok",
        "wall_s": 1.0,
        "run_id": "20250102-000000",
        "cached_from": "20240101-000000",
        "records": [],
    }
    (tmp_path / "execution.json").write_text(json.dumps(old))
    back = results.read_execution(tmp_path / "execution.json")
    assert back.reused and back.run_id == "20240101-000000"
