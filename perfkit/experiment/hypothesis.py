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
    tags: [case-study]
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from perfkit import units
from perfkit.errors import RecordError, UserError
from perfkit.paths import Project, find_project

KINDS = ("cost", "at_most", "at_least", "share", "scaling", "speedup")
SLUG = re.compile(r"^[a-z0-9][a-z0-9-]*$")
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:/-]*$")
DEFAULT_MIN_SAMPLES = 5

_TOP_KEYS = {"id": True, "claim": True, "rationale": True, "expect": True, "probe": True, "tags": False}
_PROBE_KEYS = {"notebook": True, "params": False, "quick": False, "sweep": False}
_SWEEP_KEYS = {"param": True, "values": True, "quick": False}
_COMMON_EXPECT = {"kind": True, "at": False, "min_samples": False}
# kind -> {key: required}; "value | floor" is checked separately for cost / at_most / at_least.
_EXPECT_KEYS: dict[str, dict[str, bool]] = {
    "cost": {"metric": True, "unit": True, "factor": True, "value": False, "floor": False},
    "at_most": {"metric": True, "unit": True, "value": False, "floor": False, "factor": False},
    "at_least": {"metric": True, "unit": True, "value": False, "floor": False, "factor": False},
    "share": {"metric": True, "of": True, "at_least": False, "at_most": False, "unit": False},
    "scaling": {"metric": True, "over": True, "exponent": True, "tolerance": True},
    "speedup": {"baseline": True, "candidate": True, "at_least": False, "at_most": False},
}


class ValidationFailed(UserError):
    """One or more hypothesis records are malformed; carries every error found."""

    def __init__(self, errors: list[RecordError]):
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


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


@dataclass(frozen=True)
class Expect:
    """The expected cost. Which fields are set depends on `kind` (see KINDS)."""

    kind: str
    metric: str | None = None
    unit: str | None = None
    value: float | None = None
    factor: float | None = None
    floor: str | None = None
    at: dict[str, Any] | None = None
    of: str | None = None
    at_least: float | None = None
    at_most: float | None = None
    over: str | None = None
    exponent: float | None = None
    tolerance: float | None = None
    baseline: str | None = None
    candidate: str | None = None
    min_samples: int = DEFAULT_MIN_SAMPLES

    def metrics(self) -> tuple[str, ...]:
        """Every metric name the probe must record for this expectation."""
        names = [self.metric, self.of, self.floor, self.baseline, self.candidate]
        return tuple(n for n in names if n)


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


# ---------------------------------------------------------------- YAML with line numbers


class _Located:
    """Plain data from YAML, plus the line of every key path, for file:line errors."""

    def __init__(self, text: str, path: str):
        self.path = path
        self.lines: dict[tuple, int] = {}
        self.errors: list[RecordError] = []
        try:
            node = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = mark.line + 1 if mark is not None else None
            problem = getattr(exc, "problem", None) or str(exc)
            raise RecordError(f"not valid YAML: {problem}", path=path, line=line) from None
        if node is None:
            raise RecordError("empty file; expected a mapping with id, claim, rationale, expect, probe", path=path, line=1)
        self.data = self._walk(node, ())

    def _walk(self, node, where: tuple):
        self.lines.setdefault(where, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            out: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                key = self._scalar(key_node)
                if key in out:
                    self.errors.append(self.error(where + (key,), "duplicate key", line=key_node.start_mark.line + 1))
                self.lines[where + (key,)] = key_node.start_mark.line + 1
                out[key] = self._walk(value_node, where + (key,))
            return out
        if isinstance(node, yaml.SequenceNode):
            items = []
            for i, item in enumerate(node.value):
                self.lines[where + (i,)] = item.start_mark.line + 1
                items.append(self._walk(item, where + (i,)))
            return items
        return self._scalar(node)

    @staticmethod
    def _scalar(node):
        loader = yaml.SafeLoader("")
        try:
            return loader.construct_object(node, deep=True)
        finally:
            loader.dispose()

    def line(self, where: tuple) -> int | None:
        while where and where not in self.lines:
            where = where[:-1]
        return self.lines.get(where)

    def error(self, where: tuple, message: str, *, line: int | None = None) -> RecordError:
        name = ".".join(str(p) for p in where) or None
        return RecordError(message, path=self.path, line=line or self.line(where), field=name)


# ---------------------------------------------------------------- validation


def _type_name(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "a mapping", type(None): "null"}.get(type(value), type(value).__name__)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class _Checker:
    """Walks one parsed record, collecting every error instead of stopping at the first."""

    def __init__(self, doc: _Located):
        self.doc = doc
        self.errors = doc.errors

    def fail(self, where: tuple, message: str) -> None:
        self.errors.append(self.doc.error(where, message))

    def keys(self, mapping: dict, where: tuple, allowed: dict[str, bool]) -> None:
        for key in mapping:
            if key not in allowed:
                hint = ", ".join(sorted(allowed))
                self.fail(where + (key,), f"unknown key; expected one of: {hint}")
        for key, required in allowed.items():
            if required and key not in mapping:
                self.errors.append(self.doc.error(where + (key,), "missing; this key is required", line=self.doc.line(where)))

    def mapping(self, value: Any, where: tuple) -> dict | None:
        if not isinstance(value, dict):
            self.fail(where, f"expected a mapping, got {_type_name(value)}")
            return None
        for key in value:
            if not isinstance(key, str):
                self.fail(where + (key,), f"keys must be strings, got {_type_name(key)}")
        return value

    def string(self, mapping: dict, key: str, where: tuple, *, pattern: re.Pattern | None = None, what: str = "") -> str | None:
        if key not in mapping:
            return None
        value = mapping[key]
        if not isinstance(value, str) or not value.strip():
            self.fail(where + (key,), f"expected a non-empty string, got {_type_name(value)}")
            return None
        if pattern is not None and not pattern.match(value):
            self.fail(where + (key,), f"{value!r} is not {what}")
            return None
        return value

    def number(self, mapping: dict, key: str, where: tuple, *, positive: bool = False, at_least: float | None = None) -> float | None:
        if key not in mapping:
            return None
        value = mapping[key]
        if not _is_number(value):
            self.fail(where + (key,), f"expected a number, got {_type_name(value)} {value!r}")
            return None
        if positive and not value > 0:
            self.fail(where + (key,), f"expected a number > 0, got {value!r}")
            return None
        if at_least is not None and value < at_least:
            self.fail(where + (key,), f"expected a number >= {at_least:g}, got {value!r}")
            return None
        return float(value)


def _check_scalars(checker: _Checker, mapping: dict, where: tuple) -> None:
    for key, value in mapping.items():
        if not isinstance(value, (str, int, float, bool)):
            checker.fail(where + (key,), f"expected a number, string or boolean, got {_type_name(value)}")


def _check_expect(checker: _Checker, raw: Any) -> Expect | None:
    where = ("expect",)
    expect = checker.mapping(raw, where)
    if expect is None:
        return None
    kind = expect.get("kind")
    if kind not in KINDS:
        checker.fail(where + ("kind",), f"expected one of {', '.join(KINDS)}, got {kind!r}")
        checker.keys(expect, where, {**_COMMON_EXPECT, **{k: False for keys in _EXPECT_KEYS.values() for k in keys}})
        return None
    allowed = {**_COMMON_EXPECT, **_EXPECT_KEYS[kind]}
    errors_before = len(checker.errors)
    checker.keys(expect, where, allowed)

    fields: dict[str, Any] = {"kind": kind}
    for key in ("metric", "of", "floor", "over", "baseline", "candidate"):
        if key in allowed:
            fields[key] = checker.string(expect, key, where, pattern=NAME, what="a metric or parameter name")
    if "unit" in expect and "unit" in allowed:
        unit = expect["unit"]
        if not units.is_unit(unit):
            checker.fail(where + ("unit",), f"unknown unit {unit!r}; expected one of: {', '.join(units.KNOWN_UNITS)}")
        elif kind == "share" and units.dimension(unit) != "fraction":
            checker.fail(where + ("unit",), f"a share is a fraction; expected 'fraction' or '%', got {unit!r}")
        else:
            fields["unit"] = unit
    for key in ("value", "tolerance"):
        if key in allowed:
            fields[key] = checker.number(expect, key, where, positive=True)
    if "factor" in allowed:
        fields["factor"] = checker.number(expect, "factor", where, at_least=1.0 if kind == "cost" else None, positive=True)
    if "exponent" in allowed:
        fields["exponent"] = checker.number(expect, "exponent", where)
    for key in ("at_least", "at_most"):
        if key in allowed:
            fields[key] = checker.number(expect, key, where, positive=kind == "speedup")
    if "min_samples" in expect:
        value = expect["min_samples"]
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            checker.fail(where + ("min_samples",), f"expected an integer >= 1, got {value!r}")
        else:
            fields["min_samples"] = value
    if "at" in expect:
        at = checker.mapping(expect["at"], where + ("at",))
        if at is not None:
            _check_scalars(checker, at, where + ("at",))
            fields["at"] = dict(at)

    if kind in ("cost", "at_most", "at_least"):
        has_value, has_floor = "value" in expect, "floor" in expect
        if has_value == has_floor:
            checker.errors.append(checker.doc.error(where + ("value",), "give exactly one of `value` (a number) or `floor` (a recorded floor metric)", line=checker.doc.line(where)))
        if kind != "cost" and "factor" in expect and not has_floor:
            checker.fail(where + ("factor",), "a bound's `factor` multiplies a `floor`; with a plain `value` write the bound itself")
    if kind in ("share", "speedup") and "at_least" not in expect and "at_most" not in expect:
        checker.errors.append(checker.doc.error(where + ("at_least",), "give `at_least` and/or `at_most`", line=checker.doc.line(where)))
    if kind == "share":
        scale = units.factor(fields.get("unit") or "fraction", "fraction")
        for key in ("at_least", "at_most"):
            if fields.get(key) is not None:
                fields[key] *= scale
                if not 0 <= fields[key] <= 1:
                    checker.fail(where + (key,), f"a share lies between 0 and 1 (0% and 100%), got {expect[key]!r}")
    if len(checker.errors) > errors_before:
        return None
    return Expect(**{k: v for k, v in fields.items() if v is not None})


def notebook_parameters(path: Path) -> dict[str, dict] | str:
    """Declared parameters of a notebook (name -> papermill's description), or why there are none."""
    import nbformat
    import papermill

    try:
        nb = nbformat.read(str(path), as_version=4)
    except Exception as exc:  # any unreadable notebook is reported as a record error, not a crash
        return f"cannot read notebook: {exc}"
    if not any("parameters" in c.get("metadata", {}).get("tags", []) for c in nb.cells):
        return "notebook has no cell tagged `parameters`"
    if not nb.metadata.get("kernelspec", {}).get("name"):
        return "notebook metadata has no kernelspec; set it to the `perfkit` kernel"
    return papermill.inspect_notebook(str(path))


def _declared_type(description: dict) -> type | None:
    """The Python type a notebook parameter expects: its annotation, else its default's type."""
    annotated = {"int": int, "float": float, "str": str, "bool": bool, "list": list, "dict": dict}
    name = description.get("inferred_type_name")
    if name in annotated:
        return annotated[name]
    try:
        default = ast.literal_eval(description.get("default", ""))
    except (ValueError, SyntaxError):
        return None
    return type(default) if type(default) in annotated.values() else None


def check_parameter(name: str, value: Any, declared: dict[str, dict]) -> str | None:
    """Why `value` cannot be passed as notebook parameter `name`, or None when it can."""
    if name not in declared:
        known = ", ".join(sorted(declared)) or "none"
        return f"the notebook does not declare parameter {name!r} (declared: {known})"
    expected = _declared_type(declared[name])
    if expected is None:
        return None
    if expected is float and _is_number(value):
        return None
    if type(value) is not expected:
        return f"expected {_type_name(expected())} like the notebook's default {declared[name]['default']}, got {_type_name(value)} {value!r}"
    return None


def _check_probe(checker: _Checker, raw: Any, project: Project, notebook_cache: dict) -> Probe | None:
    where = ("probe",)
    probe = checker.mapping(raw, where)
    if probe is None:
        return None
    errors_before = len(checker.errors)
    checker.keys(probe, where, _PROBE_KEYS)
    notebook = checker.string(probe, "notebook", where)
    declared: dict | None = None
    if notebook is not None:
        path = project.notebooks_dir / notebook
        if not notebook.endswith(".ipynb"):
            checker.fail(where + ("notebook",), f"expected a .ipynb file under notebooks/, got {notebook!r}")
        elif not path.is_file():
            checker.fail(where + ("notebook",), f"no such notebook: {project.relative(path)}")
        else:
            if path not in notebook_cache:
                notebook_cache[path] = notebook_parameters(path)
            found = notebook_cache[path]
            if isinstance(found, str):
                checker.fail(where + ("notebook",), f"{found} ({project.relative(path)})")
            else:
                declared = found

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
    if len(checker.errors) > errors_before:
        return None
    return Probe(notebook=notebook, params=dict(blocks.get("params", {})), quick=dict(blocks.get("quick", {})), sweep=sweep)


def _check_sweep(checker: _Checker, raw: Any, declared: dict | None) -> Sweep | None:
    where = ("probe", "sweep")
    sweep = checker.mapping(raw, where)
    if sweep is None:
        return None
    checker.keys(sweep, where, _SWEEP_KEYS)
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
            checker.fail(where + (key,), f"expected a non-empty list, got {_type_name(values)}")
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


def record_hash(data: Any) -> str:
    """Stable hash of a parsed record: formatting and comments do not count, content does."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def load_hypothesis(path: Path, project: Project, *, notebook_cache: dict | None = None) -> Hypothesis:
    """Parse and validate one record; raises ValidationFailed with every error in it."""
    shown = project.relative(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValidationFailed([RecordError(f"cannot read: {exc}", path=shown)]) from None
    try:
        doc = _Located(text, shown)
    except RecordError as exc:
        raise ValidationFailed([exc]) from None
    checker = _Checker(doc)
    data = checker.mapping(doc.data, ())
    if data is None:
        raise ValidationFailed(checker.errors)
    checker.keys(data, (), _TOP_KEYS)
    hid = checker.string(data, "id", (), pattern=SLUG, what="a slug (lowercase letters, digits and dashes)")
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
    expect = _check_expect(checker, data["expect"]) if "expect" in data else None
    probe = (
        _check_probe(checker, data["probe"], project, notebook_cache if notebook_cache is not None else {})
        if "probe" in data
        else None
    )
    # A scaling claim reads its points from a sweep of executions or, without one, from the `at`
    # values the probe records itself (a grid inside one execution); only a mismatch is knowable here.
    if expect is not None and probe is not None and expect.kind == "scaling":
        if probe.sweep is not None and probe.sweep.param != expect.over:
            checker.fail(("expect", "over"), f"the probe sweeps {probe.sweep.param!r}, not {expect.over!r}")
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
    )


def hypothesis_files(project: Project) -> list[Path]:
    return sorted(p for p in project.hypotheses_dir.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())


def load_hypotheses(project: Project | None = None, ids: list[str] | None = None) -> list[Hypothesis]:
    """Every hypothesis of the project (all validated), or those named by `ids`, sorted by id."""
    project = project or find_project()
    errors: list[RecordError] = []
    found: dict[str, Hypothesis] = {}
    cache: dict = {}
    for path in hypothesis_files(project):
        try:
            hypothesis = load_hypothesis(path, project, notebook_cache=cache)
        except ValidationFailed as exc:
            errors.extend(exc.errors)
            continue
        if hypothesis.id in found:
            errors.append(RecordError(f"duplicate id; also in {project.relative(found[hypothesis.id].path)}",
                                      path=project.relative(path), line=1, field="id"))
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
