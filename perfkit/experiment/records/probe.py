"""The `probe:` block of a hypothesis record: the notebook that measures the claim, its parameters (full and
`--quick`), a sweep, and how it is run (replicates, threads, resources, the sample counts perfkit may choose,
more code under test). Checked against the parameters the notebook itself declares; each error is added to the
record's checker, naming the field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from perfkit.experiment.records.checker import Checker, finite, is_number, optional, required, shown, type_name
from perfkit.experiment.records.notebooks import check_parameter, literal_default, notebook_parameters
from perfkit.paths import Project

MAX_REPLICATES = 50
MAX_SAMPLE_COUNT = 1_000_000
CODE_NAME = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_./-]*$")  # a path under the project or a distribution name
RESOURCE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,31}$")
PROBE_KEYS = {
    "notebook": required("a notebook under notebooks/ with a cell tagged `parameters`"),
    "params": optional("the notebook's parameters for a full run; each must be declared in its parameters cell"),
    "quick": optional("parameters that override params for `--quick`"),
    "sweep": optional("one execution per value of a parameter: {param, values, quick}"),
    "replicates": optional(f"kernel processes per execution, 1 to {MAX_REPLICATES} (default: the run's)"),
    "resources": optional("what a cluster worker must offer to run it, as {name: amount}, like {GPU: 1}"),
    "code": optional("more code under test (paths under the project, installed distributions) for the cache key"),
    "threads": optional("CPU threads of its executions (default: the run decides once, for every replicate)"),
    "samples": optional(
        "integer parameters perfkit may set within [low, high] to split samples and processes so the verdict "
        "comes soonest, like {repeat: [10, 80]}; no other parameter is ever changed"
    ),
}
SWEEP_KEYS = {
    "param": required("the parameter swept, declared by the notebook"),
    "values": required("its values: one execution each"),
    "quick": optional("the values for `--quick`"),
}


@dataclass(frozen=True)
class Sweep:
    """One probe execution per value of `param`."""

    param: str
    values: tuple[Any, ...]
    quick: tuple[Any, ...] | None = None


@dataclass(frozen=True)
class Probe:
    notebook: str
    params: dict[str, Any] = field(default_factory=dict)
    quick: dict[str, Any] = field(default_factory=dict)
    sweep: Sweep | None = None
    replicates: int | None = None  # independent kernel processes per execution; None: the run's default
    resources: dict[str, float] = field(default_factory=dict)  # what a cluster worker must offer: {"GPU": 1}
    code: tuple[str, ...] = ()  # more code under test: paths under the project, installed distributions
    threads: int | None = None  # CPU threads of its executions (None: the run decides, once, for every replicate)
    # sample-count parameters perfkit may set within [low, high] for the split of processes and samples
    # that decides soonest (replicates.py); no other parameter is ever changed
    samples: dict[str, tuple[int, int]] = field(default_factory=dict)
    sample_defaults: dict[str, int] = field(default_factory=dict)  # the notebook's own value of each, where literal


def _check_notebook(checker: Checker, notebook: str, project: Project, cache: dict) -> dict | None:
    """The parameters the probe notebook declares, or None after adding why it cannot be used."""
    where = ("probe", "notebook")
    path = project.notebooks_dir / notebook
    if not notebook.endswith(".ipynb"):
        checker.fail(where, f"expected a .ipynb file under notebooks/, got {notebook!r}")
    elif not path.resolve().is_relative_to(project.notebooks_dir.resolve()):  # after symlinks and ../
        checker.fail(
            where, f"{notebook!r} resolves outside notebooks/; a record may only name the project's own probes"
        )
    elif not project.notebooks_dir.resolve().is_relative_to(project.root.resolve()):  # notebooks/ a link out
        checker.fail(
            where,
            f"notebooks/ is a link to {project.notebooks_dir.resolve()}, outside the project: probes run its code",
        )
    elif not path.is_file():
        checker.fail(where, f"no such notebook: {project.relative(path)}")
    else:
        if path not in cache:
            cache[path] = notebook_parameters(path)
        if not isinstance(cache[path], str):
            return cache[path]
        checker.fail(where, f"{cache[path]} ({project.relative(path)})")
    return None


def check_probe(checker: Checker, raw: Any, project: Project, notebook_cache: dict) -> Probe | None:
    where = ("probe",)
    probe = checker.mapping(raw, where)
    if probe is None:
        return None
    errors_before = len(checker.errors)
    checker.keys(probe, where, PROBE_KEYS)
    notebook = checker.string(probe, "notebook", where)
    declared = _check_notebook(checker, notebook, project, notebook_cache) if notebook is not None else None

    blocks: dict[str, dict] = {}
    for key in ("params", "quick"):
        if key in probe:
            block = checker.mapping(probe[key] if probe[key] is not None else {}, where + (key,))
            if block is not None:
                blocks[key] = block
                for name, value in block.items():
                    if declared is not None:
                        problem = check_parameter(name, value, declared)
                        if problem:
                            checker.fail(where + (key, name), problem)
    sweep = None
    if "sweep" in probe:
        sweep = _check_sweep(checker, probe["sweep"], declared)
    replicates = checker.integer(probe, "replicates", where, low=1, high=MAX_REPLICATES)
    resources: dict[str, float] = {}
    if "resources" in probe:
        block = checker.mapping(probe["resources"], where + ("resources",))
        for name, amount in (block or {}).items():
            if not isinstance(name, str) or not RESOURCE_NAME.match(name):
                checker.fail(where + ("resources", name), "a resource is a name like GPU or memory_gb")
            elif not is_number(amount) or not finite(amount) or not 0 < amount <= 1024:
                checker.fail(where + ("resources", name), f"expected a number from 0 to 1024, got {shown(amount)}")
            else:
                resources[name] = float(amount)
    code = _check_code(checker, probe.get("code"), where + ("code",)) if "code" in probe else ()
    threads = checker.integer(probe, "threads", where, low=1, high=1024)
    counts = _check_samples(checker, probe["samples"], declared, blocks, sweep) if "samples" in probe else {}
    if len(checker.errors) > errors_before:
        return None
    return Probe(
        samples=counts,
        sample_defaults=_defaults(declared, counts),
        code=code,
        threads=threads,
        notebook=notebook,
        params=dict(blocks.get("params", {})),
        quick=dict(blocks.get("quick", {})),
        sweep=sweep,
        replicates=replicates,
        resources=resources,
    )


def _check_samples(
    checker: Checker, raw: Any, declared: dict | None, blocks: dict[str, dict], sweep: Sweep | None
) -> dict[str, tuple[int, int]]:
    """`probe.samples`: {parameter: [low, high]}, each an integer parameter of the notebook that the sweep
    does not vary, its given values (params, quick) inside the range."""
    where = ("probe", "samples")
    block = checker.mapping(raw, where)
    out: dict[str, tuple[int, int]] = {}
    for name, bounds in (block or {}).items():
        here = where + (name,)
        if not (
            isinstance(bounds, list)
            and len(bounds) == 2
            and all(isinstance(b, int) and not isinstance(b, bool) and 1 <= b <= MAX_SAMPLE_COUNT for b in bounds)
            and bounds[0] <= bounds[1]
        ):
            checker.fail(
                here,
                f"expected [low, high], integers from 1 to {MAX_SAMPLE_COUNT:,} with low <= high, got {shown(bounds)}",
            )
            continue
        if declared is not None:
            problem = check_parameter(name, bounds[0], declared)
            if problem:
                checker.fail(here, f"a sample count is an integer parameter of the notebook: {problem}")
                continue
        if sweep is not None and sweep.param == name:
            checker.fail(here, f"{name} is the swept parameter, not a sample count")
            continue
        for key, given in blocks.items():
            value = given.get(name)
            if isinstance(value, int) and not bounds[0] <= value <= bounds[1]:
                checker.fail(where + (name,), f"probe.{key}.{name} is {value}, outside [{bounds[0]}, {bounds[1]}]")
        out[name] = (bounds[0], bounds[1])
    return out


def _defaults(declared: dict | None, names) -> dict[str, int]:
    """The notebook's default of each sample-count parameter that has an integer literal one: the count a
    replicate measured with when the record's params did not set it."""
    out = {}
    for name in names:
        value = literal_default((declared or {}).get(name, {}).get("default"))
        if isinstance(value, int) and not isinstance(value, bool):
            out[name] = value
    return out


def _check_code(checker: Checker, raw: Any, where: tuple) -> tuple[str, ...]:
    """`probe.code`: a list of paths under the project (no `..`) and installed distribution names."""
    if not isinstance(raw, list) or not raw:
        checker.fail(where, f"expected a list of paths and package names, got {type_name(raw)}")
        return ()
    for i, name in enumerate(raw):
        if not isinstance(name, str) or not CODE_NAME.match(name) or ".." in name.split("/"):
            checker.fail(where + (i,), f"expected a path under the project or a package name, got {name!r}")
    return tuple(str(n) for n in raw)


def _check_sweep(checker: Checker, raw: Any, declared: dict | None) -> Sweep | None:
    where = ("probe", "sweep")
    sweep = checker.mapping(raw, where)
    if sweep is None:
        return None
    checker.keys(sweep, where, SWEEP_KEYS)
    param = checker.string(sweep, "param", where)
    if param is not None and declared is not None and param not in declared:
        checker.fail(where + ("param",), check_parameter(param, None, declared))
        param = None
    lists: dict[str, tuple] = {}
    for key in ("values", "quick"):
        if key not in sweep:
            continue
        values = sweep[key]
        if not isinstance(values, list) or not values:
            checker.fail(where + (key,), f"expected a non-empty list, got {type_name(values)}")
            continue
        if len(set(map(repr, values))) != len(values):
            checker.fail(where + (key,), "values repeat; each sweep point runs once")
        if param is not None and declared is not None:
            for i, value in enumerate(values):
                problem = check_parameter(param, value, declared)
                if problem:
                    checker.fail(where + (key, i), problem)
        lists[key] = tuple(values)
    if param is None or "values" not in lists:
        return None
    return Sweep(param=param, values=lists["values"], quick=lists.get("quick"))
