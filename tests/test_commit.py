"""A run's ledger change is one unit: staged, journaled, applied under a lock, rolled forward after a kill."""

import json
import os
import platform
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest
import records
from records import fixture_project, of, shared_cores, shared_machine

from perfkit.cli import main
from perfkit.experiment.outputs import ledger
from perfkit.experiment.records.hypothesis import load_hypotheses
from perfkit.experiment.records.results import RunResults, load_all_results
from perfkit.experiment.run import commit, rundir
from perfkit.paths import Project


@pytest.fixture
def project(tmp_path) -> Project:
    return fixture_project(tmp_path, "fx-cost-confirmed", "fx-share")


def run_results(project, run_id, value) -> RunResults:
    return records.run_results(run_id, *(of(h, "confirmed", value, executions=()) for h in load_hypotheses(project)))


def staged(project, results: RunResults) -> None:
    """What the runner does before committing: a plot per hypothesis in the staging folder."""
    where = commit.staging_dir(project, results.run_id) / "plots"
    where.mkdir(parents=True, exist_ok=True)
    for h in results.hypotheses:
        (where / f"{h.id}.png").write_bytes(f"plot of {results.run_id}".encode())


def commit_run(project, results):
    staged(project, results)
    with commit.locked(project):
        commit.finish_pending(project)
        return commit.apply(project, results, load_all_results(project))


def test_a_commit_writes_results_plots_and_ledger_and_check_passes(project, capsys):
    commit_run(project, run_results(project, "20250101-000001", 1.0))
    assert [r.run_id for r in load_all_results(project)] == ["20250101-000001"]
    assert {p.read_bytes() for p in project.plots_dir.glob("*.png")} == {b"plot of 20250101-000001"}
    assert main(["--root", str(project.root), "ledger", "--check"]) == 0
    assert commit.pending(project) == []


def test_a_commit_killed_between_results_and_plots_is_flagged_and_rolled_forward(project, monkeypatch, capsys):
    commit_run(project, run_results(project, "20250101-000001", 1.0))
    second = run_results(project, "20250101-000002", 2.0)
    staged(project, second)
    real = commit.write_atomic

    def killed_at_the_first_plot(path, data):
        if Path(path).suffix == ".png":
            raise SystemExit("killed")  # stands in for SIGKILL: nothing after this line runs
        real(path, data)

    monkeypatch.setattr(commit, "write_atomic", killed_at_the_first_plot)
    with pytest.raises(SystemExit), commit.locked(project):
        commit.apply(project, second, load_all_results(project))
    monkeypatch.setattr(commit, "write_atomic", real)
    # the new result landed, its plots did not: the check must not say "up to date"
    assert {p.read_bytes() for p in project.plots_dir.glob("*.png")} == {b"plot of 20250101-000001"}
    assert main(["--root", str(project.root), "ledger", "--check"]) == 1
    assert "run 20250101-000002 was stopped while committing" in capsys.readouterr().out
    assert main(["--root", str(project.root), "ledger"]) == 0
    assert "finished committing run 20250101-000002" in capsys.readouterr().out
    assert {p.read_bytes() for p in project.plots_dir.glob("*.png")} == {b"plot of 20250101-000002"}
    assert main(["--root", str(project.root), "ledger", "--check"]) == 0


def _pending(project, run_id: str, journal: dict | None = None, results: bytes | None = None) -> Path:
    """A commit a killed run left pending, as it would lie on disk (possibly tampered with)."""
    stage = commit.staging_dir(project, run_id)
    staged(project, run_results(project, run_id, 3.0))
    body = results if results is not None else json.dumps(run_results(project, run_id, 3.0).to_json()).encode()
    if body != b"<missing>":
        (stage / "results.json").write_bytes(body)
    (stage / "journal.json").write_text(
        json.dumps(journal or {"format_version": 1, "run_id": run_id, "status": "pending"})
    )
    return stage


@pytest.mark.parametrize(
    ("journal", "results", "words"),
    [
        ({"format_version": 1, "run_id": "../../../outside", "status": "pending"}, None, "is not its run's"),
        (None, b"<missing>", "cannot read the staged results"),
        (None, b'{"format_version": 8, "run_id": "20250101-000009", "hypotheses": [{"id": 7}]}', "unusable"),
        (None, b"not json", "unusable"),
    ],
)
def test_an_unusable_pending_commit_is_one_line_and_writes_nothing(project, capsys, journal, results, words):
    commit_run(project, run_results(project, "20250101-000001", 1.0))
    before = {p: p.read_bytes() for p in project.root.rglob("*") if p.is_file() and "runs" not in p.parts}
    _pending(project, "20250101-000009", journal, results)
    assert main(["--root", str(project.root), "ledger"]) == 2
    err = capsys.readouterr().err
    assert words in err and "delete runs/20250101-000009/commit" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    after = {p: p.read_bytes() for p in project.root.rglob("*") if p.is_file() and "runs" not in p.parts}
    assert after == before  # no result, plot or ledger line was written, inside the project or out of it
    assert not (project.root.parent / "outside.json").exists()


def test_concurrent_commits_never_lose_a_ledger_row(project):
    ids = [f"20250101-00001{n}" for n in range(6)]
    errors = []

    def one(run_id):
        try:
            commit_run(project, run_results(project, run_id, 1.0))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    stored = load_all_results(project)
    assert sorted(r.run_id for r in stored) == ids  # every run's rows are in the stored history
    text = project.ledger_path.read_text()
    assert all(run_id in text for run_id in ids[-ledger.SHOWN_HISTORY :])  # the latest are shown
    assert "1 earlier measurement" in text  # the rest are counted, not dropped
    assert text == ledger.render(stored)


def test_the_lock_makes_a_second_holder_wait(project):
    order = []

    def second():
        with commit.locked(project):
            order.append("second")

    with commit.locked(project):
        waiter = threading.Thread(target=second)
        waiter.start()
        waiter.join(0.3)
        order.append("first released")
    waiter.join(5)
    assert order == ["first released", "second"]


def test_a_killed_runs_manifest_is_marked_by_the_next_run(project):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    started = psutil.Process(dead.pid).create_time()
    dead.wait()
    alive = {"host": platform.node(), "pid": os.getpid(), "started": psutil.Process().create_time()}
    gone = {**alive, "pid": dead.pid, "started": started}
    manifests = {
        "20250101-000001": {"status": "running", "process": gone, "format_version": 3},
        "20250101-000002": {"status": "running", "process": alive, "format_version": 3},  # still going: left alone
        "20250101-000003": {"status": "running", "process": {**alive, "host": "another-host"}, "format_version": 3},
        "20250101-000004": {"status": "finished", "process": gone, "format_version": 3},
        "20250101-000005": {"status": "running", "process": gone, "format_version": 1, "git": {"commit": "abc"}},
        "20250101-000006": {"status": "running", "process": gone, "format_version": 99},  # newer: not ours to rewrite
        "20250101-000007": {"status": "running", "process": gone},  # no version: unreadable, left as it is
    }
    for run_id, manifest in manifests.items():
        (project.runs_dir / run_id).mkdir(parents=True)
        (project.runs_dir / run_id / "manifest.json").write_text(json.dumps(manifest))
    assert rundir.mark_killed_runs(project, by="20250101-000009") == ["20250101-000001", "20250101-000005"]
    got = {p.parent.name: json.loads(p.read_text()) for p in project.runs_dir.glob("*/manifest.json")}
    assert got["20250101-000001"]["status"] == "killed"
    assert got["20250101-000001"]["format_version"] == rundir.MANIFEST_VERSION
    assert f"process {dead.pid} ended without finishing" in got["20250101-000001"]["killed_note"]
    upgraded = got["20250101-000005"]  # upgraded before it was written at the current version
    assert upgraded["format_version"] == rundir.MANIFEST_VERSION and "git" not in upgraded
    assert upgraded["environment"]["perfkit"]["git"] == {"commit": "abc"}
    assert [got[r]["status"] for r in sorted(got)][1:4] == ["running", "running", "finished"]
    assert got["20250101-000006"] == manifests["20250101-000006"] and got["20250101-000007"]["status"] == "running"


def test_a_folder_a_run_cannot_write_stops_it_before_any_probe(project, capsys):
    project.ledger_dir.mkdir(parents=True)
    project.results_dir.write_text("a file where the results folder should be")
    assert main(["--root", str(project.root), "run", "--all", "--quick"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("perfkit: cannot write in hypotheses/ledger/results/") and "nothing was run" in err
    assert "Traceback" not in err
    assert not project.runs_dir.exists() or not any(project.runs_dir.iterdir())


def test_a_full_disk_stops_a_run_with_one_line_and_keeps_what_was_measured(project, monkeypatch, capsys):
    import errno

    shared_machine(monkeypatch)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(project.results_dir / "x.json"))

    monkeypatch.setattr(commit, "apply", full)
    code = main(["--root", str(project.root), "run", "fx-cost-confirmed", "--quick", "--replicates", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert err.startswith("perfkit: cannot write hypotheses/ledger/results/x.json: No space left on device; 1 of 1")
    assert "nothing was added to the ledger" in err
    (manifest,) = [json.loads(p.read_text()) for p in project.runs_dir.glob("*/manifest.json")]
    assert manifest["status"] == "failed" and len(manifest["executions"]) == 1
    assert list(project.runs_dir.glob("*/executions/*/r0/executed.ipynb"))  # the evidence is kept


def test_a_committed_results_file_its_reader_refuses_stops_a_run_before_any_probe(project, capsys):
    commit_run(project, run_results(project, "20250101-000001", 1.0))
    broken = project.results_dir / "20250101-000001.json"
    broken.write_text(broken.read_text().replace('"fx-share"', '"fx share"'))
    assert main(["--root", str(project.root), "run", "--all"]) == 2
    err = capsys.readouterr().err
    assert "20250101-000001.json" in err and len(err.strip().splitlines()) == 1
    assert [p.name for p in project.runs_dir.iterdir() if p.is_dir()] == ["20250101-000001"]  # no run began


def test_a_disk_that_fills_mid_run_never_leaves_the_manifest_running(project, monkeypatch, capsys):
    import errno

    shared_machine(monkeypatch)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(project.results_dir / "x.json"))

    real = rundir.write_json

    def manifest_cannot_grow(path, data, *, version):
        if Path(path).name == "manifest.json" and data.get("status") != "running":
            raise OSError(errno.ENOSPC, "No space left on device")  # the final manifest needs new blocks
        real(path, data, version=version)

    monkeypatch.setattr(commit, "apply", full)
    monkeypatch.setattr(rundir, "write_json", manifest_cannot_grow)
    assert main(["--root", str(project.root), "run", "fx-cost-confirmed", "--quick", "--replicates", "1"]) == 2
    assert "cannot write" in capsys.readouterr().err
    (manifest,) = [json.loads(p.read_text()) for p in project.runs_dir.glob("*/manifest.json")]
    assert manifest["status"] == "failed" and "No space left on device" in manifest["failed_note"]
    assert manifest["run_id"] and manifest["process"]  # what a later run needs to tell it from a live one


def test_ctrl_c_while_plotting_stops_the_run_even_when_plotting_code_swallows_it(project, monkeypatch, capsys):
    import signal
    import time

    from perfkit.experiment.records import plots

    shared_cores(monkeypatch)
    real = plots.render

    def interrupted_render(*args, **kwargs):
        try:  # as a KeyboardInterrupt raised inside a weakref callback is printed and dropped
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
        except KeyboardInterrupt:
            pass
        return real(*args, **kwargs)

    monkeypatch.setattr(plots, "render", interrupted_render)
    assert main(["--root", str(project.root), "run", "fx-share", "--replicates", "1", "--max-replicates", "1"]) == 130
    assert "interrupted" in capsys.readouterr().err
    assert load_all_results(project) == []  # nothing half-written


@pytest.mark.parametrize(("hid", "code"), [("fx-cost-confirmed", 0), ("fx-share", 0), ("no-such-claim", 125)])
def test_check_answers_git_bisect_and_never_writes_the_ledger(project, monkeypatch, capsys, hid, code):
    shared_cores(monkeypatch)
    before = {p: p.read_bytes() for p in project.hypotheses_dir.rglob("*") if p.is_file()}
    assert main(["--root", str(project.root), "check", hid, "--replicates", "1", "--max-replicates", "1"]) == code
    out, err = capsys.readouterr()
    assert f"exit {code}" in out if code != 125 or hid != "no-such-claim" else "125: skip this commit" in err
    assert {p: p.read_bytes() for p in project.hypotheses_dir.rglob("*") if p.is_file()} == before
