"""Hypothesis records: one strict YAML file per claim, with its expected cost and its probe.

Strict because a typo in a record (`expcet:`, `factr: 3`) must not silently turn into a default
and a verdict nobody asked for. Every error names file:line, the field and what was expected, and
all errors of all files are reported at once.

The record, hypotheses/<id>.yaml:

    id: mask-build-200ms              # slug, equal to the file name
    claim: One sentence.
    rationale: Why it was believed, before measuring.
    expect:                           # the expected cost; keys depend on kind
      kind: cost                      # value within a factor: value / factor .. value * factor
      metric: mask_build_naive        # a name the probe records with perfkit.record
      value: 200                      # or `floor: <recorded metric>` (e.g. a roofline figure)
      unit: ms                        # checked against the recorded unit (convertible only)
      factor: 3
      at: {ctx: 46000}                # optional: which recorded point, when there are several
      min_samples: 5                  # optional: fewer samples give "inconclusive"
    # kind at_most / at_least: metric, unit, value (or floor [+ factor: bound = factor x floor])
    # kind share:   metric, of (e.g. step), at_least and/or at_most as fractions (unit: % allowed)
    # kind scaling: metric, over (the swept parameter), exponent, tolerance  (log-log fit)
    # kind speedup: baseline, candidate, at_least and/or at_most  (x; time or rate metrics)
    probe:
      notebook: mask_build.ipynb      # under notebooks/, with a cell tagged `parameters`
      params: {ctx: 46000, batch: 1}  # full mode; each must be declared by the notebook
      quick: {ctx: 4096}              # overrides for --quick
      sweep: {param: ctx, values: [4096, 16384], quick: [4096]}   # one execution per value
      replicates: 5                   # optional: kernel processes per execution (default: the run's)
      samples: {repeat: [10, 80]}     # optional: sample counts perfkit may choose from (replicates.py)
    tags: [case-study]
    machines: pool                    # optional, over several machines: the claim is about the pool (a
                                      # kind of machine; default) or must hold on `every` machine
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfkit import units
from perfkit.errors import RecordError, UserError
from perfkit.experiment.records.checker import (
    MAX_RECORD_BYTES,
    Checker,
    Located,
    optional,
    required,
)
from perfkit.experiment.records.kinds import KINDS, Expect, all_keys
from perfkit.experiment.records.notebooks import recorded_units
from perfkit.experiment.records.probe import Probe, check_probe
from perfkit.paths import Project, find_project

SLUG = re.compile(r"^[a-z0-9][a-z0-9-]{0,119}\Z")  # at most 120: <id>.png and its temporary names fit a file name

#: what a claim is about when its replicates ran on several machines: the pool (a kind of machine, the default)
#: or every machine (each must satisfy it: the worst machine decides)
MACHINES = ("pool", "every")
TOP_KEYS = {
    "id": required("lowercase letters, digits and dashes, at most 120; the file is `hypotheses/<id>.yaml`"),
    "claim": required("the claim in one sentence, as a reviewer reads it"),
    "rationale": required("why it was believed, written before measuring"),
    "expect": required("the expected cost: a mapping whose keys depend on its kind (below)"),
    "probe": required("the notebook that measures it and how it is run (below)"),
    "tags": optional(
        "a list of words that group hypotheses for the reader; perfkit stores them and judges nothing by them"
    ),
    "machines": optional(
        "over several machines, what the claim is about: pool (a kind of machine; the default) or every "
        "(each machine must satisfy it)"
    ),
}


class ValidationFailed(UserError):
    """One or more hypothesis records are malformed; carries every error found."""

    def __init__(self, errors: list[RecordError]):
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


@dataclass(frozen=True)
class Hypothesis:
    id: str
    claim: str
    rationale: str
    expect: Expect
    probe: Probe
    tags: tuple[str, ...]
    path: Path
    hash: str  # of the parsed record; a verdict is stale when this changes
    machines: str = "pool"  # one of MACHINES


def _check_expect(checker: Checker, raw: Any) -> Expect | None:
    where = ("expect",)
    expect = checker.mapping(raw, where)
    if expect is None:
        return None
    kind = expect.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:
        checker.fail(where + ("kind",), f"expected one of {', '.join(KINDS)}, got {kind!r}")
        checker.keys(expect, where, all_keys())
        return None
    return KINDS[kind].parse(checker, expect, where)


def _check_units(checker: Checker, expect: Any, probe: Probe, project: Project, cache: dict) -> None:
    """A claim's unit has the dimension of the unit its probe records the metric in, when the probe says."""
    unit = getattr(expect, "unit", None)
    if unit is None:
        return
    path = project.notebooks_dir / probe.notebook
    key = ("units", path)
    if key not in cache:
        cache[key] = recorded_units(path)
    for key_name in ("metric", "floor"):
        metric = getattr(expect, key_name, None)
        recorded = cache[key].get(metric) if metric else None
        if recorded and units.dimension(recorded) != units.dimension(unit):
            checker.fail(
                ("expect", "unit"),
                f"{unit!r} measures {units.dimension(unit).replace('_', ' ')}, but {probe.notebook} records "
                f"{metric} in {recorded!r} ({units.dimension(recorded).replace('_', ' ')})",
            )


def record_hash(data: Any) -> str:
    """Stable hash of a parsed record: formatting and comments do not count, content does.

    `probe.samples` does not count either: the sample counts perfkit may choose say how a verdict is
    paid for, not what is claimed (the counts a run chose are in its executions' parameters and keys)."""
    if isinstance(data, dict) and isinstance(data.get("probe"), dict) and "samples" in data["probe"]:
        data = {**data, "probe": {k: v for k, v in data["probe"].items() if k != "samples"}}
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def load_hypothesis(path: Path, project: Project, *, notebook_cache: dict | None = None) -> Hypothesis:
    """Parse and validate one record; raises ValidationFailed with every error in it."""
    shown = project.relative(path)
    try:
        if Path(path).stat().st_size > MAX_RECORD_BYTES:  # refused before it is read
            raise ValidationFailed([RecordError(f"the record is larger than {MAX_RECORD_BYTES:,} bytes", path=shown)])
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValidationFailed([RecordError(f"cannot read: {exc}", path=shown)]) from None
    try:
        doc = Located(text, shown)
    except RecordError as exc:
        raise ValidationFailed([exc]) from None
    checker = Checker(doc)
    data = checker.mapping(doc.data, ())
    if data is None:
        raise ValidationFailed(checker.errors)
    checker.keys(data, (), TOP_KEYS)
    hid = checker.string(data, "id", (), pattern=SLUG, what="a slug (at most 120 lowercase letters, digits and dashes)")
    if hid is not None and hid != Path(path).stem:
        checker.fail(("id",), f"id {hid!r} must equal the file name {Path(path).stem!r}")
    claim = checker.string(data, "claim", ())
    if claim is not None and "\n" in claim.strip():
        checker.fail(("claim",), "a claim is one sentence on one line")
    rationale = checker.string(data, "rationale", ())
    tags: tuple[str, ...] = ()
    if "tags" in data:
        if not isinstance(data["tags"], list) or not all(isinstance(t, str) and SLUG.match(t) for t in data["tags"]):
            checker.fail(("tags",), "expected a list of slugs (lowercase letters, digits and dashes)")
        else:
            tags = tuple(data["tags"])
    machines = data.get("machines", "pool")
    if machines not in MACHINES:
        checker.fail(("machines",), f"expected one of {', '.join(MACHINES)}, got {machines!r}")
    expect = _check_expect(checker, data["expect"]) if "expect" in data else None
    probe = (
        check_probe(checker, data["probe"], project, notebook_cache if notebook_cache is not None else {})
        if "probe" in data
        else None
    )
    # A scaling claim reads its points from a sweep of executions or, without one, from the `at`
    # values the probe records itself (a grid inside one execution); only a mismatch is knowable here.
    if expect is not None and probe is not None and expect.kind == "scaling":
        if probe.sweep is not None and probe.sweep.param != expect.over:
            checker.fail(("expect", "over"), f"the probe sweeps {probe.sweep.param!r}, not {expect.over!r}")
    if expect is not None and probe is not None:
        _check_units(checker, expect, probe, project, notebook_cache if notebook_cache is not None else {})
    if checker.errors:
        raise ValidationFailed(sorted(checker.errors, key=lambda e: e.line or 0))
    return Hypothesis(
        id=hid,
        claim=claim.strip(),
        rationale=rationale.strip(),
        expect=expect,
        probe=probe,
        tags=tags,
        path=Path(path),
        hash=record_hash(data),
        machines=machines,
    )


def hypothesis_files(project: Project) -> list[Path]:
    """Every record file, dangling links included (they are errors, not silently skipped); none when the
    project has no hypotheses/ (an old commit's tree, checked out by `perfkit bisect --probe-from commit`)."""
    if not project.hypotheses_dir.is_dir():
        return []
    return sorted(
        p for p in project.hypotheses_dir.iterdir() if p.suffix in (".yaml", ".yml") and (p.is_file() or p.is_symlink())
    )


def _link_problem(path: Path, project: Project) -> str | None:
    """Why a record file that is a symbolic link cannot be read, or None."""
    if not path.is_symlink():
        return None
    if not path.exists():
        return "a symbolic link to nothing (dangling)"
    if not path.resolve().is_relative_to(project.root.resolve()):
        return f"a symbolic link to {path.resolve()}, outside the project; records come from the project"
    return None


def load_hypotheses(project: Project | None = None, ids: list[str] | None = None) -> list[Hypothesis]:
    """Every hypothesis of the project (all validated), or those named by `ids`, sorted by id."""
    project = project or find_project()
    errors: list[RecordError] = []
    found: dict[str, Hypothesis] = {}
    cache: dict = {}
    for path in hypothesis_files(project):
        problem = _link_problem(path, project)
        if problem:
            errors.append(RecordError(problem, path=project.relative(path)))
            continue
        try:
            hypothesis = load_hypothesis(path, project, notebook_cache=cache)
        except ValidationFailed as exc:
            errors.extend(exc.errors)
            continue
        if hypothesis.id in found:
            errors.append(
                RecordError(
                    f"duplicate id; also in {project.relative(found[hypothesis.id].path)}",
                    path=project.relative(path),
                    line=1,
                    field="id",
                )
            )
            continue
        found[hypothesis.id] = hypothesis
    if errors:
        raise ValidationFailed(errors)
    if ids:
        unknown = [i for i in ids if i not in found]
        if unknown:
            raise UserError(f"no such hypothesis: {', '.join(unknown)} (known: {', '.join(sorted(found)) or 'none'})")
        return [found[i] for i in sorted(set(ids))]
    return [found[i] for i in sorted(found)]
