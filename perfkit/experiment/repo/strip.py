"""A git clean filter for probe notebooks: what git stores is the code, never what a session printed.

`make` registers it for `notebooks/*.ipynb` (see .gitattributes): after Run All and save in
JupyterLab, `git diff notebooks/` stays empty, and so does the execution cache key, which reads
the code cells only (perfkit/experiment/run/plan.py). Outputs, execution counts and the metadata a
run leaves (papermill's, widget state, cell timings, the kernel's `language_info`, which changes
with every Python patch release) are dropped; everything else is kept, written as Jupyter writes
it (sorted keys, one-space indent, a newline at the end). More keys, as nbstripout's `extrakeys`:

    [tool.perfkit]
    strip = ["metadata.jupytext", "cell.metadata.tags"]

    python -m perfkit.experiment.repo.strip [NOTEBOOK] < executed.ipynb > clean.ipynb

git passes NOTEBOOK (`%f`), the path that says which project's settings apply.
"""

from __future__ import annotations

import json
import sys
from typing import Any

_RUN_METADATA = ("papermill", "execution", "widgets", "collapsed", "scrolled", "ExecuteTime")
_NOTEBOOK_METADATA = ("papermill", "widgets", "language_info")


def _drop(tree: Any, dotted: list[str]) -> None:
    """Remove the key at a dotted path inside nested objects, when it is there."""
    for name in dotted[:-1]:
        tree = tree.get(name) if isinstance(tree, dict) else None
    if isinstance(tree, dict):
        tree.pop(dotted[-1], None)


def strip(nb: dict[str, Any], extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """The notebook without what running it added; ValueError when it is not shaped as a notebook."""
    cells = nb.get("cells", []) if isinstance(nb, dict) else None
    if not isinstance(cells, list) or not all(isinstance(c, dict) for c in cells):
        raise ValueError("not a notebook: expected an object with a list of cells")
    if not isinstance(nb.get("metadata", {}), dict) or not all(isinstance(c.get("metadata", {}), dict) for c in cells):
        raise ValueError("not a notebook: a metadata that is not an object")
    for key in _NOTEBOOK_METADATA:
        nb.get("metadata", {}).pop(key, None)
    for key in extra:  # "metadata.a.b": the notebook's; "cell.metadata.a": every cell's
        if not key.startswith("cell."):
            _drop(nb, key.split("."))
    for cell in cells:
        meta = cell.get("metadata", {})
        for key in _RUN_METADATA:
            meta.pop(key, None)
        for key in extra:
            if key.startswith("cell."):
                _drop(cell, key.split(".")[1:])
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
    return nb


def dumps(nb: dict[str, Any]) -> str:
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def extra_keys(notebook: str | None) -> tuple[str, ...]:
    """`[tool.perfkit] strip` of the project holding `notebook` (none found, or unreadable: none, said once)."""
    if not notebook:
        return ()
    from pathlib import Path

    from perfkit.errors import UserError
    from perfkit.experiment.records import config
    from perfkit.experiment.run.kernel import project_root
    from perfkit.paths import Project

    root = project_root(Path(notebook).resolve().parent)
    if root is None:
        return ()
    try:
        return config.read(Project(root)).strip
    except UserError as exc:  # a clean filter never fails: the defaults apply
        print(f"perfkit clean filter: {exc}; only the default keys are stripped"[:300], file=sys.stderr)
        return ()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = sys.stdin.read()
    try:
        clean = dumps(strip(json.loads(text), extra_keys(argv[0] if argv else None)))
    except (ValueError, RecursionError) as exc:  # not a notebook git should change: store it as it is
        print(f"perfkit clean filter: stored as it is ({exc})"[:200], file=sys.stderr)
        sys.stdout.write(text)
        return 0
    sys.stdout.write(clean)
    return 0


if __name__ == "__main__":
    sys.exit(main())
