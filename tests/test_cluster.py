"""Probe executions on a real Dask LocalCluster: the same verdicts, a lost worker, clear errors."""

import json
import threading
import time
from pathlib import Path

import psutil
import pytest
from records import fixture_project, run, shared_machine

from perfkit.cli import main
from perfkit.errors import UserError
from perfkit.experiment.run import cluster
from perfkit.paths import Project

QUICK = ["fx-cost-confirmed", "fx-cost-refuted", "fx-raises", "fx-scaling", "fx-share", "fx-silent", "fx-speedup"]


@pytest.fixture
def project(tmp_path, monkeypatch) -> Project:
    root = fixture_project(tmp_path / "project").root
    shared_machine(monkeypatch)
    return Project(root)


def verdicts(report):
    return {h.id: (h.verdict, h.reason) for h in report.results.hypotheses}


def test_a_local_cluster_gives_the_verdicts_of_a_local_run(project):
    import os

    environ = dict(os.environ)
    lines: list[str] = []
    here = run(project, ids=QUICK, quick=True, replicates=2, jobs=2, timeout_s=60, out=lines.append)
    # two rounds of replicates: the second must still find what the first shipped to the workers
    there = run(project, ids=QUICK, quick=True, replicates=2, timeout_s=60, cluster="local:2", out=lines.append)
    assert dict(os.environ) == environ  # Dask's settings for its workers (OMP_NUM_THREADS=1, ...) stay out of ours
    assert there.executed == here.executed == 8 and there.reused == 0  # measured there, not reused from here
    assert {k: v[0] for k, v in verdicts(there).items()} == {k: v[0] for k, v in verdicts(here).items()}, (
        verdicts(here),
        verdicts(there),
    )
    assert verdicts(there)["fx-raises"] == verdicts(here)["fx-raises"]  # the cell and the error, as here
    assert any(line.startswith("cluster local:2: 2 workers on 1 machine") for line in lines)
    executions = [
        json.loads(p.read_text()) for p in (project.runs_dir / there.run_id).glob("executions/*/r0/execution.json")
    ]
    assert len(executions) == 4 and all(e["host"] for e in executions)  # which worker's machine measured it
    assert all(
        (project.runs_dir / there.run_id / "executions" / e["key"] / "r0" / "executed.ipynb").is_file()
        for e in executions
    )
    stored = json.loads((project.results_dir / f"{there.run_id}.json").read_text())
    assert sorted(h["id"] for h in stored["hypotheses"]) == sorted(QUICK)  # the client alone wrote the results


def _kill_workers_running(mode: str, times: int, stop: threading.Event, killed: list) -> None:
    """Kill the worker process whose execution runs the probe in `mode`, `times` times."""
    while len(killed) < times and not stop.is_set():
        for proc in psutil.process_iter(["cmdline"]):
            cmd = proc.info["cmdline"] or []
            if "perfkit.experiment.run.execute" in cmd and cmd[-1] not in killed:
                try:
                    spec = json.loads(Path(cmd[-1]).read_text())
                except (OSError, ValueError):
                    continue
                if spec["params"].get("mode") == mode:
                    time.sleep(1.0)  # it is running, not just starting
                    try:
                        proc.parent().kill()  # the worker, mid-execution
                    except psutil.NoSuchProcess:
                        continue
                    killed.append(cmd[-1])
        time.sleep(0.2)


def test_a_worker_lost_twice_gives_worker_lost_and_the_other_verdicts_stand(project):
    stop, killed = threading.Event(), []
    killer = threading.Thread(target=_kill_workers_running, args=("sleep", 2, stop, killed), daemon=True)
    killer.start()
    try:
        report = run(
            project,
            ids=["fx-sleeps", "fx-cost-confirmed", "fx-share"],
            quick=True,
            replicates=1,
            timeout_s=120,
            cluster="local:2",
            out=lambda line: None,
        )
    finally:
        stop.set()
    got = verdicts(report)
    assert len(killed) == 2  # the first loss was retried on a worker, the second ended it
    assert got["fx-sleeps"][0] == "error" and got["fx-sleeps"][1].startswith("worker lost: KilledWorker")
    assert got["fx-cost-confirmed"][0] == "confirmed" and got["fx-share"][0] == "confirmed"


def test_an_unreachable_scheduler_and_a_missing_extra_are_clear_and_write_nothing(project, monkeypatch, capsys):
    code = main(["--root", str(project.root), "run", "fx-share", "--quick", "--cluster", "tcp://127.0.0.1:9"])
    err = capsys.readouterr().err
    assert code == 2 and "cannot reach the Dask scheduler at tcp://127.0.0.1:9" in err and "Traceback" not in err
    assert not project.runs_dir.exists() or not any(p.is_dir() for p in project.runs_dir.iterdir())
    monkeypatch.setitem(__import__("sys").modules, "distributed", None)  # as if the extra were not installed
    with pytest.raises(UserError, match=r"pip install 'perfkit\[cluster\]'"):
        cluster.connect("local:2")
    with pytest.raises(UserError, match="--cluster local:N or local:MxN"):
        monkeypatch.delitem(__import__("sys").modules, "distributed")
        cluster.connect("local:zero")


def test_rounds_of_executions_on_one_client_each_find_their_input(project, tmp_path):
    """A run ships its code once; each round's tasks read it, as runs on one client follow each other."""
    from perfkit.experiment.records.results import Execution

    client = cluster.connect("local:2")
    try:
        ended, shipped = [], None
        for round_ in range(5):  # one right after another, as a run's rounds of replicates go
            if round_ % 2 == 0:  # a new run every other round: its own archive, the last one released
                shipped = cluster.ship(client, project)
            planned = Execution(key=f"k{round_}", notebook="fixture_probe.ipynb", params={"mode": "ok", "n": 1000})
            request = cluster.Request(planned, tmp_path / f"r{round_}", extra=None, resources={})
            cluster.execute(
                client,
                cluster.Round(run_id="test", timeout_s=60, requests=[request], shipped=shipped),
                started=lambda x, how: None,
                ended=lambda x, got: ended.append(got),
            )
        assert [e.execution.status for e in ended] == ["ok"] * 5, [e.execution.reason for e in ended]
        assert all(len(e.execution.records) == 8 and e.execution.host for e in ended)
        assert all(e.cells and e.trace for e in ended)  # when each cell ran, and the machine meanwhile, came back
    finally:
        cluster.close(client)


def test_a_probe_asking_for_a_resource_no_worker_offers_is_refused_before_anything_runs(project, capsys):
    record = project.hypotheses_dir / "fx-share.yaml"
    record.write_text(record.read_text().replace("probe:\n", "probe:\n  resources: {GPU: 1}\n"))
    code = main(["--root", str(project.root), "run", "fx-share", "--quick", "--cluster", "local:1"])
    err = capsys.readouterr().err
    assert code == 2 and "asks for GPU=1 (probe.resources) and no worker offers it" in err, err
    assert not project.runs_dir.exists() or not any(p.is_dir() for p in project.runs_dir.iterdir())


def test_two_local_clusters_at_once_each_take_a_free_port_and_neither_shows_a_dashboard(recwarn):
    """Two runs with `--cluster local:N` on one machine (two users, or two test processes): the second took
    Dask's default 8787, found it taken, and warned; each now asks for any free port."""
    first = cluster.connect("local:1")
    try:
        second = cluster.connect("local:1")
        try:
            ports = [c.scheduler_info()["services"].get("dashboard") for c in (first, second)]
            assert 8787 not in ports and ports[0] != ports[1], ports
            assert second.submit(sum, [1, 2]).result(timeout=30) == 3
        finally:
            cluster.close(second)
    finally:
        cluster.close(first)
    assert not [w for w in recwarn if "already in use" in str(w.message)], [str(w.message) for w in recwarn]
