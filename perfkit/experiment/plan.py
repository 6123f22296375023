"""Planning a run: the distinct probe executions the selected hypotheses need.

Each distinct (notebook, parameters) pair is one planned `Execution`, whatever the number of
hypotheses that read it. Its key hashes the notebook's bytes, the parameters, perfkit's source
and the profiler, so an unchanged execution can be reused from an earlier run.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from perfkit.errors import UserError
from perfkit.experiment.hypothesis import Hypothesis, check_parameter, notebook_parameters
from perfkit.experiment.results import Execution
from perfkit.paths import Project

_PACKAGE = Path(__file__).resolve().parents[1]


REPLICATE_PARAM = "replicate"  # a probe that declares it is told which replicate it is


@dataclass(frozen=True)
class Plan:
    """The distinct executions, in first-needed order, and the keys each hypothesis reads."""

    executions: tuple[Execution, ...]  # replicate 0 of each
    needs: dict[str, tuple[str, ...]]  # hypothesis id -> execution keys
    replicates: dict[str, int]  # execution key -> independent kernel processes to run
    told: frozenset[str] = frozenset()  # keys whose notebook declares the `replicate` parameter

    def replicated(self) -> list[Execution]:
        """Every replicate of every execution, round by round: replicate 0 of all, then 1, ..."""
        rounds = max(self.replicates.values(), default=0)
        return [replace(x, replicate=r) for r in range(rounds) for x in self.executions if r < self.replicates[x.key]]


def source_tree_hash() -> str:
    """Hash of the perfkit package's files: a change in the framework or engine invalidates the cache."""
    digest = hashlib.sha256()
    for path in sorted(_PACKAGE.rglob("*")):
        parts = path.relative_to(_PACKAGE).parts
        if (
            "__pycache__" in parts
            or any(p.startswith(".") for p in parts)
            or path.suffix == ".pyc"
            or not path.is_file()
        ):
            continue
        digest.update(path.relative_to(_PACKAGE).as_posix().encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """`K=V` strings to parameters; V is read as YAML so 4096 is an int and 0.5 a float."""
    out = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep or not name.strip():
            raise UserError(f"--param expects NAME=VALUE, got {pair!r}")
        try:
            out[name.strip()] = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError:
            raise UserError(f"--param {name}: cannot read value {text!r}") from None
    return out


def execution_key(notebook_bytes: bytes, params: dict[str, Any], source_hash: str, profile: str | None) -> str:
    digest = hashlib.sha256(notebook_bytes)
    digest.update(json.dumps(params, sort_keys=True, default=str).encode())
    digest.update(source_hash.encode())
    digest.update((profile or "").encode())
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


def plan(
    project: Project,
    hypotheses: list[Hypothesis],
    *,
    quick: bool,
    overrides: dict[str, Any],
    source_hash: str,
    profile: str | None,
    replicates: int = 1,
    note: Callable[[str], None] = print,
) -> Plan:
    """The distinct executions the hypotheses need; an override no selected probe declares is an error."""
    declared_cache: dict[str, dict] = {}
    used_overrides: set[str] = set()
    by_key: dict[str, Execution] = {}
    needs: dict[str, tuple[str, ...]] = {}
    counts: dict[str, int] = {}
    told: set[str] = set()
    for h in hypotheses:
        path = project.notebooks_dir / h.probe.notebook
        if h.probe.notebook not in declared_cache:
            declared_cache[h.probe.notebook] = notebook_parameters(path)
        declared = declared_cache[h.probe.notebook]
        params = dict(h.probe.params)
        if quick:
            params.update(h.probe.quick)
        for name, value in overrides.items():
            if name in declared:
                problem = check_parameter(name, value, declared)
                if problem:
                    raise UserError(f"--param {name}={value!r}: {problem} ({h.probe.notebook})")
                params[name] = value
                used_overrides.add(name)
        notebook_bytes = path.read_bytes()
        keys = []
        for point in _points(h, params, quick=quick, overrides=overrides, note=note):
            key = execution_key(notebook_bytes, point, source_hash, profile)
            by_key.setdefault(key, Execution(key=key, notebook=h.probe.notebook, params=point))
            counts[key] = max(counts.get(key, 1), h.probe.replicates or replicates)
            if isinstance(declared, dict) and REPLICATE_PARAM in declared:
                told.add(key)
            keys.append(key)
        needs[h.id] = tuple(keys)
    unused = sorted(set(overrides) - used_overrides)
    if unused:
        raise UserError(f"--param {', '.join(unused)}: no selected probe declares it")
    return Plan(executions=tuple(by_key.values()), needs=needs, replicates=counts, told=frozenset(told))
