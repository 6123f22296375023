"""Why a run executes a probe again instead of reusing it: what changed since the run that measured it.

The run it compares with is the newest earlier run whose manifest holds an execution of the same
notebook and parameters. Its manifest says what that execution's key was made of (the probe's code,
the code under test, perfkit's source, the environment, the profiler); each part that differs now is
named: "ownlib/__init__.py changed", "numpy 2.1.0 -> 2.2.0", "OMP_NUM_THREADS 2 -> 1".
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from perfkit.experiment.records import code, served
from perfkit.experiment.records.results import Execution
from perfkit.paths import Project

NEVER = "never measured here"  # no earlier run under runs/ executed this notebook with these parameters


@dataclass(frozen=True)
class Now:
    """What the current run's keys are made of."""

    notebooks: dict[str, str]  # notebook -> hash of its code cells
    code: dict[str, code.CodeState]  # execution key -> the code under test
    source_hash: str
    environment: dict[str, Any]
    profile: str | None


@dataclass
class Earlier:
    """The earlier runs' manifests, newest first, read once per run."""

    project: Project
    current_run: str
    _manifests: list[tuple[str, dict]] | None = field(default=None, repr=False)

    def manifests(self) -> list[tuple[str, dict]]:
        if self._manifests is None:
            found = []
            for path in sorted(self.project.runs_dir.glob("*/manifest.json"), reverse=True):
                if path.parent.name == self.current_run:
                    continue
                try:
                    data = json.loads(path.read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    continue
                if isinstance(data, dict) and isinstance(data.get("executions"), list):
                    found.append((path.parent.name, data))
            self._manifests = found
        return self._manifests

    def left_out(self, readers: list[str]) -> tuple[str, str, str] | None:
        """(run id, hypothesis, why) of the newest earlier run whose budget left out one of `readers` (the
        hypotheses reading an execution about to run): what a run measures after all, it says it does."""
        for run_id, manifest in self.manifests():
            left = manifest.get("left_out") or {}
            for hid in readers:
                if isinstance(left, dict) and isinstance(left.get(hid), str):
                    return run_id, hid, left[hid]
        return None

    def last(self, planned: Execution) -> tuple[str, dict, dict] | None:
        """(run id, its manifest, the execution there) of the newest run that executed this notebook and parameters."""
        for run_id, manifest in self.manifests():
            for x in manifest["executions"]:
                same = (
                    isinstance(x, dict) and x.get("notebook") == planned.notebook and x.get("params") == planned.params
                )
                if same and x.get("replicate", 0) == planned.replicate and not x.get("reused"):
                    return run_id, manifest, x
        return None


def _environment(before: dict, now: dict) -> list[str]:
    said = []
    for name in ("python", "torch", "cuda_runtime"):
        if before.get(name) != now.get(name):
            said.append(f"{name} {before.get(name)} -> {now.get(name)}")
    if before.get("machine") != now.get("machine"):
        said.append("another machine")
    old, new = before.get("env") or {}, now.get("env") or {}
    for name in sorted(set(old) | set(new)):
        if old.get(name) != new.get(name):
            said.append(f"{name} {old.get(name, 'unset')} -> {new.get(name, 'unset')}")
    if before.get("cluster") != now.get("cluster"):
        said.append(f"cluster {before.get('cluster') or 'none'} -> {now.get('cluster') or 'none'}")
    return said


def differences(project: Project, manifest: dict, then: dict, planned: Execution, now: Now) -> list[str]:
    """What differs between the execution `then` of the run `manifest` describes and this one now."""
    said = []
    notebook = (manifest.get("notebooks") or {}).get(planned.notebook)
    if notebook is not None and notebook != now.notebooks.get(planned.notebook):
        said.append(f"the code of {planned.notebook} changed")
    state = now.code.get(planned.key)
    digest = (manifest.get("code_of") or {}).get(then.get("key"))
    before = (manifest.get("code") or {}).get(digest) if digest else None
    if state is not None and before is not None:
        said += code.changes(project, before, state)
    elif state is not None and "code" not in manifest:
        said.append("the code under test was not recorded then (an older perfkit)")
    if manifest.get("perfkit_source") != now.source_hash:
        said.append("perfkit's own source changed")
    said += _environment(manifest.get("cache_key") or {}, now.environment)
    if then.get("threads") is not None and then.get("threads") != planned.threads:
        said.append(f"threads {then.get('threads')} -> {planned.threads}")
    if (then.get("server") or None) != planned.server:
        said.append(f"the server changed: {served.change(then.get('server'), planned.server)}")
    profile = (manifest.get("options") or {}).get("profile")
    if profile != now.profile:
        said.append(f"profiler {profile or 'none'} -> {now.profile or 'none'}")
    return said


def reason(earlier: Earlier, planned: Execution, now: Now, *, forced: bool) -> tuple[str, str | None]:
    """(why this execution runs, the run it compares with or None)."""
    if forced:
        return "--force", None
    last = earlier.last(planned)
    if last is None:
        return NEVER, None
    run_id, manifest, x = last
    if x.get("key") == planned.key:
        if x.get("unfit"):
            return f"run {run_id} measured it while the machine was busy", run_id
        return f"run {run_id} did not end it well ({x.get('status')})", run_id
    said = differences(earlier.project, manifest, x, planned, now) or ["its key changed"]
    return f"{'; '.join(said)} since run {run_id}", run_id
