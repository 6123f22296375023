"""A git clean filter for probe notebooks: what git stores is the code, never what a session printed.

`make` registers it for `notebooks/*.ipynb` (see .gitattributes): after Run All and save in
JupyterLab, `git diff notebooks/` stays empty, and so does the execution cache key, which reads
the code cells only (perfkit/experiment/plan.py). Outputs, execution counts and the metadata a
run leaves (papermill's, widget state, cell timings) are dropped; everything else is kept, written
as Jupyter writes it (sorted keys, one-space indent, a newline at the end).

    python -m perfkit.experiment.strip < executed.ipynb > clean.ipynb
"""

from __future__ import annotations

import json
import sys
from typing import Any

_RUN_METADATA = ("papermill", "execution", "widgets", "collapsed", "scrolled", "ExecuteTime")


def strip(nb: dict[str, Any]) -> dict[str, Any]:
    """The notebook without what running it added; ValueError when it is not shaped as a notebook."""
    cells = nb.get("cells", []) if isinstance(nb, dict) else None
    if not isinstance(cells, list) or not all(isinstance(c, dict) for c in cells):
        raise ValueError("not a notebook: expected an object with a list of cells")
    if not isinstance(nb.get("metadata", {}), dict) or not all(isinstance(c.get("metadata", {}), dict) for c in cells):
        raise ValueError("not a notebook: a metadata that is not an object")
    for key in ("papermill", "widgets"):
        nb.get("metadata", {}).pop(key, None)
    for cell in cells:
        meta = cell.get("metadata", {})
        for key in _RUN_METADATA:
            meta.pop(key, None)
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
    return nb


def dumps(nb: dict[str, Any]) -> str:
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def main() -> int:
    text = sys.stdin.read()
    try:
        clean = dumps(strip(json.loads(text)))
    except (ValueError, RecursionError) as exc:  # not a notebook git should change: store it as it is
        print(f"perfkit clean filter: stored as it is ({exc})"[:200], file=sys.stderr)
        sys.stdout.write(text)
        return 0
    sys.stdout.write(clean)
    return 0


if __name__ == "__main__":
    sys.exit(main())
