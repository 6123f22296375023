"""Records that try to take the reviewer's machine down are refused quickly, as file:line: message."""

import time

import pytest

from perfkit.cli import main

GOOD = """id: {id}
claim: The work is fast.
rationale: Because.
expect: {{kind: at_most, metric: t, unit: ms, value: 1}}
probe: {{notebook: p.ipynb}}
"""

BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
    f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
    for i in range(9)
)

CASES = {
    "billion-laughs": (BOMB, 1, "anchors and aliases"),  # the first anchor, before anything expands
    "recursive-alias": ("id: &x [*x]\n", 1, "anchors and aliases"),
    "python-tag": ("id: !!python/name:os.system x\n", 1, "tags are not allowed"),
    "unknown-tag": ("id: !mine x\n", 1, "tags are not allowed"),
    "merge-key": ("base: {a: 1}\nid: x\n<<: {claim: c}\n", 3, "merge keys"),
    "list-key": ("? [a, b]\n: 1\n", 1, "keys must be plain names"),
    "bad-date": ("id: x\nclaim: c\nrationale: r\nwhen: 2024-13-45\n", 4, "cannot read this value"),
    "deep": ("id: " + "[" * 30 + "]" * 30 + "\n", 1, "nested deeper than"),
    "huge-int": (
        "id: x\nclaim: c\nrationale: r\nexpect: {kind: at_most, metric: t, unit: ms, value: 1"
        + "0" * 5000
        + "}\nprobe: {notebook: p.ipynb}\n",
        4,
        "a value of 5,001 characters",
    ),
}


def project(tmp_path, name, text):
    (tmp_path / "hypotheses").mkdir()
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "hypotheses" / f"{name}.yaml").write_text(text)
    return tmp_path


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_hostile_record_is_refused_quickly_with_file_and_line(tmp_path, capsys, name):
    text, line, message = CASES[name]
    root = project(tmp_path, name, text)
    started = time.monotonic()
    assert main(["--root", str(root), "validate"]) == 2
    elapsed = time.monotonic() - started
    err = capsys.readouterr().err
    assert f"hypotheses/{name}.yaml:{line}: " in err and message in err, err
    assert "Traceback" not in err
    assert elapsed < 5  # well under a second here; the bound only catches an explosion


def test_a_record_larger_than_a_record_needs_is_refused_before_it_is_read(tmp_path, capsys):
    root = project(tmp_path, "big", GOOD.format(id="big") + "# " + "x" * 1_100_000 + "\n")
    assert main(["--root", str(root), "validate"]) == 2
    assert "hypotheses/big.yaml: the record is larger than 1,000,000 bytes" in capsys.readouterr().err


def valid_project(tmp_path, text):
    import shutil
    from pathlib import Path

    fixtures = Path(__file__).parent / "fixtures" / "project"
    (tmp_path / "hypotheses").mkdir(parents=True)
    shutil.copytree(fixtures / "notebooks", tmp_path / "notebooks")
    (tmp_path / "hypotheses" / "h.yaml").write_text(text)
    return tmp_path


RECORD = """id: h
claim: c
rationale: r
expect: {{kind: at_most, metric: work, unit: ms, value: {value}}}
probe: {{notebook: {notebook}, params: {{mode: ok, n: {n}}}}}
"""


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(value=".inf", notebook="fixture_probe.ipynb", n=1000), "expected a finite number, got inf"),
        (dict(value=".nan", notebook="fixture_probe.ipynb", n=1000), "expected a finite number"),
        (dict(value=1, notebook="../../etc/x.ipynb", n=1000), "resolves outside notebooks/"),
        (dict(value=1, notebook="/tmp/outside.ipynb", n=1000), "resolves outside notebooks/"),
        (dict(value=1, notebook="fixture_probe.ipynb", n=".inf"), "is not a finite number"),
        (dict(value=1, notebook="fixture_probe.ipynb", n="2024-01-01"), "got date"),
    ],
)
def test_values_a_claim_cannot_mean_are_refused_at_validate(tmp_path, capsys, fields, message):
    root = valid_project(tmp_path, RECORD.format(**fields))
    assert main(["--root", str(root), "validate"]) == 2
    err = capsys.readouterr().err
    assert "hypotheses/h.yaml:" in err and message in err, err


@pytest.mark.parametrize(
    "expect, message",
    [
        (
            "{kind: at_most, metric: work, unit: tok/s, value: 1}",
            "expect.unit: 'tok/s' measures token rate, but fixture_probe.ipynb records work in 'ms' (time)",
        ),
        ("{kind: at_most, metric: work, unit: ms, value: 1, min_samples: 2000000}", "an integer from 1 to 1000000"),
        ("{kind: at_most, metric: work, unit: ms, value: 1, min_samples: 0}", "an integer from 1 to 1000000"),
    ],
)
def test_a_unit_of_another_dimension_and_impossible_sample_counts_are_refused(tmp_path, capsys, expect, message):
    text = f"id: h\nclaim: c\nrationale: r\nexpect: {expect}\nprobe: {{notebook: fixture_probe.ipynb}}\n"
    root = valid_project(tmp_path, text)
    assert main(["--root", str(root), "validate"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hypotheses/h.yaml:4: ") and message in err, err


@pytest.mark.parametrize(
    "resources, message",
    [("{GPU: -1}", "expected a number from 0 to 1024"), ("{'G P U': 1}", "a resource is a name"), ("[GPU]", "mapping")],
)
def test_probe_resources_are_checked(tmp_path, capsys, resources, message):
    text = (
        "id: h\nclaim: c\nrationale: r\nexpect: {kind: at_most, metric: work, unit: ms, value: 1}\n"
        f"probe: {{notebook: fixture_probe.ipynb, resources: {resources}}}\n"
    )
    root = valid_project(tmp_path, text)
    assert main(["--root", str(root), "validate"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hypotheses/h.yaml:5: probe.resources") and message in err, err


def test_a_unit_of_the_same_dimension_passes(tmp_path, capsys):
    root = valid_project(tmp_path, RECORD.format(value=1, notebook="fixture_probe.ipynb", n=1000).replace("ms,", "us,"))
    assert main(["--root", str(root), "validate"]) == 0


def test_a_probe_linked_from_outside_and_dangling_records_are_errors(tmp_path, capsys):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "evil.ipynb").write_text("{}")
    root = valid_project(tmp_path / "p", RECORD.format(value=1, notebook="evil.ipynb", n=1000))
    (root / "notebooks" / "evil.ipynb").symlink_to(outside / "evil.ipynb")
    (root / "hypotheses" / "gone.yaml").symlink_to(tmp_path / "missing.yaml")
    (outside / "far.yaml").write_text("id: far\n")
    (root / "hypotheses" / "far.yaml").symlink_to(outside / "far.yaml")
    assert main(["--root", str(root), "validate"]) == 2
    err = capsys.readouterr().err
    assert "'evil.ipynb' resolves outside notebooks/" in err
    assert "hypotheses/gone.yaml: a symbolic link to nothing (dangling)" in err
    assert "hypotheses/far.yaml: a symbolic link to" in err and "outside the project" in err


def test_a_parameter_override_gets_the_same_checks(tmp_path):
    from perfkit.errors import UserError
    from perfkit.experiment.run import runner
    from perfkit.experiment.run.options import RunOptions, parse_overrides
    from perfkit.paths import Project

    root = valid_project(tmp_path, RECORD.format(value=1, notebook="fixture_probe.ipynb", n=1000))
    with pytest.raises(UserError, match="not a finite number"):
        runner.run(Project(root), RunOptions(ids=("h",), overrides=parse_overrides(["n=.inf"])), out=lambda s: None)


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda h: h["measured"].update(unit="furlongs"), "hypotheses[0].measured.unit"),
        (lambda h: h["measured"].update(value="nan"), "hypotheses[0].measured.value"),
        (lambda h: h.update(plot="../../../../etc/passwd"), "hypotheses[0].plot"),
    ],
)
def test_stored_results_are_read_back_as_strictly_as_records(tmp_path, edit, field):
    import json

    from records import sample_results

    from perfkit.errors import RecordError
    from perfkit.experiment.records import results
    from perfkit.paths import Project

    project = Project(tmp_path)
    path = results.write_results(project, sample_results())
    data = json.loads(path.read_text())
    edit(data["hypotheses"][0])
    path.write_text(json.dumps(data))
    with pytest.raises(RecordError) as caught:
        results.load_all_results(project)
    assert caught.value.field == field


def test_a_duplicated_hypothesis_in_a_results_file_is_refused(tmp_path):
    import json

    from records import sample_results

    from perfkit.errors import RecordError
    from perfkit.experiment.records import results
    from perfkit.paths import Project

    project = Project(tmp_path)
    path = results.write_results(project, sample_results())
    data = json.loads(path.read_text())
    data["hypotheses"].append(data["hypotheses"][0])
    path.write_text(json.dumps(data))
    with pytest.raises(RecordError, match="appears twice"):
        results.load_all_results(project)


def test_results_and_plots_are_never_written_through_a_link_out_of_the_project(tmp_path):
    from perfkit.errors import UserError
    from perfkit.experiment.outputs import ledger
    from perfkit.paths import Project

    root = valid_project(tmp_path / "p", RECORD.format(value=1, notebook="fixture_probe.ipynb", n=1000))
    (tmp_path / "elsewhere").mkdir()
    (root / "hypotheses" / "ledger").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UserError, match="hypotheses/ledger leads outside the project"):
        ledger.write(Project(root))
    assert not list((tmp_path / "elsewhere").iterdir())


def test_a_probe_that_records_a_negative_duration_gets_an_error_not_a_verdict():
    from records import execution, hypothesis

    from perfkit.experiment.records.kinds import expectation
    from perfkit.experiment.records.verdict import Verdict
    from perfkit.experiment.run.judging import judge
    from perfkit.samples import MetricRecord

    h = hypothesis(expectation(kind="at_most", metric="t", unit="ms", value=1.0))
    j = judge(h, [execution(MetricRecord(name="t", unit="ms", samples=(-1.0,) * 10))])
    assert j.verdict is Verdict.ERROR and "negative durations" in j.reason


def test_a_malformed_record_stops_a_run_before_anything_is_made(tmp_path, capsys):
    root = valid_project(tmp_path, "id: h\nclaim: c\nrationale: r\nexpect: {kind: at_most, metric: work, unit: ms}\n")
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    assert main(["--root", str(root), "run", "--all", "--quick"]) == 2
    assert "hypotheses/h.yaml:4:" in capsys.readouterr().err
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before  # no runs/, no ledger folders
