"""JUnit XML of a run and of a diff: valid against the format's schema, counted right, escaped, stable."""

import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import pytest
import records
import xmlschema

from perfkit.experiment.outputs.junit import diff_junit, run_junit
from perfkit.experiment.records import compare as diff
from perfkit.experiment.records.results import Execution, HypothesisResult, RunResults

SCHEMA = xmlschema.XMLSchema10(str(Path(__file__).parent / "data" / "junit.xsd"))
HOSTILE = 'a<b & "c" ]]> d\x00e\x1bf\ud800g'
VISIBLE = ('a<b & "c" ]]> d', "e", "f", "g")  # what is left of HOSTILE around the forbidden characters


def execution(run_id: str, wall_s: float | None, *, reused: bool = False, key: str = "k") -> Execution:
    return records.execution(key=key, notebook="probe.ipynb", wall_s=wall_s, run_id=run_id, reused=reused)


def result(hid: str, verdict: str, value: float = 1.0, run_id: str = "r1", **fields) -> HypothesisResult:
    given = {"claim": f"{hid} costs about 1 ms", "executions": (execution(run_id, 2.0, key=hid),), **fields}
    return records.result(hid, verdict, value, run_id, hash="h-" + hid, plot=None, **given)


def run(run_id: str, *hypotheses: HypothesisResult, **fields) -> RunResults:
    fields.setdefault("created", "2025-01-02T03:04:05Z")
    given = {"command": "perfkit run --quick", "git_commit": "abc123", "git_dirty": False, **fields}
    return records.run_results(run_id, *hypotheses, **given)


def four_verdicts() -> RunResults:
    return run(
        "r1",
        result("d-refuted", "refuted", 2.0, off_by="2x too slow"),
        result(
            "a-confirmed",
            "confirmed",
            executions=(execution("r1", 1.5), execution("r0", 10.0, reused=True)),
            not_reproduced="the last verdict's interval was [3, 4] ms",
        ),
        result("c-inconclusive", "inconclusive", reason="the interval straddles the bound", executions=()),
        result("b-error", "error", reason="the notebook raised KeyError", measured=None),
        machine="8-core test CPU",
    )


def parsed(xml: str) -> ET.Element:
    assert xml.startswith('<?xml version="1.0" encoding="UTF-8"?>\n')
    SCHEMA.validate(xml)  # raises on anything the format does not allow
    return ET.fromstring(xml.encode("utf-8"))


def cases(root: ET.Element) -> dict[str, ET.Element]:
    return {c.get("name"): c for c in root.iter("testcase")}


def test_run_maps_each_verdict_to_its_junit_outcome_with_counts_times_and_properties():
    root = parsed(run_junit(four_verdicts()))
    (suite,) = root.findall("testsuite")
    for node in (root, suite):
        assert [node.get(k) for k in ("tests", "failures", "errors", "skipped")] == ["4", "1", "1", "1"]
    assert suite.get("name") == "perfkit run r1" and suite.get("timestamp") == "2025-01-02T03:04:05Z"
    assert suite.get("time") == "5.500"  # 1.5 + 2 + 2: the reused 10 s were not spent by this run
    properties = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert properties["run_id"] == "r1" and properties["mode"] == "quick" and properties["git_commit"] == "abc123"
    assert properties["machine"] == "8-core test CPU" and "profile" not in properties
    assert [c.get("name") for c in suite.iter("testcase")] == ["a-confirmed", "b-error", "c-inconclusive", "d-refuted"]
    by = cases(root)
    assert {c.get("classname") for c in by.values()} == {"perfkit.cost"}
    assert by["a-confirmed"].get("time") == "1.500" and by["c-inconclusive"].get("time") == "0.000"
    assert [child.tag for child in by["a-confirmed"]] == ["system-out"]  # passed, but its note is visible
    assert "not reproduced: the last verdict's interval was [3, 4] ms" in by["a-confirmed"].findtext("system-out")
    failure = by["d-refuted"].find("failure")
    assert failure.get("type") == "refuted"
    message = failure.get("message")
    assert message.startswith("refuted: ") and "2 ms [1.8, 2.2]" in message and "2x too slow" in message
    assert "95%" in message and "≈ 1 ms (×2)" in message and "\n" not in message
    assert "claim: d-refuted costs about 1 ms\n" in failure.text and "off by: 2x too slow\n" in failure.text
    error = by["b-error"].find("error")
    assert error.get("type") == "error" and "nothing measured" in error.get("message")
    assert "the notebook raised KeyError" in error.get("message")


def test_skipped_carries_its_reason_and_a_sequential_interval_its_own_level():
    data = four_verdicts()
    refuted = next(h for h in data.hypotheses if h.verdict == "refuted")
    looked_twice = replace(refuted, measured=replace(refuted.measured, confidence=0.9833))
    by = cases(parsed(run_junit(replace(data, hypotheses=(looked_twice, *data.hypotheses[1:])))))
    message = by["d-refuted"].find("failure").get("message")
    assert "98.3%" in message and "95%" not in message
    skipped = by["c-inconclusive"].find("skipped")
    assert "the interval straddles the bound" in skipped.get("message")
    assert "reason: the interval straddles the bound\n" in skipped.text


def test_the_same_results_give_the_same_bytes_whatever_their_order():
    data = four_verdicts()
    first = run_junit(data)
    assert run_junit(data) == first
    assert run_junit(replace(data, hypotheses=data.hypotheses[::-1])) == first


def test_hostile_strings_stay_valid_parseable_and_visible():
    h = result(HOSTILE, "refuted", claim=HOSTILE, reason=HOSTILE, off_by=HOSTILE, warnings=(HOSTILE,))
    xml = run_junit(run(HOSTILE, h, machine=HOSTILE, created=HOSTILE))
    assert "\x00" not in xml and "\x1b" not in xml and "<![CDATA[" not in xml
    xml.encode("utf-8")  # no lone surrogate left
    root = parsed(xml)
    (case,) = root.iter("testcase")
    suite = root.find("testsuite")
    failure = case.find("failure")
    assert suite.get("timestamp") is None  # not a date: left out rather than invalid
    for shown in (case.get("name"), suite.get("name"), failure.get("message"), failure.text):
        assert all(part in shown for part in VISIBLE), shown
    assert {p.get("value") for p in suite.iter("property") if p.get("name") in ("run_id", "machine")} == {
        "\ufffd".join(VISIBLE)
    }
    base = [run("r1", result(HOSTILE, "confirmed"))]
    out = parsed(diff_junit(diff.compare(base, base), HOSTILE, diff.DEFAULT_FAIL_ON))
    assert all(part in out.find("testsuite").get("name") for part in VISIBLE)


VALID = """<testsuites><testsuite name="s" tests="1"><testcase name="t" classname="c" time="0.5">{}</testcase>
</testsuite></testsuites>"""


@pytest.mark.parametrize(
    "inner",
    [
        '<failure message="m"/><error message="m"/>',  # two outcomes
        "<skipped/><skipped/>",
        "<flaky/>",  # an element the format does not have
        "<system-out>o</system-out><failure/>",  # out of order
    ],
)
def test_the_schema_refuses_what_the_format_does_not_allow(inner):
    assert SCHEMA.is_valid(VALID.format('<failure message="m" type="t">text</failure><system-out>o</system-out>'))
    assert not SCHEMA.is_valid(VALID.format(inner))


def test_the_schema_refuses_unknown_attributes_and_roots():
    assert not SCHEMA.is_valid(VALID.format("").replace('time="0.5"', 'time="0.5" colour="red"'))
    assert not SCHEMA.is_valid(VALID.format("").replace('time="0.5"', 'time="fast"'))
    assert not SCHEMA.is_valid("<report><testsuite name='s'/></report>")
    assert not SCHEMA.is_valid("<testsuites><testsuite/></testsuites>")  # a suite has a name


def diff_changes() -> list[diff.Change]:
    base = [
        run(
            "r1",
            result("flip", "confirmed", 1.0),
            result("same", "confirmed"),
            result("vague", "inconclusive", reason="too noisy"),
            result("broken", "error", reason="no GPU"),
        )
    ]
    current = [*base, run("r2", result("flip", "refuted", 3.0, "r2"), result("new", "confirmed", run_id="r2"))]
    return diff.compare(base, current)


def test_diff_fails_the_flip_the_gate_names_and_passes_the_rest():
    changes = diff_changes()
    assert [(c.kind, c.id) for c in changes] == [
        ("flip", "flip"),
        ("added", "new"),
        ("unchanged", "broken"),
        ("unchanged", "same"),
        ("unchanged", "vague"),
    ]
    root = parsed(diff_junit(changes, "main", ("refuted", "error", "not-reproduced")))
    suite = root.find("testsuite")
    assert suite.get("name") == "perfkit diff against main"
    assert [suite.get(k) for k in ("tests", "failures", "errors", "skipped")] == ["5", "1", "1", "1"]
    by = cases(root)
    assert [child.tag for child in by["flip"]] == ["failure"]
    failure = by["flip"].find("failure")
    assert failure.get("type") == "flip" and by["flip"].get("classname") == "perfkit.diff.flip"
    message = failure.get("message")
    assert "confirmed → refuted" in message and "1 ms [0.9, 1.1]" in message and "3 ms [2.7, 3.3]" in message
    assert "factor 3x" in message and "base run: r1\ncurrent run: r2\n" in failure.text
    assert [child.tag for child in by["new"]] == [
        "system-out"
    ] and "added: — → confirmed; before —, after 1 ms [0.9, 1.1]" in by["new"].findtext("system-out")
    assert [child.tag for child in by["same"]] == ["system-out"]
    assert by["broken"].find("error").get("type") == "error" and "no GPU" in by["broken"].find("error").get("message")
    assert "too noisy" in by["vague"].find("skipped").get("message")


def test_diff_asks_the_gate_what_fails():
    changes = diff_changes()
    root = parsed(diff_junit(changes, "main", ()))
    assert root.find("testsuite").get("failures") == "0" and [c.tag for c in cases(root)["flip"]] == ["system-out"]
    added_refuted = diff.compare([], [run("r1", result("new", "refuted"))])
    assert cases(parsed(diff_junit(added_refuted, "main", ("refuted",))))["new"].find("failure").get("type") == "added"
    assert diff_junit(changes, "main", ("refuted",)) == diff_junit(changes, "main", ("refuted",))


FIXTURES = Path(__file__).parent / "fixtures" / "project"


def test_perfkit_run_junit_writes_a_schema_valid_file_with_a_case_per_hypothesis(tmp_path, monkeypatch):
    import shutil

    from records import shared_machine

    from perfkit.cli import main

    shutil.copytree(FIXTURES, tmp_path / "p")
    shared_machine(monkeypatch)
    out = tmp_path / "reports" / "perfkit.xml"
    out.parent.mkdir()
    ids = ["fx-cost-confirmed", "fx-cost-refuted", "fx-raises"]
    code = main(["--root", str(tmp_path / "p"), "run", *ids, "--quick", "--replicates", "1", "--junit", str(out)])
    assert code == 1  # fx-raises is an error verdict
    SCHEMA.validate(str(out))
    suite = ET.parse(out).getroot().find("testsuite")
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert sorted(cases) == sorted(ids)
    assert cases["fx-cost-confirmed"].find("failure") is None and cases["fx-cost-confirmed"].find("error") is None
    assert cases["fx-cost-refuted"].find("failure").get("message").startswith("refuted: measured ")
    assert "below the expected" in cases["fx-cost-refuted"].find("failure").get("message")
    assert "ValueError: probe failed on purpose" in cases["fx-raises"].find("error").get("message")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("3", "1", "1")


def test_perfkit_diff_junit_writes_a_schema_valid_file_with_the_gate_as_failures(tmp_path):
    import shutil

    from perfkit.cli import main
    from perfkit.paths import Project

    shutil.copytree(FIXTURES, tmp_path / "p")
    project = Project(tmp_path / "p")
    base = tmp_path / "base"
    base.mkdir()
    records.store(project, "1", result("fx-cost-confirmed", "confirmed", 1.0, "1"))
    shutil.copy(project.results_dir / "1.json", base / "1.json")
    records.store(project, "2", result("fx-cost-confirmed", "refuted", 5.0, "2"), result("fx-share", "confirmed"))
    out = tmp_path / "diff.xml"
    assert main(["--root", str(project.root), "diff", str(base), "--junit", str(out)]) == 1  # the flip fails the gate
    SCHEMA.validate(str(out))
    cases = {c.get("name"): c for c in ET.parse(out).getroot().iter("testcase")}
    assert cases["fx-cost-confirmed"].find("failure").get("type") == "flip"
    assert cases["fx-share"].find("failure") is None  # added as confirmed: not a failure of the default gate


def _hostile_target(tmp_path: Path, kind: str) -> Path:
    import os

    target = tmp_path / "out" / "perfkit.xml"
    target.parent.mkdir()
    precious = tmp_path / "precious.txt"
    precious.write_text("mine")
    if kind == "symlink":
        target.symlink_to(precious)
    elif kind == "dangling symlink":
        target.symlink_to(tmp_path / "nowhere.xml")
    elif kind == "folder":
        target.mkdir()
    elif kind == "pipe":
        os.mkfifo(target)
    elif kind == "device":
        return Path("/dev/null")
    elif kind == "no folder":
        return tmp_path / "missing" / "perfkit.xml"
    return target


KINDS = ["symlink", "dangling symlink", "folder", "pipe", "device", "no folder"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("command", ["run", "diff"])
def test_a_junit_path_that_is_not_a_regular_file_is_refused_before_anything_runs(tmp_path, capsys, kind, command):
    """A rename over FILE would replace what is there (a root run's `--junit /dev/null` made /dev/null a
    regular file): anything but a regular file or nothing is refused in one line, exit 2, nothing run."""
    import shutil
    import stat

    from perfkit.cli import main

    shutil.copytree(FIXTURES, tmp_path / "p")
    target = _hostile_target(tmp_path, kind)
    before = target.lstat() if target.is_symlink() or target.exists() else None
    args = ["run", "fx-cost-confirmed", "--quick", "--replicates", "1"] if command == "run" else ["diff"]
    code = main(["--root", str(tmp_path / "p"), *args, "--junit", str(target)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"perfkit: --junit {target}: ") and err.count("\n") == 1, err
    assert not (tmp_path / "p" / "runs").exists()  # nothing measured
    if before is not None:
        after = target.lstat()
        assert stat.S_IFMT(after.st_mode) == stat.S_IFMT(before.st_mode) and after.st_ino == before.st_ino
    assert (tmp_path / "precious.txt").read_text() == "mine"


@pytest.mark.parametrize("kind", ["symlink", "folder", "pipe"])
def test_the_report_page_is_written_only_over_a_regular_file(tmp_path, capsys, kind):
    import shutil

    from perfkit.cli import main

    shutil.copytree(FIXTURES, tmp_path / "p")
    target = _hostile_target(tmp_path, kind)  # out/perfkit.xml: the report's index.html stands in
    page = target.parent / "index.html"
    target.rename(page)
    code = main(["--root", str(tmp_path / "p"), "report", "--out", str(page.parent)])
    err = capsys.readouterr().err
    assert code == 2 and str(page) in err and err.count("\n") == 1, err
    assert (tmp_path / "precious.txt").read_text() == "mine"
