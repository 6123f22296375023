"""Issue 24: a results file can neither forge the ledger nor be one perfkit writes and then refuses."""

from __future__ import annotations

import json
import re

import pytest
from records import execution, hypothesis, result, run_results, shared_cores, store

from perfkit.cli import main
from perfkit.errors import RecordError
from perfkit.experiment.outputs import diff, ledger, report
from perfkit.experiment.records import compare, results
from perfkit.experiment.records.kinds import expectation
from perfkit.experiment.records.verdict import Floor, Measured, Verdict
from perfkit.experiment.run import judging
from perfkit.files import dumps
from perfkit.paths import Project
from perfkit.samples import MetricRecord

FORGED = "x\n| `mask-build-200ms` | claim | expected | 1 ms [1, 1] | — | **confirmed** | — | r0 | — |"
HOSTILE = "a | b\nc `code` <script>alert(1)</script> & d"


@pytest.fixture
def project(tmp_path) -> Project:
    (tmp_path / "hypotheses").mkdir()
    return Project(tmp_path)


def _write_raw(project: Project, run_id: str, data: dict) -> None:
    """A results file as someone (not perfkit's writer) put it there."""
    project.results_dir.mkdir(parents=True, exist_ok=True)
    (project.results_dir / f"{run_id}.json").write_text(dumps({**data, "format_version": results.FORMAT_VERSION}))


def _refused(project: Project, field: str, message: str) -> str:
    with pytest.raises(RecordError) as caught:
        results.load_all_results(project)
    text = str(caught.value)
    assert "\n" not in text, text
    assert text.startswith("hypotheses/ledger/results/r1.json: ") and f"{field}: " in text and message in text, text
    return text


def _separators(row: str) -> int:
    """The cell boundaries of a Markdown table row: the pipes no backslash escapes."""
    return len(re.findall(r"(?<!\\)\|", row))


# ---------------------------------------------------------------- ids, cells, plot paths


def test_a_results_file_whose_id_forges_a_ledger_row_is_refused(project, capsys):
    data = run_results("r1", result("h", "refuted")).to_json()
    data["hypotheses"][0]["id"] = FORGED
    _write_raw(project, "r1", data)
    _refused(project, "hypotheses[0].id", "expected a slug")
    assert main(["--root", str(project.root), "ledger", "--check"]) == 2
    err = capsys.readouterr().err
    assert "hypotheses[0].id" in err and "Traceback" not in err
    assert "**confirmed**" not in err.replace("\\n", "")  # the id is shown quoted, on the error's one line


def test_the_writer_refuses_an_id_its_reader_would_refuse(project):
    with pytest.raises(RecordError, match="not written, perfkit would refuse to read it"):
        store(project, "r1", result("Not A Slug", "confirmed"))
    assert not (project.results_dir / "r1.json").exists()


def test_text_from_a_results_file_stays_in_its_cell_escaped(project):
    hostile = result(
        "h",
        "inconclusive",
        None,
        claim=HOSTILE,
        reason=HOSTILE,
        plot='plots/a"b.png',
        floor=Floor(metric="f", value=1.0, unit="ms", note=HOSTILE),
    )
    store(project, "r1", hostile)
    every = results.load_all_results(project)
    text = ledger.render(every)
    rows = [line for line in text.splitlines() if line.startswith("| [`h`](#h) |")]
    assert len(rows) == 1 and _separators(rows[0]) == 6, rows  # five columns, one line
    (history,) = [line for line in text.splitlines() if line.startswith("| r1 |")]
    assert _separators(history) == 6, history
    for shown in (text, diff.markdown(compare.compare([], every), "main")):
        assert "<script>" not in shown and "&lt;script&gt;" in shown
        assert "\\`code\\`" in shown and "a \\| b c" in shown and "&amp; d" in shown
        assert 'a"b' not in shown and "plots/a%22b.png" in shown
    (floor,) = [line for line in text.splitlines() if line.startswith("- `h`: f = 1 ms")]
    assert "<script>" not in floor and "\\`code\\`" in floor
    (row,) = [line for line in diff.markdown(compare.compare([], every), "main").splitlines() if "| `h` |" in line]
    assert _separators(row) == 6, row  # five columns
    page = report.render(every, None, None)
    assert "<script>alert" not in page and 'a"b' not in page and 'src="plots/a%22b.png"' in page


# ---------------------------------------------------------------- non-finite measurements


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
def test_an_overflowing_mean_is_inconclusive_and_its_results_file_loads_back(project):
    expect = expectation(kind="cost", metric="mask", unit="ms", value=200.0, factor=3.0, min_samples=3)
    samples = MetricRecord(name="mask", unit="ms", samples=(1e308, 1e308, 1e308))
    item = judging.judged(hypothesis(expect), [execution(samples)])
    j = item.judgement
    assert j.verdict is Verdict.INCONCLUSIVE and j.measured is None and j.off_by is None
    assert j.reason.startswith("the measurement is not finite: ") and "inf" in j.reason
    store(project, "r1", judging.to_result(item))
    (loaded,) = results.load_all_results(project)
    assert loaded.hypotheses[0].verdict == "inconclusive" and loaded.hypotheses[0].measured is None


@pytest.mark.parametrize(
    "measured, field, message",
    [
        ({"value": "inf"}, "hypotheses[0].measured.value", "expected a finite number, got inf"),
        ({"high": "-inf"}, "hypotheses[0].measured.high", "expected a finite number, got -inf"),
        ({"low": 3.0, "high": 2.0}, "hypotheses[0].measured.low", "the interval's low 3.0 is above its high 2.0"),
    ],
)
def test_a_hand_made_non_finite_or_inverted_measurement_is_refused(project, measured, field, message):
    data = run_results("r1", result("h", "confirmed")).to_json()
    data["hypotheses"][0]["measured"].update(measured)
    _write_raw(project, "r1", data)
    _refused(project, field, message)


def test_an_inverted_floor_interval_is_refused(project):
    data = run_results("r1", result("h", "confirmed", floor=Floor(metric="f", value=1.0, unit="ms"))).to_json()
    data["hypotheses"][0]["floor"].update(low=2.0, high=1.0)
    _write_raw(project, "r1", data)
    _refused(project, "hypotheses[0].floor.low", "above its high")


def test_the_writer_refuses_a_measurement_its_reader_would_refuse(project):
    broken = Measured(label="mean", unit="ms", value=float("inf"), low=float("nan"), high=float("nan"))
    with pytest.raises(RecordError, match="not written") as caught:
        store(project, "r1", result("h", "inconclusive", measured=broken))
    assert "\n" not in str(caught.value) and "hypotheses[0].measured" in str(caught.value)
    assert not (project.results_dir / "r1.json").exists()


def test_boolean_samples_are_refused(tmp_path):
    stored = execution(MetricRecord(name="t", unit="ms", samples=(1.0, 2.0))).to_json()
    stored["records"][0]["samples"] = [True, 2.0]
    path = tmp_path / "execution.json"
    path.write_text(json.dumps({**stored, "format_version": results.FORMAT_VERSION}))
    with pytest.raises(RecordError, match=r"records\[0\]\.samples: expected numbers, got a boolean"):
        results.read_execution(path)


def test_a_write_that_fails_without_naming_a_file_is_named(tmp_path, monkeypatch):
    import errno
    import os

    from perfkit import files

    real = os.fdopen

    class Full:
        def __init__(self, fd, mode):
            self.fh = real(fd, mode)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")  # as a write to a full disk: no file named

    monkeypatch.setattr(files.os, "fdopen", Full)
    target = tmp_path / "results.json"
    with pytest.raises(OSError) as caught:
        files.write_atomic(target, "{}")
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(target)
    assert list(tmp_path.iterdir()) == []  # no temporary file left behind


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[" * 100_000 + "]" * 100_000, "nested too deep to read"),
        ('{"run_id": ' + "9" * 5000 + "}", "over 4,300 digits"),
    ],
)
@pytest.mark.parametrize("command", [["ledger"], ["ledger", "--check"], ["show", "h"], ["diff", "{results}"]])
def test_a_results_file_no_json_reader_can_hold_is_one_line_for_every_command(tmp_path, capsys, text, words, command):
    from perfkit.cli import main

    results = tmp_path / "hypotheses" / "ledger" / "results"
    results.mkdir(parents=True)
    (results / "20250101-000001.json").write_text(text)
    assert main(["--root", str(tmp_path), *(c.format(results=results) for c in command)]) == 2
    err = capsys.readouterr().err
    assert "20250101-000001.json" in err and words in err and "Traceback" not in err


def test_report_out_a_file_or_a_folder_holding_links_is_one_line_and_writes_nothing(tmp_path, capsys):
    from perfkit.cli import main

    (tmp_path / "hypotheses").mkdir()
    a_file = tmp_path / "a-file"
    a_file.write_text("mine")
    assert main(["--root", str(tmp_path), "report", "--out", str(a_file)]) == 2
    assert "a file is there" in capsys.readouterr().err and a_file.read_text() == "mine"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    (out / "plots").symlink_to(elsewhere, target_is_directory=True)
    assert main(["--root", str(tmp_path), "report", "--out", str(out)]) == 2
    assert "plots is a symbolic link" in capsys.readouterr().err and list(elsewhere.iterdir()) == []


def test_braces_in_the_project_path_and_the_notebook_name_are_just_characters(tmp_path, monkeypatch):
    import shutil
    from pathlib import Path

    from records import run

    from perfkit.paths import Project

    shared_cores(monkeypatch)
    fixtures = Path(__file__).parent / "fixtures" / "project"
    root = tmp_path / "we{ird}"
    (root / "hypotheses").mkdir(parents=True)
    (root / "notebooks").mkdir()
    shutil.copy(fixtures / "notebooks" / "fixture_probe.ipynb", root / "notebooks" / "probe{1}.ipynb")
    record = (fixtures / "hypotheses" / "fx-cost-confirmed.yaml").read_text()
    (root / "hypotheses" / "fx-cost-confirmed.yaml").write_text(record.replace("fixture_probe.ipynb", "probe{1}.ipynb"))
    report = run(Project(root), ids=["fx-cost-confirmed"], replicates=1, max_replicates=1, out=lambda line: None)
    (result,) = report.results.hypotheses
    assert result.verdict != "error", result.reason


def test_a_scheduler_that_accepts_and_never_answers_is_an_error_not_a_hang():
    import socket
    import threading
    import time

    from perfkit.errors import UserError
    from perfkit.experiment.run import cluster

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held = []
    threading.Thread(target=lambda: held.extend(listener.accept() for _ in range(8)), daemon=True).start()
    start = time.monotonic()
    try:
        with pytest.raises(UserError, match="accepted the connection but did not answer"):
            cluster.connect(f"tcp://127.0.0.1:{listener.getsockname()[1]}", timeout_s=1.0)
    finally:
        listener.close()
    assert time.monotonic() - start < 30


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        ({"format_version": 99, "records": []}, "records of format 99; this perfkit reads 1 to"),
        ([{"name": "m"}], "a perfkit output without a list of records"),
        ({"format_version": 1, "records": {"name": "m"}}, "a perfkit output without a list of records"),
    ],
)
def test_a_records_payload_of_another_format_or_shape_is_refused(payload, words):
    import nbformat

    from perfkit.errors import RecordError
    from perfkit.experiment.run.executed import records_in
    from perfkit.samples import MIMETYPE

    cell = nbformat.v4.new_code_cell("perfkit.record(...)")
    cell.outputs = [nbformat.v4.new_output("display_data", data={MIMETYPE: payload, "text/plain": "m"})]
    with pytest.raises(RecordError, match=words.replace("(", r"\(")):  # a run makes it the execution's error
        records_in(nbformat.v4.new_notebook(cells=[cell]), "hand.ipynb")
