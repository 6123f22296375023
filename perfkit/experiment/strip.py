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
    """The notebook without what running it added."""
    for key in ("papermill", "widgets"):
        nb.get("metadata", {}).pop(key, None)
    for cell in nb.get("cells", []):
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
        nb = json.loads(text)
    except ValueError:
        sys.stdout.write(text)  # not a notebook git should change: store it as it is
        return 0
    sys.stdout.write(dumps(strip(nb)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
