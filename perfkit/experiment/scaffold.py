"""`perfkit new probe NAME`: a probe notebook that already works, for a user to edit.

The generated notebook has everything a probe needs (a cell tagged `parameters` with quick
defaults, warm-up and repetitions through `perfkit.bench`, samples recorded with a unit and the
point they were measured at, a plot), so the first run gives a verdict before anything is edited.
"""

from __future__ import annotations

import re

from perfkit.errors import UserError
from perfkit.files import write_atomic
from perfkit.paths import Project

NAME = re.compile(r"^[a-z][a-z0-9_]*$")

_INTRO = """# Probe: {name}

What this probe measures, and which hypotheses read it. As generated it times `numpy.sort` on
`n` random floats; replace `work()` with the code you want to measure and keep the rest.

Records `{metric}` (ms per call) at `n`."""

_PARAMETERS = """n: int = 1_000_000  # problem size
repeat: int = 20  # timed calls (samples, not one number)
warmup: int = 3  # untimed calls first: caches, allocator, lazy initialisation"""

_SETUP = """import matplotlib.pyplot as plt
import numpy as np

import perfkit

x = np.random.default_rng(0).random(n)


def work():
    return np.sort(x)"""

_MEASURE = """samples = perfkit.bench(work, warmup=warmup, repeat=repeat)  # seconds per call
perfkit.record("{metric}", [s * 1e3 for s in samples], unit="ms", at={{"n": n}})"""

_PLOT = """fig, ax = plt.subplots(figsize=(6, 2.5))
ax.plot([s * 1e3 for s in samples], "o-")
ax.set_xlabel("repetition")
ax.set_ylabel("ms per call")
ax.set_title(f"{metric}, n={{n:,}}", fontsize=9)
fig.tight_layout()
plt.show()"""


def new_probe(project: Project, name: str) -> str:
    """Write notebooks/NAME.ipynb; returns its path relative to the project. Never overwrites."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

    if not NAME.match(name):
        raise UserError(f"probe name {name!r}: use lowercase letters, digits and underscores, starting with a letter")
    path = project.notebooks_dir / f"{name}.ipynb"
    if path.exists():
        raise UserError(f"{project.relative(path)} already exists; pick another name or edit that notebook")
    metric = name
    cells = [
        new_markdown_cell(_INTRO.format(name=name, metric=metric)),
        new_code_cell(_PARAMETERS, metadata={"tags": ["parameters"]}),
        new_code_cell(_SETUP),
        new_code_cell(_MEASURE.format(metric=metric)),
        new_code_cell(_PLOT.format(metric=metric)),
    ]
    for i, cell in enumerate(cells):
        cell["id"] = f"{name.replace('_', '-')}-{i}"
    notebook = new_notebook(
        cells=cells,
        metadata={
            "kernelspec": {"name": "perfkit", "display_name": "perfkit (.venv)", "language": "python"},
            "language_info": {"name": "python"},
        },
    )
    nbformat.validate(notebook)
    write_atomic(path, nbformat.writes(notebook) + "\n")
    return project.relative(path)
