"""Probe executions on a Dask cluster: `perfkit run --cluster ADDRESS` or `--cluster local:N`.

The client (the `perfkit run` process) plans, judges and writes, exactly as for a local run; only
the executions go to the workers. A run ships the project's code under test and notebooks/ once, as
one archive (no shared filesystem is assumed; a worker unpacks each archive once, by its hash, and
puts it on the probe's import path), with the bytes of each probe notebook the plan hashed: each
execution runs those bytes (not the archive's notebooks/, read later), in the archive's notebooks/
as its working directory, in its own kernel process under the same per-probe timeout,
with a utilization trace of that worker's machine, and sends back the executed notebook, its
records, its log, the trace and the worker's machine in words. Nothing else is written remotely.

Machines: the workers are grouped by the machine they run on (their host), and the replicates of
every execution are spread evenly over those machines: replicate r is sent to machine (r + s) mod M,
with s drawn from the run's id, so replicate r of every execution (every point of a sweep) shares
one machine and each machine measures a share of each execution. Each replicate records its
machine; the verdict then treats the machine as a level above the process (perfkit/stats.py). The
placement is a preference (Dask's loose restrictions), so a machine whose workers are gone does not
hang the run; a scheduler that steals work may move a replicate, and the replicate then says where it
ran. `local:MxN` turns work stealing off, so its placement holds.
`--cluster local:MxN` simulates a pool of M machines of N workers each on this host, each with its
own CPUs and its own machine id (`<this machine's id>/sim<k>`); `local:MxN:slowdown=1,1.1` gives
machine k's probes PERFKIT_SIMULATED_SLOWDOWN (a probe of known truth multiplies what it sleeps by it).

Measurement isolation: every execution asks for the `measure` resource, and a worker offers one
(`dask worker ADDRESS --nworkers 1 --nthreads 1 --resources measure=1`), so two executions never
share a worker; start one worker per machine (or per GPU, with CUDA_VISIBLE_DEVICES) for
measurements that do not disturb each other. A worker lost while it runs an execution costs that
execution one retry elsewhere; lost again, it ends as an error "worker lost: ...".

A Dask scheduler runs the code it is sent, and so do its workers: connect only to a cluster you
trust, over TLS on a shared network (Dask's `distributed.comm.tls` settings or a `Security`
object). The default is a local cluster on this machine.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from perfkit.errors import UserError
from perfkit.experiment.records import code, config
from perfkit.experiment.records.results import Execution
from perfkit.experiment.run import execute as executor
from perfkit.experiment.run.options import Simulated
from perfkit.files import Reader, write_atomic
from perfkit.machine import devices, fitness
from perfkit.paths import Project

RESOURCE = "measure"  # one per worker: the scheduler never runs two executions on one worker
INSTALL = "pip install 'perfkit[cluster]'  (or: pip install distributed)"
MAX_SHIPPED_BYTES = 64 * 2**20  # code and small inputs; a bigger archive is a mistake (or needs `code = [...]`)


def _distributed():
    try:
        import distributed
    except ImportError:
        raise UserError(f"--cluster needs Dask's distributed scheduler, which is not installed: {INSTALL}") from None
    return distributed


#: the simulated pool behind a client `connect` started (none: a real cluster, or local:N)
_SIMULATED: dict[int, Simulated] = {}


def connect(spec: str, *, timeout_s: float = 5.0):
    """A Dask client: `local:N` starts a LocalCluster of N single-threaded worker processes here,
    `local:MxN` one of M x N workers standing for M machines (Simulated)."""
    distributed = _distributed()
    import dask

    if spec.startswith("slurm:"):  # workers in Slurm jobs: perfkit/experiment/run/slurm.py
        from perfkit.experiment.run import slurm

        return slurm.connect(spec, resource=RESOURCE)
    if spec.startswith("local:"):
        simulated = Simulated.parse(spec)
        environ = dict(os.environ)  # Dask sets OMP_NUM_THREADS=1 and more here for its workers: not ours to keep
        try:
            settings = {
                "distributed.scheduler.allowed-failures": 1,  # one retry after a lost worker
                # a replicate waits for its machine's worker, not stolen by an idle one of another machine
                "distributed.scheduler.work-stealing": simulated.machines == 1,
            }
            with dask.config.set(settings):
                cluster = distributed.LocalCluster(
                    n_workers=simulated.machines * simulated.per_machine,
                    threads_per_worker=1,
                    processes=True,
                    resources={RESOURCE: 1},
                    # no dashboard, and the scheduler's HTTP server on any free port: two runs at once both
                    # asked for 8787, and the second warned that it was taken
                    scheduler_kwargs={"dashboard": False, "dashboard_address": ":0"},
                    silence_logs=40,
                )
                client = distributed.Client(cluster)
                if simulated.machines > 1:
                    _SIMULATED[id(client)] = simulated
                return client
        finally:
            os.environ.clear()
            os.environ.update(environ)
    client, workers = _reach(distributed, spec, timeout_s)
    if not any(w.get("resources", {}).get(RESOURCE) for w in workers.values()):
        client.close()
        raise UserError(
            f"no worker of {spec} offers the {RESOURCE!r} resource; start each worker with "
            f"`dask worker {spec} --nworkers 1 --nthreads 1 --resources {RESOURCE}=1`"
        )
    return client


def _reach(distributed, spec: str, timeout_s: float):
    """(client, its workers) of the scheduler at `spec`, the whole handshake under a deadline: a listener
    that accepts the connection and never answers is a UserError after `timeout_s` + 5 s, not a hang."""
    got: dict[str, Any] = {}

    def attempt() -> None:
        try:
            client = distributed.Client(spec, timeout=timeout_s)
            got["result"] = (client, client.scheduler_info().get("workers", {}))
        except Exception as exc:  # reported below, in the caller's thread
            got["error"] = exc

    thread = threading.Thread(target=attempt, name="perfkit-cluster-connect", daemon=True)
    thread.start()
    thread.join(timeout_s + 5.0)
    if thread.is_alive():
        raise UserError(f"the Dask scheduler at {spec} accepted the connection but did not answer; nothing was run")
    if "error" in got:
        exc = got["error"]
        raise UserError(f"cannot reach the Dask scheduler at {spec}: {type(exc).__name__}: {exc}; nothing was run")
    return got["result"]


def host_slots(client) -> dict[str, tuple[int, int]]:
    """Each measuring worker's (index, count) among those on its host: which of the host's CPU slots is its.

    Workers on one host run at once, so each runs its executions on CPUs of its own
    (perfkit.machine.fitness.slots): one rule for `--jobs N` here and for N workers on a machine.
    """
    workers = client.scheduler_info().get("workers", {})
    by_host: dict[str, list[str]] = {}
    for address in sorted(workers):
        if workers[address].get("resources", {}).get(RESOURCE):
            by_host.setdefault(workers[address].get("host") or address, []).append(address)
    return {a: (i, len(addresses)) for addresses in by_host.values() for i, a in enumerate(addresses)}


def machines(client) -> dict[str, list[str]]:
    """The measuring workers of each machine, machines and workers in a stable order: by host, or by
    simulated machine (`local:MxN`: worker name // N) under this host's id."""
    workers = client.scheduler_info().get("workers", {})
    measuring = sorted(a for a in workers if workers[a].get("resources", {}).get(RESOURCE))
    simulated = _SIMULATED.get(id(client))
    found: dict[str, list[str]] = {}
    for address in measuring:
        if simulated is not None:
            name = f"sim{int(workers[address].get('name', 0)) // simulated.per_machine}"
        else:
            name = workers[address].get("host") or address
        found.setdefault(name, []).append(address)
    return dict(sorted(found.items()))


def simulated_machine(client, name: str) -> dict | None:
    """What a simulated machine's workers are told: its id and slowdown (None: a real machine)."""
    simulated = _SIMULATED.get(id(client))
    if simulated is None:
        return None
    k = int(name.removeprefix("sim"))
    return {"id": f"{devices.machine_id()}/{name}", "name": name, "slowdown": simulated.slowdown[k]}


def machine_for(replicate: int, names: list[str], run_id: str) -> str:
    """Which machine replicate `replicate` of every execution runs on: spread evenly, starting at a
    machine drawn from the run's id (the same for every execution, so a sweep's replicate r is one machine's)."""
    start = int(hashlib.sha256(run_id.encode()).hexdigest(), 16) % len(names)
    return names[(replicate + start) % len(names)]


def offered(client) -> dict[str, float]:
    """The most of each resource any one worker offers."""
    most: dict[str, float] = {}
    for w in client.scheduler_info().get("workers", {}).values():
        for name, amount in (w.get("resources") or {}).items():
            most[name] = max(most.get(name, 0.0), float(amount))
    return most


def check_resources(client, needs: dict[str, dict[str, float]], labels: dict[str, str]) -> None:
    """Refuse, before anything runs, an execution no worker could take (it would wait forever)."""
    have = offered(client)
    for key, wanted in needs.items():
        for name, amount in wanted.items():
            if have.get(name, 0.0) < amount:
                raise UserError(
                    f"{labels.get(key, key)} asks for {name}={amount:g} (probe.resources) and no worker offers it "
                    f"(workers offer {have or 'nothing'}); start workers with `--resources {RESOURCE}=1,{name}=1`"
                )


def where(client) -> str:
    """The cluster in words, for the run's first line."""
    workers = client.scheduler_info().get("workers", {})
    found = machines(client)
    simulated = " simulated on this host" if id(client) in _SIMULATED else ""
    plural = "s" if len(found) != 1 else ""
    return f"{len(workers)} workers on {len(found)} machine{plural}{simulated} ({', '.join(found)})"


def archive(project: Project) -> tuple[str, bytes]:
    """(digest, zip) of what every execution needs from the project: the code under test and notebooks/.

    The zip is deterministic (sorted names, fixed times), so the same files give the same digest and
    a worker that unpacked it once reuses it.
    """
    buffer, size = io.BytesIO(), 0
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as packed:
        for path in code.files(project, config.read(project).code):
            data = path.read_bytes()
            size += len(data)
            if size > MAX_SHIPPED_BYTES:
                raise UserError(
                    f"the code a cluster run ships is over {MAX_SHIPPED_BYTES // 2**20} MiB "
                    f"(at {project.relative(path)}); name what the probes import in [tool.perfkit] code = [...]"
                )
            info = zipfile.ZipInfo(code.shipped_name(project, path), date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type, info.external_attr = (
                zipfile.ZIP_DEFLATED,
                (0o755 if os.access(path, os.X_OK) else 0o644) << 16,
            )
            packed.writestr(info, data)
    blob = buffer.getvalue()
    return hashlib.sha256(blob).hexdigest()[:16], blob


def ship(client, project: Project, probes: dict[str, bytes] | None = None):
    """Send the project's code and notebooks to every worker once per run: a future the run's rounds share.

    `probes` (notebook -> the bytes the plan hashed, `Plan.sources`) are what the executions run; a
    notebook not among them runs as the archive has it.
    """
    digest, blob = archive(project)
    # One future for the whole archive, under a key of its own (hash=False): a key shared with an earlier
    # run's archive being released would lose this run's tasks their input ("lost dependencies").
    sent = {"digest": digest, "archive": blob, "probes": dict(probes or {})}
    (shipped,) = client.scatter([sent], broadcast=True, hash=False)
    return shipped


def unpacked(shipped: dict[str, Any]) -> Path:
    """The worker's copy of the project's code, unpacked once per digest under the temporary folder."""
    cache = Path(tempfile.gettempdir()) / "perfkit-code"
    target = cache / shipped["digest"]
    if target.is_dir():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{shipped['digest']}-", dir=cache))
    with zipfile.ZipFile(io.BytesIO(shipped["archive"])) as packed:
        packed.extractall(partial)
    try:
        partial.rename(target)
    except OSError:  # another worker on this machine unpacked it first
        shutil.rmtree(partial, ignore_errors=True)
    return target


@dataclass(frozen=True)
class Request:
    """One execution to send: where its files go here, and what a worker must offer for it."""

    planned: Execution
    exec_dir: Path
    extra: dict | None  # parameters the plan does not key on (the replicate index)
    resources: dict[str, float]


@dataclass(frozen=True)
class Round:
    """A round of a run's executions, sent together, with the run's shipped code (`ship`)."""

    run_id: str
    timeout_s: float
    requests: list[Request]
    shipped: Any  # the future `ship` returned


def run_on_worker(shipped: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """The worker's side: execute one probe against the shipped code, return its files, cell times and trace.

    `request` holds the planned execution (`planned`, as JSON), `notebook`, `run_id`, `timeout_s` and `extra`.
    """
    code_root = unpacked(shipped)
    cpus = None
    try:
        index, count = request.get("slots", {})[_distributed().get_worker().address]
        cpus = fitness.slots(count)[index]
    except (KeyError, ValueError):  # a worker the run did not know of when it sent this: the host's CPUs
        pass
    with tempfile.TemporaryDirectory(prefix="perfkit-worker-") as tmp:
        root = Path(tmp)
        notebook = code_root / "notebooks" / request["notebook"]
        source = (shipped.get("probes") or {}).get(request["notebook"])
        if source is not None:  # the bytes the run hashed, under the probe's own name
            notebook = root / "probe" / request["notebook"]
            write_atomic(notebook, source)
        # the run's count, not Dask's (its nanny sets OMP_NUM_THREADS=1 for every worker)
        env = fitness.thread_env(request["threads"])
        machine = devices.identity()
        simulated = (request.get("simulated") or {}).get(_distributed().get_worker().address)
        if simulated is not None:  # one of the machines `local:MxN` stands for
            machine = {**machine, "id": simulated["id"], "host": f"{machine['host']}/{simulated['name']}"}
            env |= {devices.MACHINE_ID: simulated["id"], "PERFKIT_SIMULATED_SLOWDOWN": repr(simulated["slowdown"])}
        ended = executor.measure(
            executor.Job(
                planned=Execution.from_json(Reader(request["planned"], "planned execution")),
                notebook=notebook,
                exec_dir=root / "exec",
                run_id=request["run_id"],
                cwd=code_root / "notebooks",
                code_root=code_root,
                kernel_dir=executor.ensure_kernelspec(root / "jupyter"),
                timeout_s=request["timeout_s"],
                env=env,
                extra=request["extra"],
                cpus=cpus,
                machine=machine,
            )
        )
        files = {p.name: p.read_bytes() for p in (root / "exec").iterdir() if p.is_file()}
        return {
            "execution": ended.execution.to_json(),
            "cells": [list(c) for c in ended.cells],
            "files": files,
            "trace": ended.trace,
            "host": machine["host"],
            "machine": devices.describe(),
            "threads": env.get("OMP_NUM_THREADS"),
        }


def _arrived(got: dict[str, Any], exec_dir: Path) -> executor.Ended:
    """A worker's answer, its files written under exec_dir."""
    exec_dir.mkdir(parents=True, exist_ok=True)
    for name, data in got["files"].items():
        (exec_dir / name).write_bytes(data)
    execution = Execution.from_json(Reader(got["execution"], f"{exec_dir}/execution"))
    return executor.Ended(
        replace(execution, host=got["host"]),
        cells=tuple((str(c[0]), float(c[1]), float(c[2])) for c in got.get("cells", [])),
        trace=None if got["trace"] is None else got["trace"] | {"machine": got["machine"]},
    )


def execute(
    client,
    batch: Round,
    *,
    started: Callable[[Execution, str], None],
    ended: Callable[[Execution, executor.Ended], None],
) -> None:
    """Run the round on the cluster; `ended(planned, ended)` as each execution ends.

    A lost worker is retried once by the scheduler, then the execution ends "error" with the reason.
    Interrupted, the remote work still queued or running is cancelled.
    """
    distributed = _distributed()
    futures = {}
    slots = host_slots(client)
    pool = machines(client)
    names = list(pool)
    simulated = {a: simulated_machine(client, name) for name, addresses in pool.items() for a in addresses}
    for request in batch.requests:
        planned = request.planned
        machine = machine_for(planned.replicate, names, batch.run_id) if len(names) > 1 else None
        sent = {
            "planned": planned.to_json(),
            "notebook": planned.notebook,
            "run_id": batch.run_id,
            "timeout_s": batch.timeout_s,
            "extra": request.extra,
            "threads": planned.threads or fitness.threads_for(),
            "slots": slots,
            "simulated": simulated if id(client) in _SIMULATED else None,
        }
        future = client.submit(
            run_on_worker,
            batch.shipped,
            sent,
            resources={RESOURCE: 1, **request.resources},
            # its machine's share, not any worker; a machine whose workers are all gone: another, not a hang
            **({"workers": pool[machine], "allow_other_workers": True} if machine is not None else {}),
            pure=False,
            key=f"perfkit-{batch.run_id}-{planned.key}-r{planned.replicate}-{time.monotonic_ns()}",
        )
        futures[future] = request
        started(planned, "queued on the cluster")
    try:
        for future in distributed.as_completed(list(futures)):
            request = futures[future]
            try:
                got = future.result()
            except Exception as exc:  # KilledWorker, a closed connection: the worker, not the probe
                reason = f"worker lost: {type(exc).__name__}: {exc}"[:500]
                lost = replace(request.planned, status="error", run_id=batch.run_id, wall_s=0.0, reason=reason)
                ended(request.planned, executor.Ended(lost))
                continue
            ended(request.planned, _arrived(got, request.exec_dir))
    except BaseException:
        client.cancel(list(futures), force=True)
        raise


def close(client) -> None:
    """Close the client, and the LocalCluster it started."""
    owned = getattr(client, "cluster", None)
    _SIMULATED.pop(id(client), None)
    client.close()
    if owned is not None:
        owned.close()
