"""What a probe notebook declares, read without running it: its parameters and the units it records.

A record's parameters are checked against the notebook's `parameters` cell (papermill's description of
each: its annotation or its default's type); the claim's unit against the unit the notebook records its
metric in, when it says so with literal words.
"""

from __future__ import annotations

import ast
import math
from pathlib import Path
from typing import Any

from perfkit import units
from perfkit.experiment.records.checker import is_number, shown, type_name
from perfkit.paths import format_literal

__all__ = ["COMPUTED", "check_parameter", "literal_default", "notebook_parameters", "recorded_units"]


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
    return papermill.inspect_notebook(format_literal(path))


def recorded_units(path: Path) -> dict[str, str]:
    """Metric -> unit for each `record("name", ..., unit="u")` the notebook makes with literal words.

    What the notebook says it records, read without running it: names or units built at run time
    are not known here (the run checks them), and a name recorded in two dimensions is left out.
    """
    import nbformat

    found: dict[str, set[str]] = {}
    try:
        nb = nbformat.read(str(path), as_version=4)
    except Exception:
        return {}
    for cell in nb.cells:
        if cell.get("cell_type") != "code":
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:  # IPython magics: the cell is not plain Python
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            unit = next((k.value for k in node.keywords if k.arg == "unit"), None)
            if name != "record" or not node.args or not isinstance(node.args[0], ast.Constant):
                continue
            if isinstance(node.args[0].value, str) and isinstance(unit, ast.Constant) and units.is_unit(unit.value):
                found.setdefault(node.args[0].value, set()).add(unit.value)
    return {m: next(iter(u)) for m, u in found.items() if len({units.dimension(x) for x in u}) == 1}


COMPUTED = object()  # a default papermill cannot read as a literal: computed when the notebook runs


def literal_default(text: str | None) -> Any:
    """A declared parameter's default as a value (papermill reports its source text), or COMPUTED."""
    try:
        return ast.literal_eval(text) if text else COMPUTED
    except (ValueError, SyntaxError):
        return COMPUTED


def _declared_type(description: dict) -> type | None:
    """The Python type a notebook parameter expects: its annotation, else its default's type."""
    annotated = {"int": int, "float": float, "str": str, "bool": bool, "list": list, "dict": dict}
    name = description.get("inferred_type_name")
    if name in annotated:
        return annotated[name]
    default = literal_default(description.get("default"))
    return type(default) if type(default) in annotated.values() else None


def _parameter_value_problem(value: Any, depth: int = 0) -> str | None:
    """Why `value` cannot travel to a notebook as a parameter (papermill writes it as Python)."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return None
    if isinstance(value, int):
        return None if abs(value) < 10**18 else f"{shown(value)} is too large"
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{value!r} is not a finite number"
    if isinstance(value, (list, dict)) and depth < 4:
        items = value.values() if isinstance(value, dict) else value
        if isinstance(value, dict) and not all(isinstance(k, str) for k in value):
            return "mapping keys must be strings"
        return next((p for p in (_parameter_value_problem(v, depth + 1) for v in items) if p), None)
    return f"a parameter is a string, number, boolean or a list or mapping of those, got {type_name(value)}"


def check_parameter(name: str, value: Any, declared: dict[str, dict]) -> str | None:
    """Why `value` cannot be passed as notebook parameter `name`, or None when it can."""
    problem = _parameter_value_problem(value)
    if problem:
        return problem
    if name not in declared:
        known = ", ".join(sorted(declared)) or "none"
        return f"the notebook does not declare parameter {name!r} (declared: {known})"
    expected = _declared_type(declared[name])
    if expected is None:
        return None
    if expected is float and is_number(value):
        return None
    if type(value) is not expected:
        return (
            f"expected {type_name(expected())} like the notebook's default "
            f"{declared[name]['default']}, got {type_name(value)} {value!r}"
        )
    return _item_problem(value, literal_default(declared[name].get("default")))


def _item_problem(value: Any, default: Any) -> str | None:
    """A list whose default is a non-empty list of one scalar type holds that type only (any number for floats)."""
    if not isinstance(value, list) or not isinstance(default, list) or not default:
        return None
    kinds = {type(item) for item in default}
    if len(kinds) != 1 or (kind := kinds.pop()) not in (str, int, float, bool):
        return None
    for i, item in enumerate(value):
        if not _fits(item, kind):
            said = f"the notebook's default {default!r}"[:100]
            return f"item {i} is {type_name(item)} {item!r}; {said} holds only {kind.__name__} items"
    return None


def _fits(item: Any, kind: type) -> bool:
    if kind is bool:
        return type(item) is bool
    if kind is float:
        return is_number(item)
    return isinstance(item, kind) and type(item) is not bool
