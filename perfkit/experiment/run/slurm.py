"""Probe executions on Slurm: `--cluster slurm:KEY=VALUE,...` or `[tool.perfkit] cluster = {slurm = {...}}`.

The run's process starts a Dask scheduler here and asks Slurm for its workers through dask-jobqueue's
SLURMCluster (`sbatch`): each job is one worker with one thread that offers the `measure` resource
(what cluster.py requires of every worker: two executions never share one). A run asks for as many
jobs as it has executions queued or running, up to `jobs`; the first job is kept until the run ends
(a run starts when Slurm has started it), a later one is given back after a minute with nothing to
run. Closing the client cancels every job (`scancel`), on success, error and Ctrl-C alike:
runner.run closes it in a `finally`, and a failure while connecting cancels what was submitted.

The workers run where Slurm puts them: `python` (default this run's interpreter) must import perfkit
there, as it does when the nodes share the file system the run started from. The jobs' output
goes to `logs`. The keys' kinds are checked in perfkit/experiment/records/config.py (SLURM_KEYS),
which reads the table form; `Slurm` below says what each key does and its default.
"""

from __future__ import annotations

import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfkit.errors import UserError
from perfkit.experiment.records import config

INSTALL = "pip install 'perfkit[cluster]'  (or: pip install dask-jobqueue)"
COMMANDS = ("sbatch", "squeue", "scancel")  # what submits, watches and cancels the worker jobs
IDLE_S = 60  # a job whose worker has had nothing to run this long is given back (never the first)
JOB_NAME = "perfkit-worker"  # how the jobs show in squeue


def _says(default: Any, says: str) -> Any:
    """A field's default and what it does (docs/reference/settings.md prints both)."""
    return field(default=default, metadata={"says": says})


@dataclass(frozen=True)
class Slurm:
    """What the worker jobs ask Slurm for: one field per key of `cluster = {slurm = {...}}`, with its default."""

    partition: str | None = _says(None, "`#SBATCH -p`; none: the cluster's default partition")
    account: str | None = _says(None, "`#SBATCH -A`")
    jobs: int = _says(4, "the most worker jobs at once; a run asks for one per execution queued or running")
    cores: int = _says(
        1, "CPUs per job (`--cpus-per-task`): what the probe's kernel may use (its worker has one thread)"
    )
    memory: str = _says("4GB", "per job (`--mem`), and its worker's memory limit")
    walltime: str = _says(
        "01:00:00", "per job (`-t`): a worker past it is lost, and its execution retried once elsewhere"
    )
    directives: tuple[str, ...] = _says((), 'more `#SBATCH` lines: ["--gres=gpu:1", "--constraint=a100"]')
    prologue: tuple[str, ...] = _says((), 'shell lines the job runs before its worker: ["module load cuda"]')
    resources: dict[str, float] = field(
        default_factory=dict, metadata={"says": "what each worker offers beside `measure`: {GPU = 1}"}
    )
    python: str | None = _says(None, "the workers' interpreter; none: this run's (sys.executable)")
    interface: str | None = _says(
        None, 'the network interface the scheduler and workers use ("ib0"); none: the host name\'s'
    )
    logs: str | None = _says(
        None, "where each job writes its output; none: $PERFKIT_CACHE_DIR/slurm (~/.cache/perfkit)"
    )
    wait_s: float = _says(600.0, "how long a run waits for Slurm to start its first worker, then gives up")


def parse(spec: str) -> Slurm:
    """The settings `slurm:KEY=VALUE,...` asks for (the rest defaults); a UserError names a bad key."""
    try:
        table = config.slurm_table(spec)
    except ValueError as exc:
        raise UserError(f"--cluster {spec[:120]}: {exc}") from None
    for key in ("directives", "prologue"):
        if key in table:
            table[key] = tuple(table[key])
    return Slurm(**table)


def job_options(settings: Slurm, *, resource: str) -> dict[str, Any]:
    """SLURMCluster's keywords for `settings`: one worker with one thread per job, offering `resource`."""
    offers = {resource: 1, **settings.resources}
    return {
        "queue": settings.partition,
        "account": settings.account,
        "cores": 1,  # the worker's threads (--nthreads 1) ...
        "processes": 1,  # ... in one worker process per job (--nworkers 1)
        "job_cpu": settings.cores,
        "memory": settings.memory,
        "walltime": settings.walltime,
        "job_extra_directives": list(settings.directives),
        "job_script_prologue": list(settings.prologue),
        "worker_extra_args": ["--resources", ",".join(f"{n}={a:g}" for n, a in offers.items())],
        "python": shlex.quote(settings.python or sys.executable),  # one word in the job script, never a command
        "interface": settings.interface,
        "log_directory": str(logs(settings)),
        "job_name": JOB_NAME,
        "scheduler_options": {"dashboard": False, "dashboard_address": ":0"},  # no dashboard; any free port
    }


def logs(settings: Slurm) -> Path:
    """Where the jobs write their output (Slurm's `-o` and `-e`)."""
    from perfkit.machine import bandwidth

    return Path(settings.logs).expanduser() if settings.logs else bandwidth.cache_dir() / "slurm"


def _jobqueue():
    """dask_jobqueue, without the SIGINT handler its 0.9.0 installs on import (dask/dask-jobqueue#696): that one
    turns Ctrl-C into SystemExit, and a run stops on Ctrl-C as KeyboardInterrupt (perfkit/cli.py)."""
    main = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGINT) if main else None
    try:
        import dask_jobqueue
    except ImportError:
        raise UserError(f"--cluster slurm: needs dask-jobqueue, which is not installed: {INSTALL}") from None
    finally:
        if handler is not None:
            signal.signal(signal.SIGINT, handler)
    return dask_jobqueue


def connect(spec: str, *, resource: str):
    """A Dask client whose workers are Slurm jobs, once Slurm has started the first one.

    Refused before any job is submitted: a bad key, no dask-jobqueue, no Slurm commands here, a job
    Slurm would not accept (`sbatch --test-only`: an unknown partition, more memory than a node has).
    """
    settings = parse(spec)
    jobqueue = _jobqueue()
    import dask
    import distributed

    missing = [c for c in COMMANDS if shutil.which(c) is None]
    if missing:
        raise UserError(
            f"--cluster {spec[:120]}: Slurm's {', '.join(missing)} not found here; run perfkit where jobs are "
            "submitted (a login node); nothing was run"
        )
    with dask.config.set({"distributed.scheduler.allowed-failures": 1}):  # one retry after a lost worker
        cluster = jobqueue.SLURMCluster(**job_options(settings, resource=resource))
    client = None
    try:
        _accepted(spec, cluster.job_script())
        # A target of 1 ms of work per worker: the scheduler then asks for one worker per execution
        # queued or running (its adaptive target counts no more workers than there are tasks).
        cluster.adapt(
            minimum_jobs=1, maximum_jobs=settings.jobs, target_duration="1ms", interval="1s", wait_count=IDLE_S
        )
        client = distributed.Client(cluster)
        try:
            client.wait_for_workers(1, timeout=settings.wait_s)
        except TimeoutError:
            raise UserError(
                f"--cluster {spec[:120]}: Slurm started no worker within {settings.wait_s:g} s "
                f"({_states(cluster) or 'no job in squeue'}); the jobs' output is in "
                f"{logs(settings)}; nothing was run"
            ) from None
        return client
    except BaseException:  # Ctrl-C too: no job is left behind
        if client is not None:
            client.close()
        cluster.close()
        raise


def _accepted(spec: str, script: str) -> None:
    """Refuse a worker job Slurm would not run, in Slurm's own words, before one is submitted."""
    with tempfile.NamedTemporaryFile("w", prefix="perfkit-slurm-", suffix=".sh") as job:
        job.write(script)
        job.flush()
        checked = subprocess.run(["sbatch", "--test-only", job.name], capture_output=True, text=True, timeout=60)
    if checked.returncode != 0:
        said = "; ".join(line.strip() for line in checked.stderr.splitlines() if line.strip())
        raise UserError(f"--cluster {spec[:120]}: Slurm refuses the worker job: {said}; nothing was run")


def _states(cluster) -> str:
    """Each submitted job's id, state and reason, as squeue says."""
    ids = [str(job.job_id) for job in cluster.workers.values() if getattr(job, "job_id", None)]
    if not ids:
        return ""
    listed = subprocess.run(
        ["squeue", "-h", "-j", ",".join(ids), "-o", "job %i %T (%r)"], capture_output=True, text=True, timeout=60
    )
    return "; ".join(line.strip() for line in listed.stdout.splitlines() if line.strip())
