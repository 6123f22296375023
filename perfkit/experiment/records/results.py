"""Versioned JSON records of what was measured and judged. Never pickle.

Two kinds of file:
- runs/<run-id>/executions/<key>/execution.json: one probe execution with its raw samples
  (heavy, gitignored).
- hypotheses/ledger/results/<run-id>.json: the compact results of a run: per hypothesis the
  verdict, the measured interval, metric summaries and its executions without their samples.
  Committed; the ledger is generated from these alone.

One probe execution has one shape, `Execution`, from the moment it is planned (status
"planned") to the stored result; the compact results hold the same record without its samples.

The format's history, and how each older version is upgraded on load, is in formats.py; a newer
file is refused.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from perfkit.errors import RecordError
from perfkit.experiment.records.formats import UPGRADES
from perfkit.experiment.records.hypothesis import SLUG

# stored as they are judged; defined with the verdict's words, so that this reader may use the hypothesis's rules
from perfkit.experiment.records.verdict import Floor as Floor
from perfkit.experiment.records.verdict import MachineMeasured as MachineMeasured
from perfkit.experiment.records.verdict import Measured as Measured
from perfkit.files import VERSION_KEY, Reader, dumps, encode_number, read_json, upgrade, write_atomic, write_json
from perfkit.paths import Project
from perfkit.samples import MetricRecord

FORMAT_VERSION = 12
VERDICTS = ("confirmed", "refuted", "inconclusive", "error")
PLANNED = "planned"
STATUSES = (PLANNED, "ok", "error", "timeout", "crashed")


def _number_json(value: float | None) -> float | str | None:
    return None if value is None else encode_number(value)


def _refuse(r: Reader, key: str, message: str) -> RecordError:
    return RecordError(message, path=r.path, field=r.field(key))


def _slug(r: Reader, key: str) -> str:
    """An id by the hypothesis record's own rule: nothing a ledger row or a code span could be forged from."""
    value = r.get(key, str)
    if not SLUG.fullmatch(value):
        raise _refuse(r, key, f"expected a slug (lowercase letters, digits and dashes), got {value[:60]!r}")
    return value


SECONDS = (0.0, 30 * 24 * 3600.0)  # a stored wall or set-up time: a replicate beyond 30 days is no measurement
SHARE = (0.0, 1.0)  # a share of a variance
CONFIDENCE = (0.5, 1.0 - 1e-12)  # an interval's level: below 50% it is no interval perfkit makes
PACE_S = (1e-6, 1e4)  # machine.pace: seconds of fixed work; outside, a forecast scaled by it means nothing


def _count(r: Reader, key: str, *, optional: bool = False, most: Any = None) -> int | None:
    """A count of processes or samples: an integer of 1 or more (and at most `most`, the samples a count of
    processes was taken from, when that is an integer)."""
    value = r.get(key, int, optional=optional)
    if value is not None and value < 1:
        raise _refuse(r, key, f"expected a count of 1 or more, got {value}")
    if value is not None and isinstance(most, int) and not isinstance(most, bool) and value > most:
        raise _refuse(r, key, f"{value} processes cannot come from {most} samples")
    return value


def _interval(r: Reader, keys: tuple[str, str, str], *, optional: bool = False) -> tuple[float | None, ...]:
    """(value, low, high): finite numbers (a non-finite estimate is no measurement) with low <= high."""
    found = tuple(r.number(k, optional=optional and k != keys[0], nan=False) for k in keys)
    for k, v in zip(keys, found):
        if v is not None and not math.isfinite(v):
            raise _refuse(r, k, f"expected a finite number, got {v}")
    if found[1] is not None and found[2] is not None and found[1] > found[2]:
        raise _refuse(r, keys[1], f"the interval's low {found[1]} is above its high {found[2]}")
    if None not in found and not found[1] <= found[0] <= found[2]:
        raise _refuse(
            r, keys[0], f"the estimate {found[0]:g} lies outside its own interval [{found[1]:g}, {found[2]:g}]"
        )
    return found


def _records(r: Reader) -> tuple[MetricRecord, ...]:
    """An execution's records, each sample a number (JSON's true is not 1.0)."""
    if "records" not in r.data:
        return ()
    for c in r.children("records"):
        if any(isinstance(s, bool) for s in c.data.get("samples") or ()):
            raise _refuse(c, "samples", "expected numbers, got a boolean")
    return tuple(MetricRecord.from_json(c) for c in r.children("records"))


def _load(r: Reader) -> dict[str, Any] | None:
    """The foreign load an execution ran under: `cores` (a number of 0 or more) of `of` CPUs, or null."""
    child = r.child("load", optional=True)
    if child is None:
        return None
    for key in ("cores", "busy_share"):
        value = child.number(key)
        if not value >= 0:
            raise _refuse(child, key, f"expected a number of 0 or more, got {value}")
    child.get("of", int)
    child.get("top", list)
    return child.data


# ---------------------------------------------------------------- one probe execution


@dataclass(frozen=True)
class Execution:
    """One probe execution: planned, then executed (or reused), then stored."""

    key: str  # hash of notebook bytes, parameters and perfkit source: equal keys measure the same thing
    notebook: str  # under notebooks/
    params: dict[str, Any]
    status: str = PLANNED  # one of STATUSES
    wall_s: float | None = None
    run_id: str | None = None  # the run that executed it
    reused: bool = False  # a later run took it from run_id instead of executing it again
    replicate: int = 0  # which of the execution's independent kernel processes this is
    unfit: str | None = None  # why the machine was not fit to measure on while it ran, if it was not
    load: dict[str, Any] | None = None  # the foreign CPU load it ran under (machine/fitness.py `load`)
    reason: str | None = None  # why it did not end "ok", with the cell
    cell_index: int | None = None
    ename: str | None = None
    evalue: str | None = None
    records: tuple[MetricRecord, ...] = ()
    host: str | None = None  # the machine it ran on, when a cluster worker ran it (None: this machine)
    threads: int | None = None  # CPU threads every replicate of it ran with (decided once, by the plan)
    cpus: str | None = None  # the CPUs this replicate was pinned to, e.g. "0-3" (None: not pinned, before format 7)
    server: dict[str, Any] | None = None  # the live server it measured (experiment/served.py), if it drove one
    setup_s: float | None = None  # from its launch to its first recording cell: kernel, imports, engine, server
    warm: bool | None = None  # forked from its round's template (experiment/warm.py); False: a fresh process
    machine: dict[str, Any] | None = None  # where it ran: `id` (stable across runs), `host`, `cpu`, `gpus`
    server_instance: dict[str, Any] | None = None  # a running server's process at the window's edges (run/windows.py)

    def label(self) -> str:
        shown = " ".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"{self.notebook} {shown}".strip()

    @property
    def id(self) -> str:
        """Key and replicate: where it is stored, runs/<run-id>/executions/<key>/r<replicate>/."""
        return f"{self.key}/r{self.replicate}"

    def to_json(self, *, with_records: bool = True) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if k != "records"}
        if with_records:
            data["records"] = [r.to_json() for r in self.records]
        return data

    @classmethod
    def from_json(cls, r: Reader) -> Execution:
        return cls(
            key=r.get("key", str),
            notebook=r.get("notebook", str),
            params=r.get("params", dict),
            status=r.choice("status", STATUSES),
            wall_s=r.number("wall_s", optional=True, within=SECONDS),
            run_id=r.get("run_id", str, optional=True),
            reused=r.get("reused", bool),
            replicate=r.get("replicate", int),
            unfit=r.get("unfit", str, optional=True),
            load=_load(r),
            reason=r.get("reason", str, optional=True),
            cell_index=r.get("cell_index", int, optional=True),
            ename=r.get("ename", str, optional=True),
            evalue=r.get("evalue", str, optional=True),
            records=_records(r),
            host=r.get("host", str, optional=True),
            threads=r.get("threads", int, optional=True),
            cpus=r.get("cpus", str, optional=True),
            server=r.get("server", dict, optional=True),
            setup_s=r.number("setup_s", optional=True, within=SECONDS),
            warm=r.get("warm", bool, optional=True),
            machine=_machine(r),
            server_instance=r.get("server_instance", dict, optional=True),
        )

    @property
    def machine_id(self) -> str:
        """The machine it ran on ("" when not said: before format 10, one machine of the run)."""
        return str((self.machine or {}).get("id") or "")


def hosts(executions) -> list[str]:
    """The host names of the machines these executions ran on, sorted (none recorded: before format 10)."""
    return sorted({str((x.machine or {}).get("host") or "") for x in executions} - {""})


def source_of(run_id: str, executions) -> str:
    """'run 20261207-153150 on box1': the run a measurement stands on and the machines its executions ran on."""
    ran_on = hosts(executions)
    return f"run {run_id}" + (f" on {', '.join(ran_on)}" if ran_on else "")


def _machine(r: Reader) -> dict[str, Any] | None:
    machine = r.get("machine", dict, optional=True)
    if machine is not None and not (isinstance(machine.get("id"), str) and machine["id"]):
        raise RecordError("a replicate's machine needs its `id`, a string", path=r.path, field=r.field("machine"))
    return machine


# ---------------------------------------------------------------- compact: what the ledger reads


@dataclass(frozen=True)
class MetricSummary:
    name: str
    unit: str
    at: dict[str, Any] | None
    n: int
    mean: float | None
    low: float | None
    high: float | None
    std: float | None
    note: str | None = None
    replicates: int | None = None  # processes the interval rests on (format 3 on)
    between: float | None = None  # share of the variance between those processes


@dataclass(frozen=True)
class HypothesisResult:
    id: str
    hash: str
    claim: str
    kind: str
    expected: str
    verdict: str  # one of VERDICTS
    reason: str | None
    measured: Measured | None
    off_by: str | None
    floor: Floor | None = None
    plot: str | None = None  # relative to hypotheses/ledger/
    warnings: tuple[str, ...] = ()
    metrics: tuple[MetricSummary, ...] = ()
    executions: tuple[Execution, ...] = ()  # without their records
    stopped: str | None = None  # why the run added no more replicates (format 3 on)
    not_reproduced: str | None = None  # unchanged since the last verdict, yet disjoint from its interval
    changed: str | None = None  # what differs from the standing measurement's executions, and how far it moved
    per_machine: tuple[MachineMeasured, ...] = ()  # each machine's own measurement, when there were several

    def to_json(self) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if k != "executions"}
        for measured in [data["measured"], *(m["measured"] for m in data["per_machine"])]:
            for key in ("value", "low", "high", "between", "spread", "between_machines"):
                if measured:
                    measured[key] = _number_json(measured[key])
        for m in data["metrics"]:
            for key in ("mean", "low", "high", "std", "between"):
                m[key] = _number_json(m[key])
        if data["floor"]:
            for key in ("low", "high"):
                data["floor"][key] = _number_json(data["floor"][key])
        data["executions"] = [x.to_json(with_records=False) for x in self.executions]
        return data

    @classmethod
    def from_json(cls, r: Reader) -> HypothesisResult:
        m = r.child("measured", optional=True)
        f = r.child("floor", optional=True)
        plot = r.get("plot", str, optional=True)
        floor = _interval(f, ("value", "low", "high"), optional=True) if f is not None else (None,) * 3
        if plot is not None and (not plot.startswith("plots/") or ".." in Path(plot).parts or "\\" in plot):
            raise RecordError(
                f"a plot lives under plots/ in the ledger folder, got {plot!r}", path=r.path, field=r.field("plot")
            )
        return cls(
            id=_slug(r, "id"),
            hash=r.get("hash", str),
            claim=r.get("claim", str),
            kind=r.get("kind", str),
            expected=r.get("expected", str),
            verdict=r.choice("verdict", VERDICTS),
            reason=r.get("reason", str, optional=True),
            measured=None if m is None else _measured(m),
            off_by=r.get("off_by", str, optional=True),
            floor=None
            if f is None
            else Floor(
                metric=f.get("metric", str),
                value=floor[0],
                unit=f.unit("unit"),
                note=f.get("note", str, optional=True),
                low=floor[1],
                high=floor[2],
                replicates=f.get("replicates", int, optional=True),
            ),
            plot=plot,
            warnings=tuple(r.get("warnings", list)),
            metrics=tuple(
                MetricSummary(
                    name=c.get("name", str),
                    unit=c.unit("unit"),
                    at=c.get("at", dict, optional=True),
                    n=_count(c, "n"),
                    mean=c.number("mean", optional=True),
                    low=c.number("low", optional=True),
                    high=c.number("high", optional=True),
                    std=c.number("std", optional=True),
                    note=c.get("note", str, optional=True),
                    replicates=_count(c, "replicates", optional=True, most=c.data.get("n")),
                    between=c.number("between", optional=True, within=SHARE),
                )
                for c in r.children("metrics")
            ),
            executions=tuple(Execution.from_json(c) for c in r.children("executions")),
            stopped=r.get("stopped", str, optional=True),
            not_reproduced=r.get("not_reproduced", str, optional=True),
            changed=r.get("changed", str, optional=True),
            per_machine=tuple(
                MachineMeasured(
                    machine=c.get("machine", str),
                    label=c.get("label", str),
                    measured=None if c.child("measured", optional=True) is None else _measured(c.child("measured")),
                    verdict=c.choice("verdict", VERDICTS) if c.get("verdict", str, optional=True) else None,
                    reason=c.get("reason", str, optional=True),
                    off_by=c.get("off_by", str, optional=True),
                )
                for c in (r.children("per_machine") if r.get("per_machine", list, optional=True) else ())
            ),
        )


def _measured(m: Reader) -> Measured:
    value, low, high = _interval(m, ("value", "low", "high"))
    return Measured(
        label=m.get("label", str),
        unit=m.unit("unit", optional=True),
        value=value,
        low=low,
        high=high,
        replicates=_count(m, "replicates", optional=True),
        samples=_count(m, "samples", optional=True),
        between=m.number("between", optional=True, within=SHARE),
        confidence=m.number("confidence", optional=True, within=CONFIDENCE),
        spread=m.number("spread", optional=True, nan=False),
        log=m.get("log", bool, optional=True),
        machines=m.get("machines", int, optional=True),
        between_machines=m.number("between_machines", optional=True, within=SHARE),
        paired=m.get("paired", str, optional=True),
    )


@dataclass(frozen=True)
class RunResults:
    run_id: str
    created: str  # UTC, ISO 8601
    command: str
    quick: bool
    git_commit: str | None
    git_dirty: bool | None
    hypotheses: tuple[HypothesisResult, ...] = field(default_factory=tuple)
    profile: str | None = None  # the profiler the run ran under (`--profile`), or None
    machine: str | None = None  # what it measured on, in words (CPU model, cores, GPUs)
    pace_s: float | None = None  # machine.pace when it started: what a later run scales its costs by

    def to_json(self) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if k != "hypotheses"}
        data["hypotheses"] = [h.to_json() for h in self.hypotheses]
        return data

    @classmethod
    def from_json(cls, data: Any, path: str) -> RunResults:
        r = Reader(upgrade(data, path, current=FORMAT_VERSION, upgrades=UPGRADES), path)
        return cls(
            run_id=r.get("run_id", str),
            created=r.get("created", str),
            command=r.get("command", str),
            quick=r.get("quick", bool),
            git_commit=r.get("git_commit", str, optional=True),
            git_dirty=r.get("git_dirty", bool, optional=True),
            hypotheses=_unique(tuple(HypothesisResult.from_json(h) for h in r.children("hypotheses")), path),
            profile=r.get("profile", str, optional=True),
            machine=r.get("machine", str, optional=True),
            pace_s=r.number("pace_s", optional=True, within=PACE_S),
        )


def _unique(results: tuple[HypothesisResult, ...], path: str) -> tuple[HypothesisResult, ...]:
    seen: set[str] = set()
    for i, h in enumerate(results):
        if h.id in seen:
            raise RecordError(f"hypothesis {h.id!r} appears twice", path=path, field=f"hypotheses[{i}].id")
        seen.add(h.id)
    return results


# ---------------------------------------------------------------- files


def write_execution(path: Path, execution: Execution) -> None:
    write_json(path, execution.to_json(), version=FORMAT_VERSION)


def read_execution(path: Path, shown: str | None = None) -> Execution:
    shown = shown or str(path)
    data = upgrade(read_json(path, shown), shown, current=FORMAT_VERSION, upgrades=UPGRADES)
    return Execution.from_json(Reader(data, shown))


def stamp(result: HypothesisResult) -> str:
    """What a verdict's plot was drawn from, in 16 hex digits: the record's hash, the verdict and the
    measured interval. The plot carries it; `perfkit ledger --check` compares it with the standing row."""
    return stamp_fields(result.id, result.hash, result.verdict, result.measured)


def stamp_fields(hid: str, record_hash: str, verdict: str, m: Measured | None) -> str:
    """`stamp` from the fields themselves (a run stamps its plots before it makes the results)."""
    shown = None if m is None else [m.label, m.unit, repr(m.value), repr(m.low), repr(m.high)]
    return hashlib.sha256(json.dumps([hid, record_hash, verdict, shown]).encode()).hexdigest()[:16]


def results_path(project: Project, run_id: str) -> Path:
    return project.results_dir / f"{run_id}.json"


def checked_text(results: RunResults, shown: str) -> str:
    """The results file's text, once its own reader accepts it: what perfkit would refuse is never written."""
    try:
        text = dumps({**results.to_json(), VERSION_KEY: FORMAT_VERSION})
    except ValueError as exc:  # a NaN or infinity no field encodes
        raise RecordError(f"not written, it holds a number JSON cannot: {exc}", path=shown) from None
    try:
        RunResults.from_json(json.loads(text), shown)
    except RecordError as exc:
        raise RecordError(
            f"not written, perfkit would refuse to read it: {exc.message}", path=shown, field=exc.field
        ) from None
    return text


def write_results(project: Project, results: RunResults) -> Path:
    path = results_path(project, results.run_id)
    write_atomic(path, checked_text(results, project.relative(path)))
    return path


CACHED_FROM = 100  # results files from which a project keeps a cache of them read (records/readcache.py)


def load_all_results(project: Project) -> list[RunResults]:
    """Every committed run result, oldest first (run ids sort by time). From CACHED_FROM files on, what
    was read before comes from the project's signed cache under runs/ (readcache.py): the same results."""
    if not project.results_dir.is_dir():
        return []
    files = sorted(project.results_dir.glob("*.json"))
    cache = None
    if len(files) >= CACHED_FROM:
        from perfkit.experiment.records.readcache import Cache

        cache = Cache(project.runs_dir)
    out = []
    for path in files:
        results = cache.get(path) if cache is not None else None
        if results is None:
            shown = project.relative(path)
            results = RunResults.from_json(read_json(path, shown), shown)
            if results.run_id != path.stem:
                raise RecordError(f"run_id {results.run_id!r} differs from the file name", path=shown, field="run_id")
            if cache is not None:
                cache.put(path, results)
        out.append(results)
    if cache is not None:
        cache.keep_only({p.name for p in files})
        cache.save()
    return sorted(out, key=lambda r: r.run_id)
