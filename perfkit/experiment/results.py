"""Versioned JSON records of what was measured and judged. Never pickle.

Two kinds of file:
- runs/<run-id>/executions/<key>/execution.json: one probe execution with its raw samples
  (heavy, gitignored).
- hypotheses/ledger/results/<run-id>.json: the compact results of a run: per hypothesis the
  verdict, the measured interval and metric summaries. Committed; the ledger is generated from
  these alone.

Format history (`format_version`):
  1: first format.
Older files are upgraded on load by the functions in UPGRADES (version n -> n + 1); a file newer
than this perfkit is refused with a message instead of being half understood.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from perfkit.errors import RecordError
from perfkit.files import write_atomic
from perfkit.paths import Project
from perfkit.probe.recording import decode_samples, encode_samples

FORMAT_VERSION = 1
#: version n -> function turning a version-n dict into a version-(n + 1) dict.
UPGRADES: dict[int, Callable[[dict], dict]] = {}

VERDICTS = ("confirmed", "refuted", "inconclusive", "error")
STATUSES = ("ok", "error", "timeout", "crashed")


class _Reader:
    """Typed access to a parsed JSON dict that reports the file and field on any mismatch."""

    def __init__(self, data: Any, path: str, where: str = ""):
        if not isinstance(data, dict):
            raise RecordError(f"expected an object, got {type(data).__name__}", path=path, field=where or None)
        self.data, self.path, self.where = data, path, where

    def _field(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def get(self, key: str, types: type | tuple[type, ...], *, optional: bool = False) -> Any:
        if key not in self.data:
            if optional:
                return None
            raise RecordError("missing", path=self.path, field=self._field(key))
        value = self.data[key]
        if value is None and optional:
            return None
        if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
            raise RecordError(f"expected {types}, got a boolean", path=self.path, field=self._field(key))
        if not isinstance(value, types):
            raise RecordError(f"expected {types}, got {type(value).__name__}", path=self.path, field=self._field(key))
        return value

    def number(self, key: str, *, optional: bool = False) -> float | None:
        value = self.get(key, (int, float, str), optional=optional)
        if value is None:
            return None
        try:
            return decode_samples([value])[0]
        except ValueError:
            raise RecordError(f"expected a number, got {value!r}", path=self.path, field=self._field(key)) from None

    def choice(self, key: str, choices: tuple[str, ...]) -> str:
        value = self.get(key, str)
        if value not in choices:
            raise RecordError(f"expected one of {', '.join(choices)}, got {value!r}", path=self.path, field=self._field(key))
        return value

    def child(self, key: str, *, optional: bool = False) -> "_Reader | None":
        value = self.get(key, dict, optional=optional)
        return None if value is None else _Reader(value, self.path, self._field(key))

    def children(self, key: str) -> list["_Reader"]:
        return [_Reader(item, self.path, f"{self._field(key)}[{i}]") for i, item in enumerate(self.get(key, list))]


def _number_json(value: float | None) -> float | str | None:
    return None if value is None else encode_samples([value])[0]


# ---------------------------------------------------------------- raw: one probe execution


@dataclass(frozen=True)
class MetricRecord:
    """One `perfkit.record` call as read back from an executed notebook."""

    name: str
    unit: str
    samples: tuple[float, ...]
    at: dict[str, Any] | None = None
    note: str | None = None
    breakdown: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "unit": self.unit, "samples": encode_samples(list(self.samples)),
                "at": self.at, "note": self.note, "breakdown": self.breakdown}

    @classmethod
    def from_json(cls, reader: _Reader) -> "MetricRecord":
        samples = reader.get("samples", list)
        try:
            decoded = decode_samples(samples)
        except (ValueError, TypeError) as exc:
            raise RecordError(str(exc), path=reader.path, field=f"{reader.where}.samples") from None
        return cls(
            name=reader.get("name", str),
            unit=reader.get("unit", str),
            samples=tuple(decoded),
            at=reader.get("at", dict, optional=True),
            note=reader.get("note", str, optional=True),
            breakdown=reader.get("breakdown", str, optional=True),
        )


@dataclass(frozen=True)
class ExecutionRecord:
    """One papermill execution of a probe: how it ended and what it recorded."""

    key: str
    notebook: str
    params: dict[str, Any]
    status: str  # one of STATUSES
    wall_s: float
    run_id: str  # the run that executed it (for a reused execution, the run it came from)
    reason: str | None = None  # why it did not end "ok", with the cell
    cell_index: int | None = None
    ename: str | None = None
    evalue: str | None = None
    cached_from: str | None = None
    records: tuple[MetricRecord, ...] = ()

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["records"] = [r.to_json() for r in self.records]
        return {"format_version": FORMAT_VERSION, **data}

    @classmethod
    def from_json(cls, data: Any, path: str) -> "ExecutionRecord":
        data = _upgrade(data, path)
        r = _Reader(data, path)
        return cls(
            key=r.get("key", str),
            notebook=r.get("notebook", str),
            params=r.get("params", dict),
            status=r.choice("status", STATUSES),
            wall_s=r.number("wall_s"),
            run_id=r.get("run_id", str),
            reason=r.get("reason", str, optional=True),
            cell_index=r.get("cell_index", int, optional=True),
            ename=r.get("ename", str, optional=True),
            evalue=r.get("evalue", str, optional=True),
            cached_from=r.get("cached_from", str, optional=True),
            records=tuple(MetricRecord.from_json(c) for c in r.children("records")),
        )


# ---------------------------------------------------------------- compact: what the ledger reads


@dataclass(frozen=True)
class Measured:
    """The quantity a verdict compares: a metric's mean, a share, an exponent or a speedup."""

    label: str
    unit: str | None
    value: float
    low: float
    high: float


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


@dataclass(frozen=True)
class Floor:
    """A recorded floor (e.g. a roofline figure) that an expectation was measured against."""

    metric: str
    value: float
    unit: str
    note: str | None = None


@dataclass(frozen=True)
class ExecutionRef:
    key: str
    notebook: str
    params: dict[str, Any]
    status: str
    run_id: str
    cached: bool
    wall_s: float


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
    executions: tuple[ExecutionRef, ...] = ()


@dataclass(frozen=True)
class RunResults:
    run_id: str
    created: str  # UTC, ISO 8601
    command: str
    quick: bool
    git_commit: str | None
    git_dirty: bool | None
    hypotheses: tuple[HypothesisResult, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for h in data["hypotheses"]:
            if h["measured"]:
                for key in ("value", "low", "high"):
                    h["measured"][key] = _number_json(h["measured"][key])
            for m in h["metrics"]:
                for key in ("mean", "low", "high", "std"):
                    m[key] = _number_json(m[key])
        return {"format_version": FORMAT_VERSION, **data}

    @classmethod
    def from_json(cls, data: Any, path: str) -> "RunResults":
        data = _upgrade(data, path)
        r = _Reader(data, path)
        return cls(
            run_id=r.get("run_id", str),
            created=r.get("created", str),
            command=r.get("command", str),
            quick=r.get("quick", bool),
            git_commit=r.get("git_commit", str, optional=True),
            git_dirty=r.get("git_dirty", bool, optional=True),
            hypotheses=tuple(_hypothesis_result(h) for h in r.children("hypotheses")),
        )


def _hypothesis_result(r: _Reader) -> HypothesisResult:
    m = r.child("measured", optional=True)
    f = r.child("floor", optional=True)
    return HypothesisResult(
        id=r.get("id", str),
        hash=r.get("hash", str),
        claim=r.get("claim", str),
        kind=r.get("kind", str),
        expected=r.get("expected", str),
        verdict=r.choice("verdict", VERDICTS),
        reason=r.get("reason", str, optional=True),
        measured=None if m is None else Measured(
            label=m.get("label", str), unit=m.get("unit", str, optional=True),
            value=m.number("value"), low=m.number("low"), high=m.number("high"),
        ),
        off_by=r.get("off_by", str, optional=True),
        floor=None if f is None else Floor(
            metric=f.get("metric", str), value=f.number("value"), unit=f.get("unit", str),
            note=f.get("note", str, optional=True),
        ),
        plot=r.get("plot", str, optional=True),
        warnings=tuple(r.get("warnings", list)),
        metrics=tuple(
            MetricSummary(
                name=c.get("name", str), unit=c.get("unit", str), at=c.get("at", dict, optional=True),
                n=c.get("n", int), mean=c.number("mean", optional=True), low=c.number("low", optional=True),
                high=c.number("high", optional=True), std=c.number("std", optional=True),
                note=c.get("note", str, optional=True),
            )
            for c in r.children("metrics")
        ),
        executions=tuple(
            ExecutionRef(
                key=c.get("key", str), notebook=c.get("notebook", str), params=c.get("params", dict),
                status=c.choice("status", STATUSES), run_id=c.get("run_id", str), cached=c.get("cached", bool),
                wall_s=c.number("wall_s"),
            )
            for c in r.children("executions")
        ),
    )


def _upgrade(data: Any, path: str) -> dict:
    if not isinstance(data, dict):
        raise RecordError("expected a JSON object", path=path)
    version = data.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise RecordError(f"missing or invalid format_version: {version!r}", path=path, field="format_version")
    if version > FORMAT_VERSION:
        raise RecordError(
            f"format_version {version} is newer than this perfkit understands ({FORMAT_VERSION}); upgrade perfkit",
            path=path, field="format_version",
        )
    while version < FORMAT_VERSION:
        if version not in UPGRADES:
            raise RecordError(f"no upgrade from format_version {version}", path=path, field="format_version")
        data = UPGRADES[version](data)
        version += 1
        data["format_version"] = version
    return data


# ---------------------------------------------------------------- files


def dumps(data: dict) -> str:
    """Stable JSON text: sorted keys, fixed indentation, newline at the end."""
    return json.dumps(data, sort_keys=True, indent=1, ensure_ascii=False, allow_nan=False) + "\n"


def _read_json(path: Path, shown: str) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise RecordError(f"cannot read: {exc}", path=shown) from None
    except json.JSONDecodeError as exc:
        raise RecordError(f"not valid JSON: {exc.msg}", path=shown, line=exc.lineno) from None


def write_execution(path: Path, record: ExecutionRecord) -> None:
    write_atomic(path, dumps(record.to_json()))


def read_execution(path: Path, shown: str | None = None) -> ExecutionRecord:
    shown = shown or str(path)
    return ExecutionRecord.from_json(_read_json(path, shown), shown)


def results_path(project: Project, run_id: str) -> Path:
    return project.results_dir / f"{run_id}.json"


def write_results(project: Project, results: RunResults) -> Path:
    path = results_path(project, results.run_id)
    write_atomic(path, dumps(results.to_json()))
    return path


def load_all_results(project: Project) -> list[RunResults]:
    """Every committed run result, oldest first (run ids sort by time)."""
    if not project.results_dir.is_dir():
        return []
    out = []
    for path in sorted(project.results_dir.glob("*.json")):
        shown = project.relative(path)
        results = RunResults.from_json(_read_json(path, shown), shown)
        if results.run_id != path.stem:
            raise RecordError(f"run_id {results.run_id!r} differs from the file name", path=shown, field="run_id")
        out.append(results)
    return sorted(out, key=lambda r: r.run_id)
