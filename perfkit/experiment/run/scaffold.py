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
from perfkit.text import one_line

NAME = re.compile(r"[a-z][a-z0-9_]{0,59}")  # 60 at most: a cell id (name-N) has 64 characters at most

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
perfkit.record("{metric}", [s * 1e3 for s in samples], unit="ms", at={{"n": n}})
# the CPU this process spent per call: another job on the machine does not add to it while the probe has a core
cpu = perfkit.bench(work, warmup=0, repeat=repeat, clock="cpu")
perfkit.record("{metric}_cpu", [s * 1e3 for s in cpu], unit="cpu_ms", at={{"n": n}})"""

_PLOT = """fig, ax = plt.subplots(figsize=(6, 2.5))
ax.plot([s * 1e3 for s in samples], "o-")
ax.set_xlabel("repetition")
ax.set_ylabel("ms per call")
ax.set_title(f"{metric}, n={{n:,}}", fontsize=9)
fig.tight_layout()
plt.show()"""


def probe_notebook(parameters: str, *code: str, intro: str | None = None):
    """A probe notebook on the `perfkit` kernel: an intro (markdown) if given, the cell tagged
    `parameters`, then the code cells."""
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

    cells = [new_markdown_cell(intro)] if intro is not None else []
    cells += [new_code_cell(parameters, metadata={"tags": ["parameters"]}), *(new_code_cell(c) for c in code)]
    return new_notebook(
        cells=cells,
        metadata={
            "kernelspec": {"name": "perfkit", "display_name": "perfkit (.venv)", "language": "python"},
            "language_info": {"name": "python"},
        },
    )


def new_probe(project: Project, name: str) -> str:
    """Write notebooks/NAME.ipynb; returns its path relative to the project. Never overwrites."""
    import nbformat

    if not NAME.fullmatch(name):
        raise UserError(
            f"probe name {one_line(name[:80])!r}{'...' if len(name) > 80 else ''}: use at most 60 lowercase "
            "letters, digits and underscores, starting with a letter"
        )
    path = project.notebooks_dir / f"{name}.ipynb"
    if path.exists():
        raise UserError(f"{project.relative(path)} already exists; pick another name or edit that notebook")
    metric = name
    notebook = probe_notebook(
        _PARAMETERS,
        _SETUP,
        _MEASURE.format(metric=metric),
        _PLOT.format(metric=metric),
        intro=_INTRO.format(name=name, metric=metric),
    )
    for i, cell in enumerate(notebook.cells):
        cell["id"] = f"{name.replace('_', '-')}-{i}"  # the same notebook for the same name
    nbformat.validate(notebook)
    write_atomic(path, nbformat.writes(notebook) + "\n")
    return project.relative(path)
