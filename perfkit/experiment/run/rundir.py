"""A run's folder, runs/<run-id>/, and its manifest: claimed before anything runs, always ended.

The manifest (runs/<run-id>/manifest.json) is written as "running" before anything is executed
and ends "finished", "interrupted" (Ctrl-C, SIGTERM) or "failed" (it could not write what it
measured), with every execution that had ended by then. A later run marks a manifest whose
process is gone "killed".

runs/<run-id>/probes/<sha>/<notebook> holds the bytes of each probe notebook the plan read and
hashed (<sha>: the first 16 hex digits of their SHA-256): every replicate executes that copy, so
editing notebooks/ while a run executes changes neither what it measures nor what its key says.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import platform
import shutil
import sys
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from perfkit.errors import RecordError, UserError
from perfkit.files import VERSION_KEY, dumps, read_versioned, write_atomic, write_json
from perfkit.paths import Project

#: Format history of runs/<run-id>/manifest.json (`format_version`):
#:   1: first format (with a top-level `git` beside the environment's).
#:   2: the project's git state is recorded once, in `environment.perfkit.git`; statuses
#:      running | finished | interrupted; `executions` in the one Execution shape.
#:   3: `process` (host, pid, start time) says who runs it; status `killed` (with `killed_note`):
#:      a later run found it "running" with its process gone; `failed` (with `failed_note`): it could
#:      not write what it measured (a full disk, a read-only folder).
#:   4: `options` holds every command-line option of the run by its field name
#:      (perfkit/experiment/run/options.py), `confidence` the level its verdicts were judged at.
MANIFEST_VERSION = 4
_ESSENTIAL = (
    "run_id",
    "created",
    "status",
    "failed_note",
    "command",
    "cwd",
    "versions",
    "process",
    "timings",
)  # shrunk
MIN_FREE_BYTES = 64 * 2**20  # executed notebooks, samples and plots of a run: well under this
CANNOT_WRITE = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}


def _1_to_2(old: dict) -> dict:
    git = old.pop("git", None)
    if git is not None:
        old.setdefault("environment", {}).setdefault("perfkit", {}).setdefault("git", git)
    return old


MANIFEST_UPGRADES = {1: _1_to_2, 2: lambda old: old, 3: lambda old: old}


@dataclass(frozen=True)
class RunDir:
    """Where one run keeps its evidence: runs/<run-id>/."""

    run_id: str
    path: Path
    created: str  # UTC, ISO 8601

    def execution_dir(self, key: str) -> Path:
        return self.path / "executions" / key

    def probe_path(self, notebook: str, source: bytes) -> Path:
        """Where this run keeps `notebook` as it was read: probes/<sha>/<notebook>, under the probe's own name."""
        return self.path / "probes" / hashlib.sha256(source).hexdigest()[:16] / notebook

    def freeze_probes(self, sources: dict[str, bytes]) -> dict[str, Path]:
        """Write each notebook's bytes, atomically, where every replicate executes them: notebook -> its copy."""
        frozen = {}
        for notebook, source in sources.items():
            frozen[notebook] = self.probe_path(notebook, source)
            write_atomic(frozen[notebook], source)
        return frozen

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        plain = json.loads(json.dumps(manifest, default=str))
        try:
            write_json(self.path / "manifest.json", plain, version=MANIFEST_VERSION)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or not self._shrunk_in_place(plain):
                raise

    def _shrunk_in_place(self, plain: dict[str, Any]) -> bool:
        """On a full disk, the manifest's ending over the bytes of the one there (no new block is needed),
        its bulkiest parts left out until it fits: a run that failed never stays `running` for want of
        a few kilobytes. Not atomic (a kill right then could tear it), so only this last resort."""
        path = self.path / "manifest.json"
        try:
            room = path.stat().st_size
        except OSError:
            return False
        for keep in (None, _ESSENTIAL):
            shown = {k: v for k, v in plain.items() if keep is None or k in keep}
            text = dumps({**shown, "shrunk_on_a_full_disk": keep is not None, VERSION_KEY: MANIFEST_VERSION})
            data = text.encode("utf-8")
            if len(data) <= room:
                with open(path, "r+b") as fh:
                    fh.write(data)
                    fh.truncate()
                return True
        return False


class Interrupted(KeyboardInterrupt):
    """A run stopped by Ctrl-C or SIGTERM; says what was kept."""

    def __init__(self, run_dir: RunDir, ended: int, planned: int):
        self.run_dir, self.ended, self.planned = run_dir, ended, planned
        super().__init__(
            f"interrupted: {ended} of {planned} probe executions had ended and are kept under "
            f"{run_dir.path}/ (its manifest says interrupted); no verdicts were written"
        )


class WriteFailed(UserError):
    """A run could not write what it measured (a full disk, a folder made read-only mid-run)."""


def claim_folder(parent: Path, now: datetime, taken=lambda name: False) -> Path:
    """A folder under `parent` named by the time ('20261202-142315', then '-2', ...), claimed atomically
    (mkdir) against concurrent runs; `taken(name)` skips names used elsewhere."""
    parent.mkdir(parents=True, exist_ok=True)
    base = now.strftime("%Y%m%d-%H%M%S")
    for n in range(1, 1000):
        name = base if n == 1 else f"{base}-{n}"
        if taken(name):
            continue
        try:
            (parent / name).mkdir()
        except FileExistsError:
            continue
        return parent / name
    raise UserError(f"cannot find a free folder name under {parent}")


def new_run_dir(project: Project) -> RunDir:
    """A run id that sorts by time and is claimed atomically (mkdir) against concurrent runs."""
    now = datetime.now(UTC)
    path = claim_folder(project.runs_dir, now, lambda name: (project.results_dir / f"{name}.json").exists())
    return RunDir(run_id=path.name, path=path, created=now.strftime("%Y-%m-%dT%H:%M:%SZ"))


def check_writable(project: Project) -> None:
    """Before any probe runs: every folder a run writes takes a file, and the disk has room."""
    for folder in (project.runs_dir, project.results_dir, project.plots_dir, project.ledger_path.parent):
        shown = project.relative(folder)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(prefix=".perfkit-write-check.", suffix=".tmp", dir=folder)
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise UserError(f"cannot write in {shown}/: {exc.strerror or exc}; nothing was run") from None
    free = shutil.disk_usage(project.runs_dir).free
    if free < MIN_FREE_BYTES:
        raise UserError(
            f"only {free / 2**20:.0f} MiB free on the disk of {project.relative(project.runs_dir)}/; a run needs "
            f"{MIN_FREE_BYTES / 2**20:.0f} MiB; nothing was run"
        )


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def manifest(run_dir: RunDir, *, command: str, options: dict[str, Any], source_hash: str) -> dict[str, Any]:
    """A new run's manifest, "running"."""
    return {
        "run_id": run_dir.run_id,
        "created": run_dir.created,
        "status": "running",
        "command": command or " ".join(sys.argv),
        "cwd": os.getcwd(),
        "versions": {name: _version(name) for name in ("perfkit", "torch", "papermill", "nbclient", "numpy")}
        | {"python": platform.python_version()},
        "options": options,
        "perfkit_source": source_hash,
        "process": _this_process(),
    }


def _this_process() -> dict[str, Any]:
    """Who runs this run: enough for a later run to tell a killed one from one still going."""
    import psutil

    return {"host": platform.node(), "pid": os.getpid(), "started": psutil.Process().create_time()}


def _alive(process: dict[str, Any]) -> bool | None:
    """Whether the process a manifest names still runs (None: another host, or not recorded)."""
    import psutil

    if not isinstance(process, dict) or process.get("host") != platform.node() or "pid" not in process:
        return None
    try:
        return abs(psutil.Process(int(process["pid"])).create_time() - float(process.get("started", 0))) < 1.0
    except (psutil.NoSuchProcess, ValueError, TypeError):
        return False


def mark_killed_runs(project: Project, by: str) -> list[str]:
    """Manifests still "running" whose process is gone: a kill (-9, OOM, power) ended them. Mark them.

    A manifest is upgraded to the current format before it is written again; one this perfkit
    cannot read (torn, or of a newer format) is left as it is.
    """
    found = []
    for path in sorted(project.runs_dir.glob("*/manifest.json")):
        if path.parent.name == by:
            continue
        try:
            data = read_versioned(path, current=MANIFEST_VERSION, upgrades=MANIFEST_UPGRADES)
        except (OSError, RecordError):
            continue
        if data.get("status") != "running" or _alive(data.get("process")) is not False:
            continue
        data["status"] = "killed"
        data["killed_note"] = f"process {data['process']['pid']} ended without finishing; found by run {by}"
        data.pop("format_version", None)
        RunDir(path.parent.name, path.parent, str(data.get("created", ""))).write_manifest(data)
        found.append(path.parent.name)
    return found
