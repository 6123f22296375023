"""Probe executions on a real Slurm: a munged, slurmctld and slurmd this module starts on this machine,
worker jobs submitted through sbatch, the verdicts of a local run, and no job or daemon left behind.

Needs Debian's slurm-wlm and munge (`apt-get install slurm-wlm munge`; .ci/run installs them); without
them the Slurm tests skip in one line. Everything Slurm writes (its configuration, state, logs and
munge key) is under one temporary folder. The tests of the settings' forms run without Slurm.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path

import psutil
import pytest
from records import fixture_project, run, shared_machine

from perfkit.errors import UserError
from perfkit.experiment.records import config
from perfkit.experiment.run import cluster, slurm
from perfkit.paths import Project

ROOT = Path(__file__).resolve().parents[1]
QUICK = ["fx-cost-confirmed", "fx-cost-refuted", "fx-raises", "fx-scaling", "fx-share", "fx-silent", "fx-speedup"]
SBIN = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
NEEDED = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "scontrol", "sinfo")
NODE = "perfkit1"  # one node of 2 CPUs on this host: two worker jobs at once


@dataclass
class Slurm:
    """The Slurm this module runs: where its files are, and what it says about jobs."""

    root: Path
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def jobcomp(self) -> Path:
        return self.root / "jobcomp.txt"

    def queue(self) -> list[tuple[str, str, str]]:
        """(job id, state, name) of every job in squeue."""
        listed = subprocess.run(["squeue", "-h", "-o", "%i %T %j"], capture_output=True, text=True, timeout=30)
        assert listed.returncode == 0, listed.stderr
        return [tuple(line.split(maxsplit=2)) for line in listed.stdout.splitlines() if line.strip()]

    def drained(self, within_s: float = 20.0) -> list[tuple[str, str, str]]:
        """squeue once every job has left it (cancelled jobs stay a moment as COMPLETING), or what is left."""
        deadline = time.monotonic() + within_s
        while (left := self.queue()) and time.monotonic() < deadline:
            time.sleep(0.2)
        return left

    def ended(self) -> dict[str, dict[str, str]]:
        """Every job that has ended, as Slurm's job completion log records it: id -> its fields."""
        if not self.jobcomp.is_file():
            return {}
        jobs = {}
        for line in self.jobcomp.read_text().splitlines():
            fields = dict(re.findall(r"(\w+)=(\S*)", line))
            jobs[fields["JobId"]] = fields
        return jobs


def _free_ports(n: int) -> list[int]:
    """`n` distinct ports no one listens on now (each held until all are picked)."""
    held = [socket.socket() for _ in range(n)]
    try:
        for s in held:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()


def _conf(root: Path, user: str) -> str:
    host = socket.gethostname().split(".")[0]
    controller, node = _free_ports(2)
    return f"""\
ClusterName=perfkit-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={controller}
SlurmdPort={node}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge.socket
SlurmUser={user}
SlurmdUser={user}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc={root}/jobcomp.txt
ReturnToService=2
SlurmdParameters=config_overrides
NodeName={NODE} NodeAddr=127.0.0.1 NodeHostname=localhost CPUs=2 RealMemory=8000 State=UNKNOWN
PartitionName=perfkit Nodes={NODE} Default=YES MaxTime=INFINITE State=UP
"""


def _wait(what: str, ready, within_s: float, root: Path) -> None:
    deadline = time.monotonic() + within_s
    while not ready():
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(root.glob("*.log")))
            raise AssertionError(f"{what} not ready within {within_s:g} s\n{logs}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def slurm_here(tmp_path_factory):
    """munged, slurmctld and slurmd of this module's own, in the foreground as children; all stopped at the end."""
    missing = [c for c in NEEDED if shutil.which(c, path=SBIN) is None]
    if missing:
        pytest.skip(f"Slurm is not installed ({', '.join(missing)} missing): apt-get install slurm-wlm munge")
    root = tmp_path_factory.mktemp("slurm")
    for folder in ("state", "spool"):
        (root / folder).mkdir()
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    (root / "slurm.conf").write_text(_conf(root, getpass.getuser()))
    before = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(root / "slurm.conf")  # sbatch, squeue, scancel: this Slurm
    here = Slurm(root)

    def start(name: str, *args: str) -> None:
        log = (root / f"{name}.out").open("w")
        here.procs.append(
            subprocess.Popen([shutil.which(name, path=SBIN), *args], stdout=log, stderr=subprocess.STDOUT)
        )

    try:
        # as root munged needs --force; its socket, key and files all here
        start(
            "munged", "-F", "--force", f"--key-file={key}", f"--socket={root}/munge.socket",
            f"--pid-file={root}/munged.pid", f"--log-file={root}/munged.log", f"--seed-file={root}/munged.seed",
        )  # fmt: skip
        _wait("munged", (root / "munge.socket").exists, 10, root)
        start("slurmctld", "-D", "-f", str(root / "slurm.conf"))
        start("slurmd", "-D", "-N", NODE, "-f", str(root / "slurm.conf"))

        def idle() -> bool:
            said = subprocess.run(["sinfo", "-h", "-n", NODE, "-o", "%t"], capture_output=True, text=True)
            return said.stdout.strip() == "idle"

        _wait("the Slurm node", idle, 30, root)
        yield here
    finally:
        if any(p.poll() is None for p in here.procs[1:]):
            subprocess.run(["scancel", "--user", getpass.getuser()], capture_output=True, timeout=30)
            here.drained(10)
        for proc in reversed(here.procs):
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if before is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = before
    left = subprocess.run(["pgrep", "-a", "-f", str(root)], capture_output=True, text=True).stdout
    assert not left, f"Slurm's daemons still run after the module: {left}"
    assert not _workers(), "a Slurm job's Dask worker outlived the module"


def _workers(within_s: float = 30.0) -> list[str]:
    """Dask worker processes started as perfkit's Slurm jobs start them, still running on this machine after
    `within_s` (a cancelled job's processes get SIGTERM, and a moment to close)."""
    deadline = time.monotonic() + within_s
    while True:
        found = []
        for proc in psutil.process_iter(["cmdline", "status"]):
            cmd = " ".join(proc.info["cmdline"] or [])
            if "distributed.cli.dask_worker" in cmd and "--resources measure=1" in cmd:
                if proc.info["status"] != psutil.STATUS_ZOMBIE:
                    found.append(cmd)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


@pytest.fixture
def project(tmp_path, monkeypatch) -> Project:
    root = fixture_project(tmp_path / "project").root
    shared_machine(monkeypatch)
    return Project(root)


class Watch:
    """squeue, read every 0.2 s while a run goes on: each job seen, its states, and its batch script."""

    def __init__(self) -> None:
        self.states: dict[str, set[str]] = {}
        self.names: dict[str, str] = {}
        self.scripts: dict[str, str] = {}
        self.most_at_once = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.is_set():
            listed = subprocess.run(["squeue", "-h", "-o", "%i %T %j"], capture_output=True, text=True)
            jobs = [line.split(maxsplit=2) for line in listed.stdout.splitlines() if line.strip()]
            self.most_at_once = max(self.most_at_once, len(jobs))
            for job, state, name in jobs:
                self.states.setdefault(job, set()).add(state)
                self.names[job] = name
                if job not in self.scripts:  # what Slurm runs, as it stored it
                    said = subprocess.run(["scontrol", "write", "batch_script", job, "-"], capture_output=True)
                    if said.returncode == 0:
                        self.scripts[job] = said.stdout.decode()
            time.sleep(0.2)

    def running(self) -> set[str]:
        return {job for job, states in self.states.items() if "RUNNING" in states}

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)


def verdicts(report):
    return {h.id: (h.verdict, h.reason) for h in report.results.hypotheses}


def test_a_run_on_slurm_gives_the_verdicts_of_a_local_run_and_cancels_its_jobs(
    slurm_here, project, tmp_path, monkeypatch
):
    logs = tmp_path / "slurm-logs"
    lines: list[str] = []
    here = run(project, ids=QUICK, quick=True, replicates=2, jobs=2, timeout_s=60, out=lines.append)
    ran_on: list[str] = []  # the worker each execution ran on, as the scheduler's task stream says
    execute = cluster.execute

    def streamed(client, batch, **callbacks):
        import distributed

        with distributed.get_task_stream(client) as stream:
            execute(client, batch, **callbacks)
        ran_on.extend(task["worker"] for task in stream.data)

    monkeypatch.setattr(cluster, "execute", streamed)
    spec = f"slurm:jobs=2,logs={logs},wait_s=60"
    with Watch() as watch:
        there = run(project, ids=QUICK, quick=True, replicates=2, timeout_s=60, cluster=spec, out=lines.append)
    assert there.executed == here.executed == 8 and there.reused == 0  # measured on Slurm, not reused from here
    assert {k: v[0] for k, v in verdicts(there).items()} == {k: v[0] for k, v in verdicts(here).items()}, (
        verdicts(here),
        verdicts(there),
    )
    assert verdicts(there)["fx-raises"] == verdicts(here)["fx-raises"]  # the cell and the error, as here
    assert any(line.startswith(f"cluster {spec}: 1 workers on 1 machine") for line in lines), lines
    # Slurm ran the workers: as many jobs as executions in flight, at most `jobs`, each named and shaped as asked
    ours = {job for job, name in watch.names.items() if name == slurm.JOB_NAME}
    assert len(watch.running() & ours) == 2 and watch.most_at_once <= 2, (watch.states, watch.most_at_once)
    assert ours & set(watch.scripts), watch.states
    assert len(ran_on) == 8 and len(set(ran_on)) == 2, ran_on  # the second job's worker took executions too
    for script in (watch.scripts[job] for job in ours & set(watch.scripts)):
        assert f"#SBATCH -J {slurm.JOB_NAME}" in script and "#SBATCH --cpus-per-task=1" in script
        worker = next(line for line in script.splitlines() if "distributed.cli.dask_worker" in line)
        assert worker.startswith(f"{sys.executable} -m distributed.cli.dask_worker tcp://"), worker
        assert "--nthreads 1" in worker and "--resources measure=1" in worker and "--nworkers" not in worker
    # and nothing is left: every job cancelled when the run ended, as Slurm's completion log says
    assert slurm_here.drained() == []
    ended = slurm_here.ended()
    assert ours <= set(ended) and {ended[job]["JobState"] for job in ours} == {"CANCELLED"}, ended
    assert sorted(p.name for p in logs.iterdir()) == sorted(  # each job that ran wrote its output there
        f"{slurm.JOB_NAME}-{job}.{ext}" for job in ours & watch.running() for ext in ("err", "out")
    )
    stored = [
        json.loads(p.read_text()) for p in (project.runs_dir / there.run_id).glob("executions/*/*/execution.json")
    ]
    assert len(stored) == 8 and all(e["host"] for e in stored)  # each says the machine that measured it


def test_ctrl_c_mid_run_cancels_every_job_and_the_table_form_reaches_slurm(slurm_here, project, tmp_path):
    """`cluster = {slurm = {...}}` in pyproject.toml; SIGINT once a job runs: KeyboardInterrupt, no job left."""
    logs = tmp_path / "slurm-logs"
    (project.root / "pyproject.toml").write_text(
        f'[tool.perfkit]\ncluster = {{slurm = {{jobs = 2, logs = "{logs}", wait_s = 60}}}}\n'
    )
    assert config.read(project).cluster == f"slurm:jobs=2,logs={logs},wait_s=60"

    over = threading.Event()  # no Ctrl-C once the run is over: it would stop the test session

    def interrupt_once_running(watch: Watch) -> None:
        while not watch.running() and not over.wait(0.1):
            pass
        if not over.wait(1.0):  # executions are on their way to the worker (fx-sleeps sleeps 600 s)
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, delivered to the main thread

    with Watch() as watch:
        threading.Thread(target=interrupt_once_running, args=(watch,), daemon=True).start()
        try:
            with pytest.raises(KeyboardInterrupt):
                run(project, ids=["fx-sleeps", "fx-share"], quick=True, replicates=2, timeout_s=60, out=lambda _: None)
        finally:
            over.set()
    assert watch.running(), watch.states  # it did reach Slurm
    assert slurm_here.drained() == []
    ended = slurm_here.ended()
    assert all(ended[job]["JobState"] == "CANCELLED" for job in watch.states), (watch.states, ended)
    assert not _workers()


def test_a_job_slurm_refuses_or_never_starts_is_a_clear_error_and_leaves_no_job(slurm_here, project, tmp_path):
    with pytest.raises(UserError, match=r"Slurm refuses the worker job: sbatch: error: invalid partition.*nope"):
        cluster.connect(f"slurm:partition=nope,logs={tmp_path}")
    assert slurm_here.queue() == []
    # a partition that takes jobs but starts none: the first worker never comes, the job is cancelled
    subprocess.run(["scontrol", "update", "PartitionName=perfkit", "State=DOWN"], check=True, timeout=30)
    try:
        with pytest.raises(UserError, match=r"Slurm started no worker within 3 s \(job \d+ PENDING \(PartitionDown\)"):
            cluster.connect(f"slurm:wait_s=3,logs={tmp_path}")
    finally:
        subprocess.run(["scontrol", "update", "PartitionName=perfkit", "State=UP"], check=True, timeout=30)
    assert slurm_here.drained() == []
    assert not project.runs_dir.exists()


# ---------------------------------------------------------------- the settings' forms, without Slurm


def _readme_block() -> str:
    """The `[tool.perfkit]` block of the Slurm paragraph of docs/cluster.md."""
    text = (ROOT / "docs" / "cluster.md").read_text()
    found = re.search(r"\*\*Slurm:\*\*.*?```toml\n(.*?)```", text, re.S)
    assert found, "docs/cluster.md: the Slurm paragraph has no toml block"
    return found.group(1)


def test_the_readme_slurm_table_makes_the_job_script_it_says(tmp_path, monkeypatch):
    monkeypatch.setenv("PERFKIT_CACHE_DIR", str(tmp_path / "cache"))  # where the jobs' output would go
    (tmp_path / "pyproject.toml").write_text(_readme_block())
    spec = config.read(Project(tmp_path)).cluster
    assert spec.startswith("slurm:partition=gpu,jobs=8,")
    settings = slurm.parse(spec)
    assert settings.partition == "gpu" and settings.resources == {"GPU": 1} and settings.jobs == 8
    pytest.importorskip("distributed")
    jobqueue = slurm._jobqueue()  # never `import dask_jobqueue` here: 0.9.0 would turn this session's Ctrl-C into exit
    made = jobqueue.SLURMCluster(**slurm.job_options(settings, resource=cluster.RESOURCE))
    try:
        script = made.job_script()
    finally:
        made.close()
    for line in ("#SBATCH -p gpu", "#SBATCH --gres=gpu:1", "#SBATCH --cpus-per-task=8", "#SBATCH -t 02:00:00"):
        assert line in script, script
    assert "module load cuda" in script and "--nthreads 1" in script and "--resources measure=1,GPU=1" in script
    assert f"#SBATCH -o {tmp_path}/cache/slurm/{slurm.JOB_NAME}-%J.out" in script  # the default `logs`
    readme = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    for said in re.findall(r"--cluster (slurm:\S*?)`", readme):  # every one-line form the docs show
        slurm.parse(said)
    defaults = re.search(r"Defaults: the cluster's default partition,(.*?)\(`logs`\)", readme, re.S).group(1)
    stated = dict(re.findall(r"`(\w+) = ([^`]+)`", defaults))
    assert set(stated) == {"jobs", "cores", "memory", "walltime", "wait_s"}
    for key, value in stated.items():  # the defaults the docs state are the code's
        assert tomllib.loads(f"v = {value}")["v"] == getattr(slurm.Slurm(), key), key


def test_slurm_settings_name_the_bad_key_with_its_line(tmp_path):
    project = Project(tmp_path)
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "x"\n\n[tool.perfkit]\ncode = ["src"]\ncluster = {slurm = {nodes = 2}}\n')
    with pytest.raises(
        UserError, match=r"^pyproject.toml:6: \[tool.perfkit\] cluster.slurm has no key nodes \(known: "
    ):
        config.read(project)
    pyproject.write_text(
        '[tool.perfkit.cluster.slurm]\npartition = "debug"\njobs = 0\nmemory = "lots"\ndirectives = "--exclusive"\n'
    )
    with pytest.raises(UserError) as raised:
        config.read(project)
    assert str(raised.value).splitlines() == [  # every bad key at once, each at its line
        "pyproject.toml:3: [tool.perfkit] cluster.slurm.jobs must be a whole number of 1 or more, got 0",
        'pyproject.toml:4: [tool.perfkit] cluster.slurm.memory must be a size like "4GB" or "500MB", got \'lots\'',
        "pyproject.toml:5: [tool.perfkit] cluster.slurm.directives must be a list of strings, got '--exclusive'",
    ]
    pyproject.write_text("[tool.perfkit]\ncluster = {pbs = {}}\n")
    with pytest.raises(UserError, match=r"pyproject.toml:2: .* cluster as a table takes one key, slurm"):
        config.read(project)
    pyproject.write_text('[tool.perfkit]\n\ncluster = "slurm:jobs=two"\n')
    with pytest.raises(UserError, match=r"pyproject.toml:3: \[tool.perfkit\] cluster slurm.jobs must be a whole"):
        config.read(project)
    pyproject.write_text('[tool.perfkit]\ncluster = {slurm = {prologue = ["a; b"]}}\n')
    with pytest.raises(UserError, match=r"pyproject.toml:2: .*cluster.slurm.prologue cannot be said on one line"):
        config.read(project)


def test_the_one_line_form_reads_back_as_the_table_and_defaults_the_rest(tmp_path):
    table = {
        "partition": "debug,gpu",
        "jobs": 3,
        "memory": "1GB",
        "directives": ["--gres=gpu:1", "--exclusive"],
        "resources": {"GPU": 1},
        "wait_s": 30,
    }
    spec = config.slurm_spec(table)
    said = "partition=debug,gpu,jobs=3,memory=1GB,directives=--gres=gpu:1;--exclusive,resources=GPU=1,wait_s=30"
    assert spec == f"slurm:{said}"  # in SLURM_KEYS's order, a list's items joined by ';'
    assert config.slurm_table(spec) == table
    parsed = slurm.parse(spec)
    assert parsed.directives == ("--gres=gpu:1", "--exclusive") and parsed.cores == 1 and parsed.walltime == "01:00:00"
    assert slurm.parse("slurm:") == slurm.Slurm()  # every default
    assert [f.name for f in fields(slurm.Slurm)] == list(config.SLURM_KEYS)  # one field per key the settings read
    options = slurm.job_options(slurm.Slurm(), resource="measure")
    assert options["python"] == sys.executable and options["cores"] == options["processes"] == 1
    assert options["worker_extra_args"] == ["--resources", "measure=1"]
    for bad, said in (
        ("slurm:nodes=2", "slurm has no key nodes"),
        ("slurm:jobs=0", "slurm.jobs must be a whole number of 1 or more"),
        ("slurm:walltime=soon", "slurm.walltime must be a Slurm time limit"),
        ("slurm:resources=GPU", "slurm.resources must be a table"),
        ("slurm:jobs=1,jobs=2", "slurm.jobs is given twice"),
    ):
        with pytest.raises(UserError, match=re.escape(f"--cluster {bad}: {said}")):
            cluster.connect(bad)  # refused before dask-jobqueue or Slurm is looked for
        with pytest.raises(UserError, match=re.escape(said)):
            run(Project(tmp_path), ids=["x"], cluster=bad)  # the run's option check says the same


def test_without_dask_jobqueue_or_slurm_the_error_says_what_to_install(monkeypatch):
    pytest.importorskip("distributed")
    monkeypatch.setitem(sys.modules, "dask_jobqueue", None)  # as if the extra were older
    with pytest.raises(
        UserError, match=r"needs dask-jobqueue, which is not installed: pip install 'perfkit\[cluster\]'"
    ):
        cluster.connect("slurm:")
    monkeypatch.delitem(sys.modules, "dask_jobqueue")
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(UserError, match=r"Slurm's sbatch, squeue, scancel not found here"):
        cluster.connect("slurm:")


@pytest.mark.parametrize("python", ["python3;touch pwned", "$(touch pwned)", "/opt/my env/bin/python", "py`id`"])
def test_the_python_key_reaches_the_job_script_as_one_quoted_word(tmp_path, monkeypatch, python):
    """Issue 45: `python3;touch pwned` ran on the node. The job script now runs the key as one word."""
    monkeypatch.setenv("PERFKIT_CACHE_DIR", str(tmp_path / "cache"))
    settings = slurm.parse(f"slurm:partition=debug,python={python}")
    pytest.importorskip("distributed")
    made = slurm._jobqueue().SLURMCluster(**slurm.job_options(settings, resource=cluster.RESOURCE))
    try:
        script = made.job_script()
    finally:
        made.close()
    (line,) = [row for row in script.splitlines() if "distributed.cli" in row]
    words = shlex.split(line)
    assert words[0] == python and words[1] == "-m", words
    assert subprocess.run(["bash", "-n", "-c", line]).returncode == 0  # still one command to bash
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("key", ["partition", "account", "interface", "logs"])
@pytest.mark.parametrize("bad", ["gpu\n#SBATCH --exclusive", "gpu\rx", "gpu\x1b[2J"])
def test_a_slurm_text_key_with_a_control_character_is_refused(tmp_path, key, bad):
    (tmp_path / "pyproject.toml").write_text(f"[tool.perfkit]\ncluster = {{slurm = {{{key} = {json.dumps(bad)}}}}}\n")
    with pytest.raises(UserError, match=rf"cluster.slurm.{key} must be a string of one line, without control"):
        config.read(Project(tmp_path))
