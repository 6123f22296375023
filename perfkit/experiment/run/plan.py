"""Planning a run: the distinct probe executions the selected hypotheses need.

Each distinct (notebook, parameters) pair is one planned `Execution`, whatever the number of
hypotheses that read it. Its key hashes what decides the measurement: the notebook's code cells
(not its outputs, execution counts or prose), the parameters, perfkit's source, the profiler and
the environment (`environment_key`: Python, torch and CUDA runtime versions, the machine's
fingerprint and the environment variables that change performance). An execution is reused from
an earlier run only when all of them are the same.

Each notebook is read once: the plan keeps the very bytes it hashed (`Plan.sources`), and every
replicate, here or on a cluster, executes a copy of those bytes (runs/<run-id>/probes/), never the
file in notebooks/ again, which may have been edited since.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from perfkit.errors import UserError
from perfkit.experiment.records import served
from perfkit.experiment.records.code import CodeState
from perfkit.experiment.records.hypothesis import Hypothesis
from perfkit.experiment.records.notebooks import COMPUTED, check_parameter, literal_default, notebook_parameters
from perfkit.experiment.records.results import Execution
from perfkit.experiment.run.options import RunOptions
from perfkit.machine import fitness
from perfkit.paths import PACKAGE_DIR, Project

_PACKAGE = PACKAGE_DIR  # perfkit/, engine and kernels included


REPLICATE_PARAM = "replicate"  # a probe that declares it is told which replicate it is


@dataclass(frozen=True)
class Plan:
    """The distinct executions, in first-needed order, and the keys each hypothesis reads."""

    executions: tuple[Execution, ...]  # replicate 0 of each
    needs: dict[str, tuple[str, ...]]  # hypothesis id -> execution keys
    replicates: dict[str, int]  # execution key -> independent kernel processes to run
    told: frozenset[str] = frozenset()  # keys whose notebook declares the `replicate` parameter
    resources: dict[str, dict[str, float]] = field(default_factory=dict)  # key -> what a worker must offer
    code: dict[str, CodeState] = field(default_factory=dict)  # key -> the code under test it measures
    notebooks: dict[str, str] = field(default_factory=dict)  # notebook -> a hash of its code cells
    sources: dict[str, bytes] = field(default_factory=dict)  # notebook -> the bytes read once and hashed

    def replicated(self) -> list[Execution]:
        """Every replicate of every execution, round by round: replicate 0 of all, then 1, ..."""
        rounds = max(self.replicates.values(), default=0)
        return [replace(x, replicate=r) for r in range(rounds) for x in self.executions if r < self.replicates[x.key]]


def source_files() -> list[Path]:
    """The perfkit package's files, in a stable order: the framework, the engine, its kernels and weights."""
    files = []
    for path in sorted(_PACKAGE.rglob("*")):
        parts = path.relative_to(_PACKAGE).parts
        if "__pycache__" in parts or any(p.startswith(".") for p in parts) or path.suffix == ".pyc":
            continue
        if path.is_file():
            files.append(path)
    return files


def source_tree_hash() -> str:
    """Hash of the perfkit package's files: a change in the framework or engine invalidates the cache."""
    digest = hashlib.sha256()
    for path in source_files():
        digest.update(path.relative_to(_PACKAGE).as_posix().encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


#: Environment variables that change how fast a probe runs: a different value is a different measurement.
PERFORMANCE_ENV = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "OMP_PROC_BIND",
    "OMP_PLACES",
    "KMP_AFFINITY",
    "GOMP_CPU_AFFINITY",
    "MALLOC_ARENA_MAX",
    "LD_PRELOAD",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_LAUNCH_BLOCKING",
    "CUDA_DEVICE_MAX_CONNECTIONS",
    "CUBLAS_WORKSPACE_CONFIG",
    "NVIDIA_TF32_OVERRIDE",
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_NO_CUDA_MEMORY_CACHING",
    "PERFKIT_PROFILE",
)
PERFORMANCE_ENV_PREFIXES = ("TORCHINDUCTOR_", "TORCH_CUDNN_", "NCCL_")
_NOT_PERFORMANCE = ("CACHE", "_DIR", "_PATH", "_HOME", "DEBUG_FILE")  # where files go, not how fast (torch sets some)


def _changes_performance(name: str) -> bool:
    if name in PERFORMANCE_ENV:
        return True
    return name.startswith(PERFORMANCE_ENV_PREFIXES) and not any(word in name for word in _NOT_PERFORMANCE)


def _installed(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def environment_key(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """What besides the notebook decides a measurement: versions, the machine, performance variables."""
    import platform
    from importlib import metadata

    from perfkit.machine import devices

    environ = dict(os.environ if environ is None else environ)
    cuda = sorted(
        f"{d.metadata['Name']}=={d.version}"
        for d in metadata.distributions()
        if (d.metadata["Name"] or "").lower().startswith(("nvidia-cuda-runtime", "nvidia-cudnn"))
    )
    return {
        "python": platform.python_version(),
        "torch": _installed("torch"),
        "cuda_runtime": cuda,
        "machine": devices.fingerprint(),
        "env": {k: v for k, v in sorted(environ.items()) if _changes_performance(k)},
    }


def notebook_code(path: Path) -> bytes:
    """The part of a notebook that decides what it measures: its code cells and their tags.

    Saving the notebook after Run All in JupyterLab (outputs, execution counts, widths) or editing its
    prose leaves this unchanged, so the cache stays warm.
    """
    return code_cells(path.read_bytes())


def code_cells(source: bytes) -> bytes:
    """`notebook_code` of a notebook's bytes, as read once (the bytes every replicate then executes)."""
    nb = json.loads(source.decode("utf-8"))
    cells = [
        {"source": "".join(c.get("source", "")), "tags": sorted(c.get("metadata", {}).get("tags", []))}
        for c in nb.get("cells", [])
        if c.get("cell_type") == "code"
    ]
    kernel = nb.get("metadata", {}).get("kernelspec", {}).get("name")
    return json.dumps({"cells": cells, "kernel": kernel}, sort_keys=True).encode()


def execution_key(
    code: bytes,
    params: dict[str, Any],
    source_hash: str,
    profile: str | None,
    environment: dict[str, Any],
    under_test: str,
) -> str:
    """What decides a measurement: the notebook's code, its parameters, perfkit, the profiler, the environment
    and the code under test (perfkit/experiment/records/code.py)."""
    digest = hashlib.sha256(code)
    digest.update(under_test.encode())
    digest.update(json.dumps(params, sort_keys=True, default=str).encode())
    digest.update(source_hash.encode())
    digest.update((profile or "").encode())
    digest.update(json.dumps(environment, sort_keys=True, default=str).encode())
    return digest.hexdigest()[:16]


def _points(
    h: Hypothesis, params: dict[str, Any], *, quick: bool, overrides: dict[str, Any], note: Callable[[str], None]
) -> list[dict[str, Any]]:
    """The parameters of each execution one hypothesis needs (one per sweep value)."""
    sweep = h.probe.sweep
    if sweep is None:
        return [params]
    if sweep.param in overrides:
        note(f"note: {h.id} sweeps {sweep.param}; --param {sweep.param} does not apply to it")
    values = sweep.quick if quick and sweep.quick else sweep.values
    return [{**params, sweep.param: v} for v in values]


def _server(declared: dict | str, point: dict[str, Any], servers: dict[str, dict]) -> dict | None:
    """The identity of the server a probe with a `server_url` parameter drives at this point (asked once per URL)."""
    if not isinstance(declared, dict) or served.SERVER_PARAM not in declared:
        return None
    url = str(_value(declared, point, served.SERVER_PARAM) or "")
    if not url:  # the probe starts its own: described by the parameters it starts it with
        chosen = {name: _value(declared, point, name) for name in served.STARTED_WITH if name in declared}
        return served.started(chosen)
    if url not in servers:
        servers[url] = served.identity(url)
    return servers[url]


def _value(declared: dict, point: dict[str, Any], name: str) -> Any:
    """A parameter's value at this point: given, else the notebook's default (papermill reports its source text)."""
    if name in point:
        return point[name]
    value = literal_default(declared[name].get("default") or '""')
    return None if value is COMPUTED else value


@dataclass(frozen=True)
class Basis:
    """What every execution's key holds besides its notebook and parameters."""

    source_hash: str  # perfkit's own source (source_tree_hash)
    environment: dict[str, Any]  # environment_key(), and the cluster when there is one
    code: Callable[[tuple[str, ...]], CodeState]  # the code under test, given a record's probe.code
    replicates: int = 1  # planned per execution, unless a record's probe.replicates asks more
    strict: bool = False  # fitness = "strict": a dedicated machine, whose cores the default threads use
    #: url -> the identity of the running server a probe drives, asked by the first plan of the run that needs
    #: it and kept for the others (a server that does not answer holds a run once, not once a plan)
    servers: dict[str, dict] = field(default_factory=dict)


def _params(h: Hypothesis, declared: dict | str, options: RunOptions, used: set[str]) -> dict[str, Any]:
    """A hypothesis's parameters: its record's, its quick ones with --quick, then the --param overrides."""
    params = dict(h.probe.params)
    if options.quick:
        params.update(h.probe.quick)
    for name, value in options.overrides.items():
        if name in declared:
            problem = check_parameter(name, value, declared)
            if problem:
                raise UserError(f"--param {name}={value!r}: {problem} ({h.probe.notebook})")
            params[name] = value
            used.add(name)
    return params


def plan(
    project: Project,
    hypotheses: list[Hypothesis],
    options: RunOptions,
    basis: Basis,
    *,
    note: Callable[[str], None] = print,
    samples: dict[str, dict[str, int]] | None = None,
) -> Plan:
    """The distinct executions the hypotheses need; an override no selected probe declares is an error.

    `samples`: sample counts chosen for executions (by their key without them, replicates.py); every
    hypothesis that reads such an execution reads it with them."""
    quick, overrides = options.quick, options.overrides
    declared_cache: dict[str, dict] = {}
    used_overrides: set[str] = set()
    by_key: dict[str, Execution] = {}
    needs: dict[str, tuple[str, ...]] = {}
    counts: dict[str, int] = {}
    told: set[str] = set()
    resources: dict[str, dict[str, float]] = {}
    code_of: dict[str, CodeState] = {}
    notebooks: dict[str, str] = {}
    sources: dict[str, bytes] = {}  # notebook -> its bytes, read once: what is hashed is what every replicate runs
    servers = basis.servers
    for h in hypotheses:
        path = project.notebooks_dir / h.probe.notebook
        if h.probe.notebook not in declared_cache:
            declared_cache[h.probe.notebook] = notebook_parameters(path)
        declared = declared_cache[h.probe.notebook]
        params = _params(h, declared, options, used_overrides)
        if h.probe.notebook not in sources:
            sources[h.probe.notebook] = path.read_bytes()
        code = code_cells(sources[h.probe.notebook])
        notebooks[h.probe.notebook] = hashlib.sha256(code).hexdigest()[:16]
        under_test = basis.code(h.probe.code)
        threads = h.probe.threads or options.threads or fitness.threads_for(options.at_once(), strict=basis.strict)
        environment = {**basis.environment, "threads": threads}  # the treatment, the same for every replicate
        keys = []
        for point in _points(h, params, quick=quick, overrides=overrides, note=note):
            server = _server(declared, point, servers)
            seen = {**environment, "server": server} if server else environment
            key = execution_key(code, point, basis.source_hash, options.profile, seen, under_test.digest)
            if samples and key in samples:
                point = {**point, **samples[key]}
                key = execution_key(code, point, basis.source_hash, options.profile, seen, under_test.digest)
            code_of[key] = under_test
            by_key.setdefault(
                key, Execution(key=key, notebook=h.probe.notebook, params=point, threads=threads, server=server)
            )
            counts[key] = max(counts.get(key, 1), h.probe.replicates or basis.replicates)
            needed = resources.setdefault(key, {})
            for name, amount in h.probe.resources.items():
                needed[name] = max(needed.get(name, 0.0), amount)
            if isinstance(declared, dict) and REPLICATE_PARAM in declared:
                told.add(key)
            keys.append(key)
        needs[h.id] = tuple(keys)
    unused = sorted(set(overrides) - used_overrides)
    if unused:
        raise UserError(f"--param {', '.join(unused)}: no selected probe declares it")
    return Plan(
        executions=tuple(by_key.values()),
        needs=needs,
        replicates=counts,
        told=frozenset(told),
        resources={k: v for k, v in resources.items() if v},
        code=code_of,
        notebooks=notebooks,
        sources=sources,
    )
