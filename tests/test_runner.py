"""End to end: real papermill executions of the fixture probe, in a copy of the fixture project.

The executions are shared by every test in this module (kernel start-up is seconds each).
"""

import json
import re
import shutil
import time
from pathlib import Path

import nbformat
import pytest
from records import FIXTURES, fixture_project, run, shared_cores, shared_machine

from perfkit.cli import main
from perfkit.errors import UserError
from perfkit.experiment.outputs import ledger
from perfkit.experiment.records import replicates as policy
from perfkit.experiment.records import results
from perfkit.experiment.run import execute as executor
from perfkit.experiment.run import executed, priors, profiling, rundir, runner, schedule
from perfkit.paths import Project

ROOT = Path(__file__).resolve().parents[1]
OK = ["fx-cost-confirmed", "fx-cost-refuted", "fx-floor", "fx-scaling", "fx-share", "fx-speedup"]


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    root = tmp_path_factory.mktemp("project")
    fixture_project(root)
    project = Project(root)
    lines: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        # other people edit perfkit while tests run (the cache key must not move under this module), and the
        # suite shares the machine with other work
        shared_machine(mp)
        report = run(project, all=True, quick=True, jobs=2, timeout_s=15, replicates=1, out=lines.append)
    # what the ledger was right after the run, before any test of this module changes the project
    AFTER_FIRST.update(check=main(["--root", str(root), "ledger", "--check"]), ledger=project.ledger_path.read_text())
    return project, report, lines


AFTER_FIRST: dict = {}  # `first` fills it


@pytest.fixture(scope="module")
def measured_once(tmp_path_factory):
    """A project of its own whose hypotheses that end ok were measured once (as `first` measures them):
    what a second run finds when nothing else touched the project, whatever ran before."""
    project = fixture_project(tmp_path_factory.mktemp("once"))
    report, lines = rerun(project, ids=OK, jobs=2)
    return project, report, lines


def rerun(project, **kwargs):
    lines: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        shared_machine(mp)
        if "unfit" in kwargs:  # a test's own fitness verdicts
            mp.setattr(schedule.fitness, "unfit", kwargs.pop("unfit"))
        kwargs.setdefault("replicates", 1)
        report = run(project, quick=True, out=lines.append, **kwargs)
    return report, lines


def verdicts(report):
    return {h.id: (h.verdict, h.reason) for h in report.results.hypotheses}


def test_every_failure_mode_gets_its_verdict_and_the_rest_completes(first):
    project, report, lines = first
    got = verdicts(report)
    assert got["fx-raises"][0] == "error"
    assert got["fx-raises"][1].startswith(
        'fixture_probe.ipynb cell 4 (`if mode == "raise":`): ValueError: probe failed on purpose'
    )
    assert got["fx-dies"] == ("error", 'kernel died in cell 6 (`if mode == "die":`)')
    assert got["fx-sleeps"] == ("error", 'timed out after 15 s in cell 5 (`if mode == "sleep":`)')
    beats = [line for line in lines if " running  fixture_probe.ipynb mode=sleep" in line]
    assert beats and ' s, in cell 5 (`if mode == "sleep":`)' in beats[0]  # a probe running long says so
    assert got["fx-silent"] == ("inconclusive", "probe recorded no samples for work")
    assert {k: v[0] for k, v in got.items() if k in OK} == {
        "fx-cost-confirmed": "confirmed",
        "fx-cost-refuted": "refuted",
        "fx-floor": "confirmed",
        "fx-scaling": "confirmed",
        "fx-share": "confirmed",
        "fx-speedup": "confirmed",
    }
    refuted = next(h for h in report.results.hypotheses if h.id == "fx-cost-refuted")
    assert refuted.off_by == "200x below the expected 0.2 s"
    assert report.exit_code == 1  # error verdicts make the run fail loudly
    assert report.executed == 6 and report.reused == 0  # 10 hypotheses, 6 distinct executions


def test_progress_lines_and_evidence_are_kept(first):
    project, report, lines = first
    assert sum(1 for line in lines if " start    fixture_probe.ipynb" in line) == 6
    # torch in each probe gets the cores that are free (OMP_NUM_THREADS), unless the user set it
    assert all(
        re.search(r" \(\d+ threads on CPU [0-9,-]+(, after waiting \d+ s for free cores)?\)$", line)
        for line in lines
        if " start    " in line
    )
    assert any("finished fixture_probe.ipynb mode=sleep" in line and "TIMEOUT" in line for line in lines)
    run_dir = project.runs_dir / report.run_id
    executions = [json.loads(p.read_text()) for p in run_dir.glob("executions/*/r0/execution.json")]
    assert len(executions) == 6
    sleeper = next(e for e in executions if e["params"] == {"mode": "sleep"})
    partial = nbformat.read(str(run_dir / "executions" / sleeper["key"] / "r0" / "executed.ipynb"), as_version=4)
    assert partial.cells[5].metadata.papermill.status == "running"  # the partial notebook, as it was
    raiser = next(e for e in executions if e["params"] == {"mode": "raise"})
    assert "probe failed on purpose" in (run_dir / "executions" / raiser["key"] / "r0" / "traceback.txt").read_text()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "finished"
    assert set(manifest["versions"]) >= {"python", "torch", "papermill"}
    assert "git" not in manifest  # once, in the environment: the project's checkout (here none: a temp folder)
    assert manifest["environment"]["perfkit"]["git"]["commit"] is None
    assert all(e["wall_s"] > 0 for e in manifest["executions"])
    for h in report.results.hypotheses:
        assert (project.plots_dir / f"{h.id}.png").read_bytes().startswith(b"\x89PNG")
        assert (run_dir / "plots" / f"{h.id}.png").is_file()


def test_utilization_trace_per_execution(first):
    project, report, _ = first
    run_dir = project.runs_dir / report.run_id
    exec_dirs = sorted((run_dir / "executions").glob("*/r0"))
    assert len(exec_dirs) == len({x.key for h in report.results.hypotheses for x in h.executions}) > 0
    for exec_dir in exec_dirs:
        assert (exec_dir / "utilization.json").is_file() and (exec_dir / "utilization.png").is_file()


def test_ledger_check_passes_after_the_run(first):
    assert AFTER_FIRST["check"] == 0
    text = AFTER_FIRST["ledger"]
    assert "| [`fx-cost-refuted`](#fx-cost-refuted) | ❌ refuted |" in text and "200x below the expected 0.2 s" in text
    assert "timed out after 15 s in cell 5" in text


def test_second_run_reuses_every_execution_and_force_reexecutes(measured_once):
    project, report, _ = measured_once
    again, lines = rerun(project, ids=OK, jobs=2)  # as the first run: the same thread count, the same key
    assert again.executed == 0 and again.reused == 2  # n=1000 and n=4000 (no kernel started: none timed here)
    assert sum(1 for line in lines if line.startswith("[reused]") and f"from run {report.run_id}" in line) == 2
    assert verdicts(again) == {k: v for k, v in verdicts(report).items() if k in OK}
    # a history of measurements, not of runs: nothing new measured, nothing new stored
    assert not (project.results_dir / f"{again.run_id}.json").exists()
    assert any(line.startswith("nothing new was measured") for line in lines)
    assert again.run_id not in project.ledger_path.read_text()
    forced, lines = rerun(project, ids=["fx-share"], force=True)
    assert forced.executed == 1 and forced.reused == 0
    assert any("start    fixture_probe.ipynb mode=ok n=1000" in line for line in lines)


def test_a_change_of_what_decides_speed_reexecutes_and_a_saved_notebook_stays_warm(first, monkeypatch):
    project, _, _ = first
    rerun(project, ids=["fx-share"])  # warm, whatever ran before
    notebook = project.notebooks_dir / "fixture_probe.ipynb"
    saved = nbformat.read(str(notebook), as_version=4)
    for i, cell in enumerate(saved.cells):  # what Run All and save in JupyterLab leaves behind
        if cell.cell_type == "code":
            cell.execution_count = i
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="run by hand\n")]
        else:
            cell.source += "\n\nA note added while reading."
    nbformat.write(saved, str(notebook))
    warm, _ = rerun(project, ids=["fx-share"])
    assert warm.executed == 0 and warm.reused == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "7")  # a value no earlier test leaves behind
    threads, _ = rerun(project, ids=["fx-share"])
    assert threads.executed == 1 and threads.reused == 0
    manifest = json.loads((project.runs_dir / threads.run_id / "manifest.json").read_text())
    assert manifest["cache_key"]["env"]["OMP_NUM_THREADS"] == "7"
    assert set(manifest["cache_key"]) >= {"python", "torch", "cuda_runtime", "machine"}


def test_editing_an_expectation_makes_it_stale_until_rejudged(first, capsys):
    project, _, _ = first
    path = project.hypotheses_dir / "fx-cost-confirmed.yaml"
    original = path.read_text()
    try:
        path.write_text(original.replace("value: 1\n", "value: 100\n"))
        problems, _ = ledger.check(project)
        assert (
            [p for p in problems if "stale" in p]
            == [
                p
                for p in problems
                if p.startswith("fx-cost-confirmed: stale: hypotheses/fx-cost-confirmed.yaml changed")
            ]
            != []
        )
        report, _ = rerun(project, ids=["fx-cost-confirmed"], jobs=2)  # as `first` measured it: the same threads
        assert report.reused == 1 and verdicts(report)["fx-cost-confirmed"][0] == "refuted"
        assert ledger.check(project)[0] == []
    finally:
        path.write_text(original)
    # judged again as it is now (its measurement reused): the project is left as this test found it, a
    # ledger `--check` passes for whatever test of this module runs next
    rerun(project, ids=["fx-cost-confirmed"], jobs=2)
    assert ledger.check(project)[0] == []


def test_param_overrides_are_checked(first):
    project, _, _ = first
    with pytest.raises(UserError, match="no selected probe declares it"):
        rerun(project, ids=["fx-share"], overrides={"contex": 1})
    with pytest.raises(UserError, match="expected an integer"):
        rerun(project, ids=["fx-share"], overrides={"n": "many"})
    with pytest.raises(UserError, match="or pass --all"):
        rerun(project)


def test_shipped_mask_build_probe_runs(tmp_path, monkeypatch):
    shared_cores(monkeypatch)  # other tests may be running beside this one
    shutil.copytree(ROOT / "hypotheses", tmp_path / "hypotheses", ignore=shutil.ignore_patterns("ledger", "LEDGER.md"))
    shutil.copytree(ROOT / "notebooks", tmp_path / "notebooks")
    lines: list[str] = []
    report = run(
        Project(tmp_path),
        ids=["mask-build-compact-10x"],
        replicates=1,
        overrides={"contexts": [8192, 32768], "batches": [8], "repeat": 5},
        out=lines.append,
    )
    (result,) = report.results.hypotheses
    # 11-12x apart on a 2-core machine, against a bound of 10x: one replicate of 5 repeats may straddle it
    # beside the suite's other worker, so the verdict asked is only that it was measured and not refuted
    assert all(x.status == "ok" for x in result.executions) and result.verdict != "refuted", lines
    assert result.measured is not None and result.measured.value > 4


def test_profile_torch_saves_a_trace_in_the_execution(first):
    project, _, _ = first
    report, lines = rerun(project, ids=["fx-cost-confirmed"], profile="torch")
    assert report.executed == 1  # the profiled execution is a different one from the plain run
    (exec_dir,) = (project.runs_dir / report.run_id / "executions").glob("*/r0")
    assert (exec_dir / "torch_trace.json.gz").is_file()
    executed = nbformat.read(str(exec_dir / "executed.ipynb"), as_version=4)
    injected = [c for c in executed.cells if profiling.INJECTED_TAG in c.metadata.get("tags", [])]
    assert len(injected) == 2
    assert verdicts(report)["fx-cost-confirmed"][0] == "confirmed"


def test_an_interrupted_run_says_so_in_its_manifest_with_what_ended(first, monkeypatch):
    project, report, _ = first

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    rerun(project, ids=["fx-share"])  # warm at this run's thread count, whatever ran before
    monkeypatch.setattr(runner, "write", interrupted)  # Ctrl-C after the executions, while writing
    before = {p.name for p in project.results_dir.iterdir()}
    with pytest.raises(KeyboardInterrupt):
        rerun(project, ids=["fx-share"])
    latest = max(p for p in project.runs_dir.iterdir() if p.is_dir())
    manifest = json.loads((latest / "manifest.json").read_text())
    assert manifest["status"] == "interrupted" and manifest["format_version"] == rundir.MANIFEST_VERSION
    (execution,) = manifest["executions"]
    assert execution["reused"] and execution["run_id"] != latest.name and execution["status"] == "ok"
    assert {p.name for p in project.results_dir.iterdir()} == before  # no results for a run that did not finish


def test_a_finished_manifest_records_the_executions_in_one_shape(first):
    project, report, _ = first
    manifest = json.loads((project.runs_dir / report.run_id / "manifest.json").read_text())
    assert manifest["status"] == "finished" and len(manifest["executions"]) == 6
    stored = json.loads(next((project.runs_dir / report.run_id / "executions").glob("*/r0/execution.json")).read_text())
    shape = set(stored) - {"records", "format_version"}
    assert all(set(x) == shape for x in manifest["executions"])
    ref = report.results.hypotheses[0].executions[0].to_json(with_records=False)
    assert set(ref) == shape


def test_replicates_run_in_rounds_are_told_their_index_and_a_busy_one_is_rerun(first):
    project, _, _ = first
    busy_once = {"left": 1}

    def unfit(
        trace, window=None, limits=None
    ):  # the first replicate to finish was measured on a busy machine; the re-run is fine
        if busy_once["left"]:
            busy_once["left"] -= 1
            return "machine busy: 1.0 cores used by other processes on average"
        return None

    report, lines = rerun(project, ids=["fx-cost-confirmed", "fx-speedup"], force=True, replicates=2, unfit=unfit)
    starts = [line for line in lines if " start    " in line]
    assert len(starts) == 2 + 1  # one execution (both read it) x two replicates, and one re-run
    assert ["replicate 0" in s for s in starts[:2]] == [True, False]  # round 0, then round 1
    assert [s.split()[0] for s in starts] == ["[1/2]", "[2/2]", "[3/3]"]  # the re-run's counter goes on
    assert any(line.startswith("re-running 1 replicates") for line in lines)
    run_dir = project.runs_dir / report.run_id
    assert len(list(run_dir.glob("executions/*/r*-unfit"))) == 1  # the busy attempt's evidence is kept
    told = nbformat.read(str(next(run_dir.glob("executions/*/r1")) / "executed.ipynb"), as_version=4)
    assert "replicate = 1" in next(c.source for c in told.cells if "injected-parameters" in c.metadata.get("tags", []))
    (result,) = [h for h in report.results.hypotheses if h.id == "fx-cost-confirmed"]
    assert result.verdict == "confirmed" and all(m.replicates == 2 for m in result.metrics)
    assert {x.replicate for x in result.executions} == {0, 1} and not any(x.unfit for x in result.executions)


def test_a_verdict_resting_on_a_busy_machine_is_inconclusive_and_the_fit_verdict_stands(first):
    from perfkit.experiment.records.compare import compare, failing
    from perfkit.experiment.records.results import load_all_results

    project, _, _ = first
    rerun(project, ids=["fx-cost-confirmed"], force=True)  # a fit measurement first
    before = load_all_results(project)
    plot = (project.plots_dir / "fx-cost-confirmed.png").read_bytes()
    row = next(
        line for line in project.ledger_path.read_text().splitlines() if line.startswith("| [`fx-cost-confirmed`]")
    )
    report, lines = rerun(
        project,
        ids=["fx-cost-confirmed"],
        force=True,
        replicates=2,
        unfit=lambda trace, window=None, limits=None: "machine busy: 1.2 cores used by other processes on average",
    )
    (result,) = report.results.hypotheses
    assert result.verdict == "inconclusive"
    assert result.reason.startswith(
        "the machine was not fit to measure on: machine busy: 1.2 cores used by other processes "
        "on average during 2 of 2 replicates; measured through the load, these replicates give "
    )
    ledger_text = project.ledger_path.read_text()
    assert row in ledger_text.splitlines()  # the table keeps the fit measurement, its run and its plot
    assert (project.plots_dir / "fx-cost-confirmed.png").read_bytes() == plot
    history = ledger_text.split("### `fx-cost-confirmed`")[1].split("###")[0]
    assert (
        f"| {report.run_id} |" in history and "not measured: machine busy; the standing measurement is kept" in history
    )
    assert f"{report.run_id} | quick" in history and "**flip**" not in history.split(report.run_id)[1].split("\n")[0]
    (change,) = [c for c in compare(before, load_all_results(project)) if c.id == "fx-cost-confirmed"]
    assert change.kind == "not-measured" and change.current.verdict == "confirmed"
    assert (
        change.attempt.startswith("not measured: machine busy: 1.2 cores used by other processes on average during 2")
        and report.run_id in change.attempt
    )
    assert failing([change], ("refuted", "error", "not-reproduced")) == [] and failing([change], ("not-measured",))


def test_a_closed_pipe_never_stops_the_measurement(first):
    project, _, _ = first
    said = []

    def closed_after_two(line):
        if len(said) >= 2:
            raise BrokenPipeError
        said.append(line)

    report, _ = rerun(project, ids=["fx-cost-confirmed"], force=True)  # a baseline that runs
    with pytest.MonkeyPatch.context() as mp:
        shared_machine(mp)
        piped = run(project, ids=["fx-cost-confirmed"], quick=True, force=True, replicates=1, out=closed_after_two)
    assert len(said) == 2  # the reader left after two lines
    assert piped.results.hypotheses[0].verdict == "confirmed"  # and the run still judged and stored it
    assert (project.results_dir / f"{piped.run_id}.json").is_file()


def test_ctrl_c_says_what_was_kept_and_exits_130(first, monkeypatch, capsys):
    project, _, _ = first

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "judge_all", interrupted)
    monkeypatch.setattr(runner, "source_tree_hash", lambda: "fixed-source")
    assert main(["--root", str(project.root), "run", "fx-share", "--quick", "--replicates", "1"]) == 130
    err = capsys.readouterr().err
    assert "interrupted: 1 of 1 probe executions had ended and are kept under" in err
    assert "Traceback" not in err


def test_stale_temporary_files_are_flagged_and_cleaned(first):
    import os

    project, _, _ = first
    leftover = project.results_dir / ".20250101-000000.json.abcd.tmp"
    leftover.write_text("{")
    problems, _ = ledger.check(project)
    assert any("left by an interrupted write" in p for p in problems)
    os.utime(leftover, (time.time() - 3600, time.time() - 3600))
    ledger.write(project)
    assert not leftover.exists()


def test_sigterm_stops_a_run_kills_its_probes_and_keeps_the_manifest(first):
    import signal
    import subprocess
    import sys

    import psutil

    project, _, _ = first
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "perfkit.cli",
            "--root",
            str(project.root),
            "run",
            "fx-sleeps",
            "--quick",
            "--replicates",
            "1",
            "--force",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    for line in proc.stdout:  # wait for the probe to start
        if " start    " in line:
            break
    time.sleep(3)
    children = psutil.Process(proc.pid).children(recursive=True)
    assert children  # the executor and its kernel
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted: 0 of 1 probe executions had ended" in err and "Traceback" not in err
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive  # nothing the run started outlives it
    latest = max(p for p in project.runs_dir.iterdir() if p.is_dir())
    assert json.loads((latest / "manifest.json").read_text())["status"] == "interrupted"


def test_a_probe_printing_more_than_the_cap_is_stored_cut_with_a_note(first):
    project, _, _ = first
    report, _ = rerun(project, ids=["fx-cost-confirmed"], overrides={"mode": "loud"})
    (executed,) = (project.runs_dir / report.run_id).glob("executions/*/r0/executed.ipynb")
    assert executed.stat().st_size < executor.OUTPUT_CAP_BYTES + 2**20  # 20 MB printed
    nb = nbformat.read(str(executed), as_version=4)
    texts = [o.get("text", "") for c in nb.cells for o in c.get("outputs", [])]
    (note,) = [t for t in texts if t.startswith("[perfkit: ")]
    assert "characters of this cell's output were cut" in note and "capped at 8 MiB" in note
    assert verdicts(report)["fx-cost-confirmed"][0] == "confirmed"  # the record after the flood is kept


def test_one_message_larger_than_the_cap_keeps_its_first_part_and_is_no_timeout(first):
    project, _, _ = first
    report, _ = rerun(project, ids=["fx-cost-confirmed"], overrides={"mode": "flood"})
    (executed,) = (project.runs_dir / report.run_id).glob("executions/*/r0/executed.ipynb")
    nb = nbformat.read(str(executed), as_version=4)
    texts = [o.get("text", "") for c in nb.cells for o in c.get("outputs", [])]
    kept = sum(t.count("y") for t in texts)
    assert executor.OUTPUT_CAP_BYTES - 2**20 < kept <= executor.OUTPUT_CAP_BYTES  # not nothing: the first 8 MiB
    assert any(t.startswith("[perfkit: ") and "capped at 8 MiB" in t for t in texts)
    assert verdicts(report)["fx-cost-confirmed"][0] == "confirmed"  # no timeout, and the record after it is kept


def test_a_process_the_probe_leaves_in_a_session_of_its_own_is_killed(first, tmp_path):
    import psutil

    project, _, _ = first
    pid_file = tmp_path / "daemon.pid"
    rerun(project, ids=["fx-cost-confirmed"], overrides={"mode": "daemon", "pid_file": str(pid_file)})
    pid = int(pid_file.read_text())
    try:
        proc = psutil.Process(pid)
        assert proc.status() == psutil.STATUS_ZOMBIE  # killed; only its exit status is left to collect
    except psutil.NoSuchProcess:
        pass


def test_a_probe_kernel_keeps_no_ipython_history(first):
    project, _, _ = first
    report, _ = rerun(project, ids=["fx-silent"], overrides={"mode": "history"})
    (executed,) = (project.runs_dir / report.run_id).glob("executions/*/r0/executed.ipynb")
    nb = nbformat.read(str(executed), as_version=4)
    (said,) = [o["text"] for c in nb.cells for o in c.get("outputs", []) if o.get("text", "").startswith("history:")]
    assert said.split()[1] == "False"  # no database, not even in memory: nothing lands in ~/.ipython


def test_every_replicate_of_an_execution_runs_with_the_threads_the_run_decided_once(first):
    project, _, _ = first
    report, lines = rerun(project, ids=["fx-silent"], overrides={"mode": "threads"}, replicates=2, threads=1)
    executed = sorted((project.runs_dir / report.run_id).glob("executions/*/r*/executed.ipynb"))
    assert len(executed) == 2
    for path in executed:
        nb = nbformat.read(str(path), as_version=4)
        (said,) = [
            o["text"] for c in nb.cells for o in c.get("outputs", []) if o.get("text", "").startswith("threads:")
        ]
        assert said.split() == ["threads:", "1", "1", "1"]  # the variables torch reads, and what torch took
        stored = json.loads((path.parent / "execution.json").read_text())
        assert stored["threads"] == 1
    assert all("(1 threads" in line for line in lines if " start " in line)
    (result,) = report.results.hypotheses
    assert {x.threads for x in result.executions} == {1}
    two, _ = rerun(project, ids=["fx-silent"], overrides={"mode": "threads"}, replicates=1, threads=2)
    assert two.executed == 1  # another thread count is another treatment: never reused for this one
    (measured_by,) = [
        line for line in project.ledger_path.read_text().splitlines() if line.startswith(f"- {two.run_id}:")
    ]
    assert "; 2 CPU threads, each replicate on CPUs of its own" in measured_by  # the thread count, in the ledger


def test_kernels_started_at_once_talk_over_sockets_of_their_own_not_racing_ports(first):
    project, _, _ = first
    report, _ = rerun(project, ids=["fx-silent"], overrides={"mode": "transport"}, replicates=4, jobs=2)
    executed = sorted((project.runs_dir / report.run_id).glob("executions/*/r*/executed.ipynb"))
    assert len(executed) == 4  # every kernel started
    places = set()
    for path in executed:
        nb = nbformat.read(str(path), as_version=4)
        (said,) = [
            o["text"] for c in nb.cells for o in c.get("outputs", []) if o.get("text", "").startswith("transport:")
        ]
        _, transport, ip = said.split()
        assert transport == "ipc"  # Unix sockets: no free port picked, released and raced for (papermill#511)
        places.add(Path(ip).parent)
    assert len(places) == 4  # a directory per kernel
    assert not any(place.exists() for place in places)  # removed with the kernel


def _perfkit(project, *args):
    import subprocess
    import sys

    return subprocess.Popen(
        [sys.executable, "-m", "perfkit.cli", "--root", str(project.root), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_sigkill_leaves_no_process_and_the_next_run_marks_the_manifest(first):
    import psutil

    project, _, _ = first
    proc = _perfkit(project, "run", "fx-sleeps", "--quick", "--replicates", "1", "--force")
    for line in proc.stdout:
        if " start    " in line:
            break
    time.sleep(3)
    children = psutil.Process(proc.pid).children(recursive=True)
    assert len(children) >= 2  # the executor and its kernel
    proc.kill()
    proc.wait()
    _, alive = psutil.wait_procs(children, timeout=15)
    assert not alive  # the executor sees its parent gone and takes the kernel down with it
    killed = max(p for p in project.runs_dir.iterdir() if p.is_dir())
    assert json.loads((killed / "manifest.json").read_text())["status"] == "running"
    report, lines = rerun(project, ids=["fx-cost-confirmed"])
    assert any(f"run {killed.name} was killed while running" in line for line in lines)
    manifest = json.loads((killed / "manifest.json").read_text())
    assert manifest["status"] == "killed" and f"found by run {report.run_id}" in manifest["killed_note"]
    assert not ledger.stale_temporaries(project)


def test_four_runs_at_once_keep_every_ledger_row(tmp_path):
    """Four reviewers' runs, each re-judging its own hypothesis at the same moment in one project."""
    import re

    from perfkit.experiment.records.results import load_all_results

    root = tmp_path / "project"
    (root / "hypotheses").mkdir(parents=True)
    shutil.copytree(FIXTURES / "notebooks", root / "notebooks")
    record = (FIXTURES / "hypotheses" / "fx-cost-confirmed.yaml").read_text()
    ids = [f"fx-c{n}" for n in range(4)]
    for hid in ids:
        (root / "hypotheses" / f"{hid}.yaml").write_text(record.replace("fx-cost-confirmed", hid))
    project = Project(root)
    warm = _perfkit(project, "run", "--all", "--quick", "--replicates", "1")
    assert warm.wait(timeout=180) == 0, warm.stderr.read()  # one execution; the four below reuse it
    for hid in ids:  # each reviewer edits their claim, so each run has a new verdict to record
        path = root / "hypotheses" / f"{hid}.yaml"
        path.write_text(path.read_text().replace("about 1 ms", "about 1 ms, edited"))
    procs = [_perfkit(project, "run", hid, "--quick", "--replicates", "1") for hid in ids]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], outs
    run_ids = [re.search(r"^run (\S+) finished", out, re.M).group(1) for out, _ in outs]
    stored = [r.run_id for r in load_all_results(project)]
    assert set(run_ids) <= set(stored), (run_ids, stored)
    text = project.ledger_path.read_text()
    assert text == ledger.render(load_all_results(project))  # the last writer saw every other run
    for hid, run_id in zip(ids, run_ids):
        assert f"| [`{hid}`](#{hid}) |" in text and f"| {run_id} |" in text, (hid, run_id)
    assert main(["--root", str(root), "ledger", "--check"]) == 0


def test_a_notebook_executed_by_hand_with_papermill_gets_the_runs_verdicts(first, tmp_path, monkeypatch, capsys):
    import papermill

    project, report, _ = first
    monkeypatch.setenv("JUPYTER_PATH", str(executor.ensure_kernelspec(tmp_path / "kernels")))
    out = tmp_path / "out.ipynb"
    papermill.execute_notebook(
        str(project.notebooks_dir / "fixture_probe.ipynb"),
        str(out),
        parameters={"mode": "ok", "n": 1000},
        progress_bar=False,
        cwd=str(tmp_path),
    )
    code = main(["--root", str(project.root), "judge", str(out)])
    text = capsys.readouterr().out
    assert code == 0
    assert text.startswith(f"judged from {out} (probe fixture_probe.ipynb), executed by hand: not a run")
    got = {line.split()[0]: line.split()[1] for line in text.splitlines()[1:] if line and not line.startswith(" ")}
    by_run = dict((k, v[0]) for k, v in verdicts(report).items())
    for hid in ("fx-cost-confirmed", "fx-cost-refuted", "fx-floor", "fx-share", "fx-speedup"):
        assert got[hid] == by_run[hid], hid
    # a record that asks for other parameters gets no verdict from this notebook
    assert (
        got["fx-raises"] == "inconclusive" and "the notebook ran with mode='ok'; the record asks mode='raise'" in text
    )
    assert text.splitlines()[0].endswith("the machine's fitness not judged (no utilization.json beside out.ipynb)")
    # one that asks only for more samples (Run All in JupyterLab takes the defaults) is judged, and says so
    other = tmp_path / "other"
    shutil.copytree(project.hypotheses_dir, other / "hypotheses", ignore=shutil.ignore_patterns("ledger", "*.md"))
    shutil.copytree(project.notebooks_dir, other / "notebooks")
    record = (other / "hypotheses" / "fx-cost-confirmed.yaml").read_text()
    (other / "hypotheses" / "fx-cost-confirmed.yaml").write_text(record.replace("n: 1000}", "n: 1000, repeat: 40}"))
    assert main(["--root", str(other), "judge", str(out), "--hypothesis", "fx-cost-confirmed"]) == 0
    said = capsys.readouterr().out
    assert "fx-cost-confirmed                confirmed" in said
    assert "sample counts differ from the record's (repeat=20; it asks repeat=40): judged on the samples taken" in said
    stored = sorted(p.name for p in project.results_dir.glob("*.json"))
    assert main(["--root", str(project.root), "judge", str(out), "--hypothesis", "fx-share"]) == 0
    assert sorted(p.name for p in project.results_dir.glob("*.json")) == stored  # never stored
    capsys.readouterr()
    # a run's executed notebook has its utilization trace beside it: the machine's fitness is judged from it
    ran = next(
        p.parent
        for p in (project.runs_dir / report.run_id / "executions").glob("*/r0/execution.json")
        if json.loads(p.read_text())["params"] == {"mode": "ok", "n": 1000}
    )
    busy = tmp_path / "busy"
    shutil.copytree(ran, busy)
    trace = json.loads((busy / "utilization.json").read_text())
    cells = executed.cell_times(executed.read_notebook(busy / "executed.ipynb"))
    start, end = min(c[1] for c in cells), max(c[2] for c in cells)  # this probe's cells take a blink:
    trace["t"] = [start + (end - start) * i / 40 for i in range(41)]  # samples inside them, dense
    trace["interval_s"] = (end - start) / 40
    for series in ("swap_bytes", "cpu_freq_mhz"):
        trace[series] = [None] * 41
    trace["system_cpu_percent"] = [100.0] * 41  # every core taken ...
    trace["cpu_percent"] = [0.0] * 41  # ... by processes outside the execution's tree
    (busy / "utilization.json").write_text(json.dumps(trace))
    for folder, words in (
        (ran, "; the machine was fit ("),
        (busy, "; the machine was fit (other processes used "),
    ):
        main(["--root", str(project.root), "judge", str(folder / "executed.ipynb"), "--hypothesis", "fx-share"])
        text = capsys.readouterr().out
        assert words in text.splitlines()[0], text
    assert "measured through" in text.splitlines()[0] and "fx-share                         confirmed" in text
    (other / "perfkit.toml").write_text('fitness = "strict"\n')  # a dedicated machine: a busy one is not evidence
    main(["--root", str(other), "judge", str(busy / "executed.ipynb"), "--hypothesis", "fx-share"])
    text = capsys.readouterr().out
    assert "; the machine was not fit (machine busy: " in text.splitlines()[0], text
    assert "inconclusive" in text and "the machine was not fit to measure on: machine busy" in text


def test_run_show_and_validate_speak_json(first, monkeypatch, capsys):
    project, _, _ = first
    shared_machine(monkeypatch)
    root = ["--root", str(project.root)]
    assert main([*root, "run", "fx-share", "--quick", "--replicates", "1", "--json"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)  # only the JSON on stdout; progress went to stderr
    assert data["hypotheses"][0]["id"] == "fx-share" and data["exit_code"] == 0 and "finished in" in captured.err
    assert data["format_version"] == results.FORMAT_VERSION  # the results file's shape, versioned as it is
    assert main([*root, "show", "fx-share", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["standing"]["verdict"] == "confirmed" and shown["history"]
    assert main([*root, "validate", "--json"]) == 0
    assert "fx-share" in json.loads(capsys.readouterr().out)["hypotheses"]
    bad = project.hypotheses_dir / "zz-bad.yaml"
    bad.write_text("id: zz-bad\nclaim: c\n")
    try:
        assert main([*root, "validate", "--json"]) == 2
        errors = json.loads(capsys.readouterr().out)["errors"]
        assert {"path": "hypotheses/zz-bad.yaml", "line": 1, "field": "rationale"}.items() <= errors[0].items()
    finally:
        bad.unlink()


def test_profile_nsys_runs_each_kernel_under_nsys_and_says_when_it_is_missing(first, tmp_path, monkeypatch, capsys):
    import os
    import stat

    project, _, _ = first
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setattr(runner, "source_tree_hash", lambda: "fixed-source")
    assert main(["--root", str(project.root), "run", "fx-share", "--quick", "--profile", "nsys"]) == 2
    assert "Nsight Systems' `nsys` is not on PATH" in capsys.readouterr().err
    # a stand-in nsys: writes the report it was asked for, then runs the kernel command it wraps
    fake = tmp_path / "bin" / "nsys"
    fake.parent.mkdir()
    fake.write_text(
        "#!/usr/bin/env python3\nimport os, sys\nargs = sys.argv[2:]\nwhile args[0].startswith('--'):\n"
        "    if args[0].startswith('--output='):\n        open(args[0][9:] + '.nsys-rep', 'w').write('report')\n"
        "    args = args[1:]\nos.execv(args[0], args)\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}/usr/bin:/bin")
    report, _ = rerun(project, ids=["fx-share"], profile="nsys")
    assert verdicts(report)["fx-share"][0] == "confirmed" and report.executed == 1
    assert list((project.runs_dir / report.run_id).glob("executions/*/r0/nsys.nsys-rep"))


@pytest.mark.alone  # how many replicates fit, and how long they took, is the machine's pace
def test_a_time_budget_bounds_the_whole_run_and_says_what_did_not_fit(tmp_path):
    """n=1950 puts the work 2.5% under the cost's upper edge (2 ms): 2 replicates straddle it. With no
    time for even its first round the run measures nothing and says what that would have needed (the
    ledger keeps its standing verdict); with time to spare it adds replicates; --budget 0 measures the
    plan and adds none, judged at 95%."""
    root = tmp_path / "p"
    fixture_project(root)
    project = Project(root)
    edge = {"ids": ["fx-cost-confirmed"], "overrides": {"n": 1950}, "replicates": 2, "force": True}
    tight, lines = rerun(project, budget_s=0.001, **edge)
    (h,) = tight.results.hypotheses
    assert h.verdict == "inconclusive" and not h.executions and tight.executed == 0
    assert h.reason.startswith("not measured: its replicates did not fit the run's --budget (0.001 s); its minimum")
    assert any(line.startswith("[plan]    fx-cost-confirmed: not measured") for line in lines)
    from perfkit.experiment.records import history

    assert history.attempt_of(h, None) == "the run's time budget"  # never the standing verdict
    roomy, lines = rerun(project, budget_s=600, **edge)
    (h,) = roomy.results.hypotheses
    assert any(line.startswith("undecided: adding replicates (fixture_probe.ipynb") for line in lines)
    assert len(h.executions) > 2 and "time budget" not in (h.stopped or "")
    # judged at a later look, at the error it spent by then: 0.25% more, which its correlation with the
    # first look lets it use at a wider nominal level than 99.75%
    assert 0.955 < h.measured.confidence < 0.9975
    none, _ = rerun(project, budget_s=0, **edge)
    (h,) = none.results.hypotheses
    assert len(h.executions) == 2 and h.measured.confidence == pytest.approx(0.95)
    rerun(project, budget_s=0.001, **edge)  # a later run the budget left out: `diff` says so, once
    from perfkit.experiment.records import compare, results

    entries = history.history(results.load_all_results(project))["fx-cost-confirmed"]
    said = compare._attempt(entries, entries[-2], set())
    assert said.startswith("not measured: the run's time budget: its replicates did not fit"), said
    assert said.count("not measured") == 1, said


@pytest.mark.alone  # how many replicates fit, and how long they took, is the machine's pace
def test_costs_from_a_slower_day_are_carried_to_today_and_what_they_left_out_is_measured_after_all(tmp_path):
    """Costs stored on a day the machine was 30x slower would make the plan leave one of two hypotheses
    out of a budget that holds only one. When that day's run timed the machine's pace (machine.pace), the
    plan scales the costs to today's and measures both. When it did not, the plan leaves one out; the
    round then runs at a small share of its forecast, so the run measures the one left out after all
    (its forecast scaled by the round's pace), and says so."""
    root = tmp_path / "p"
    fixture_project(root)
    other = (root / "hypotheses" / "fx-cost-confirmed.yaml").read_text().replace("n: 1000", "n: 2000")
    (root / "hypotheses" / "fx-cost-2000.yaml").write_text(
        other.replace("id: fx-cost-confirmed", "id: fx-cost-2000").replace("value: 1", "value: 2")
    )
    project = Project(root)
    both = {"ids": ["fx-cost-confirmed", "fx-cost-2000"], "force": True}
    rerun(project, replicates=2, **both)
    stored_dir = root / "hypotheses" / "ledger" / "results"
    (stored,) = stored_dir.glob("*.json")
    slow = json.loads(stored.read_text())
    assert slow["pace_s"] > 0
    for h in slow["hypotheses"]:
        for x in h["executions"]:
            x["wall_s"], x["setup_s"] = 30 * x["wall_s"], 30 * x["setup_s"]
    per_replicate = max(x["wall_s"] for h in slow["hypotheses"] for x in h["executions"]) + priors.REPLICATE_S
    first = policy.DEFAULT_REPLICATES["quick"]
    # the run's own costs, a template per round, and the replicates of one hypothesis, not of both
    budget = priors.RUN_S + first * priors.TEMPLATE_S + (first + 0.5) * per_replicate

    def again(pace_then: float | None):
        for later in set(stored_dir.glob("*.json")) - {stored}:
            later.unlink()
        stored.write_text(json.dumps({**slow, "pace_s": pace_then}))
        report, lines = rerun(project, budget_s=budget, replicates=None, **both)
        got = {h.id: h for h in report.results.hypotheses}
        assert all(len(h.executions) == first and not (h.reason or "").startswith("not measured") for h in got.values())
        assert {v for v, _ in verdicts(report).values()} == {"confirmed"}
        return [line for line in lines if "not measured" in line], [line for line in lines if "after all" in line]

    left_out, back = again(30 * slow["pace_s"])  # that day was timed: 30x slower
    assert left_out == [] and back == []
    left_out, back = again(None)  # a run from before runs timed the machine
    assert len(left_out) == 1 and len(back) == 1 and back[0].startswith("[plan]    the first round took "), back


@pytest.mark.alone  # how many replicates fit is the machine's pace
def test_what_the_first_round_left_out_is_measured_before_what_it_measured_grows(tmp_path):
    """A hypothesis not measured at all is further from a verdict than one measured at its minimum: when
    the first round runs faster than its (stale) forecast, the one it left out is measured with the time
    saved before the one that straddles its bound gets more replicates."""
    root = tmp_path / "p"
    fixture_project(root)
    confirmed = (root / "hypotheses" / "fx-cost-confirmed.yaml").read_text()
    for hid, n, value in (("fx-edge", 1950, 1), ("fx-cost-2000", 2000, 2)):  # 1950: 2 replicates straddle 2 ms
        record = confirmed.replace("id: fx-cost-confirmed", f"id: {hid}").replace("n: 1000", f"n: {n}")
        (root / "hypotheses" / f"{hid}.yaml").write_text(record.replace("value: 1", f"value: {value}"))
    project = Project(root)
    both = {"ids": ["fx-edge", "fx-cost-2000"], "force": True, "replicates": 2}
    rerun(project, budget_s=0, **both)
    (stored,) = (root / "hypotheses" / "ledger" / "results").glob("*.json")
    slow = json.loads(stored.read_text())
    for h in slow["hypotheses"]:
        for x in h["executions"]:
            x["wall_s"], x["setup_s"] = 30 * x["wall_s"], 30 * x["setup_s"]
    stored.write_text(json.dumps({**slow, "pace_s": None}))  # a day the machine's pace was not timed
    per_replicate = max(x["wall_s"] for h in slow["hypotheses"] for x in h["executions"]) + priors.REPLICATE_S
    budget = priors.RUN_S + 2 * priors.TEMPLATE_S + 2.5 * per_replicate  # the forecast holds one of the two
    report, lines = rerun(project, budget_s=budget, **both)
    back = [i for i, line in enumerate(lines) if line.startswith("[plan]    the first round took ")]
    grew = [i for i, line in enumerate(lines) if line.startswith("undecided: adding replicates")]
    assert len(back) == 1 and grew and back[0] < grew[0], lines
    got = {h.id: h for h in report.results.hypotheses}
    assert all(not (h.reason or "").startswith("not measured") for h in got.values()), got
    assert len(got["fx-edge"].executions) > 2 and len(got["fx-cost-2000"].executions) >= 2


def test_a_replicate_added_to_a_reused_execution_is_forecast_at_what_it_cost_where_it_was_measured():
    """A run that reused an execution's replicates and then grows it pays for the new ones in full: they
    are forecast at the reused replicates' own walls (they once forecast at the run's mean replicate, 8
    s, and took 19.5 s each, 56 s past a 285 s budget), then at the first round's forecast, then the mean."""
    from types import SimpleNamespace

    from perfkit.experiment.records.results import Execution

    def done(key, wall, reused):
        return Execution(key=key, notebook="n.ipynb", params={}, wall_s=wall, reused=reused)

    ran = {"a0": done("a", 4.0, False), "a1": done("a", 6.0, False), "b0": done("b", 19.5, True)}
    first = SimpleNamespace(per_replicate_s={"c": 11.0})
    ctx = SimpleNamespace(done=ran, first=first)
    assert runner._replicate_s(ctx, "a") == pytest.approx(5.0 + priors.REPLICATE_S)
    assert runner._replicate_s(ctx, "b") == pytest.approx(19.5 + priors.REPLICATE_S)
    ran["b1"] = done("b", 21.5, False)  # measured here too: this run's own wall decides
    assert runner._replicate_s(ctx, "b") == pytest.approx(21.5 + priors.REPLICATE_S)
    assert runner._replicate_s(ctx, "c") == 11.0
    assert runner._replicate_s(ctx, "d") == pytest.approx((4 + 6 + 21.5) / 3 + priors.REPLICATE_S)


def test_no_execution_starts_once_a_run_was_interrupted(tmp_path):
    """A replicate that was waiting for its cores when Ctrl-C came must not start its kernel afterwards
    (it did: the interrupted run then hung until that execution ended)."""
    from perfkit.experiment.records.results import Execution

    job = executor.Job(
        planned=Execution(key="k", notebook="fixture_probe.ipynb", params={"mode": "ok"}),
        notebook=FIXTURES / "notebooks" / "fixture_probe.ipynb",
        exec_dir=tmp_path / "x",
        run_id="r",
        cwd=tmp_path,
        code_root=tmp_path,
        kernel_dir=executor.ensure_kernelspec(tmp_path / "jupyter"),
        timeout_s=30,
    )
    executor.kill_all()  # what the interrupted run does
    try:
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt, match="interrupted before this execution started"):
            executor.execute(job)
        assert not executor._live and time.monotonic() - started < 5
    finally:
        executor.allow_executions()
    assert executor.execute(job).execution.status == "ok"  # the next run's rounds may execute again


def test_a_plot_that_does_not_match_its_row_is_flagged_and_redrawn(first, capsys):
    from perfkit.experiment.records import history
    from perfkit.experiment.records.plots import stamp_of
    from perfkit.experiment.records.results import load_all_results, stamp

    project, _, _ = first
    # the standing result as the project has it now: another test of this module may have re-run it since
    standing = history.standing(history.history(load_all_results(project))["fx-cost-confirmed"]).result
    mine = project.ledger_dir / "plots" / "fx-cost-confirmed.png"
    assert stamp_of(mine) == stamp(standing)  # the plot says which result it shows
    theirs = (project.ledger_dir / "plots" / "fx-cost-refuted.png").read_bytes()
    kept = mine.read_bytes()
    mine.write_bytes(theirs)  # `git checkout --theirs` of a plot after both branches re-ran
    root = ["--root", str(project.root)]
    assert main([*root, "ledger", "--check"]) == 1
    said = capsys.readouterr().out
    assert "fx-cost-confirmed: hypotheses/ledger/plots/fx-cost-confirmed.png was drawn from another result" in said
    assert main([*root, "ledger"]) == 0
    assert "redrew hypotheses/ledger/plots/fx-cost-confirmed.png from run " in capsys.readouterr().out
    assert mine.read_bytes() == kept and main([*root, "ledger", "--check"]) == 0
