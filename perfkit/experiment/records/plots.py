"""One PNG per verdict that explains it at a glance.

This module draws what every verdict plot shares (the title, the verdict's colour, the reason
when there is nothing to plot) and calls the expectation kind's `plot` to draw the evidence
against its claim (see perfkit/experiment/records/kinds/); it is handed what it draws, never a
hypothesis. Each plot is rendered once; the ledger's smaller copy is scaled from it. The bytes
depend on the inputs only.
"""

from __future__ import annotations

import io
import math
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

from perfkit.experiment.records.verdict import Judgement, Point, Verdict
from perfkit.files import write_atomic

COLORS = {
    Verdict.CONFIRMED: "#2e7d32",
    Verdict.REFUTED: "#c62828",
    Verdict.INCONCLUSIVE: "#ef6c00",
    Verdict.ERROR: "#616161",
}
PHASE_COLORS = ("#9ecae1", "#a1d99b", "#fdae6b", "#bcbddc", "#fdd0a2", "#c7e9c0")
CLAIMED = "#1565c0"  # the claim: expected value, bound, claimed phase


def figure(width: float = 6.4, height: float = 3.6):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def wrap(text: str, width: int) -> str:
    return "\n".join(textwrap.wrap(text, width)[:3])


def log_if_spread(ax, values: list[float], axis: str) -> None:
    """A log axis when the values drawn on it are more than 10x apart."""
    positive = [v for v in values if v > 0 and math.isfinite(v)]
    if len(positive) >= 2 and max(positive) / min(positive) > 10:
        (ax.set_xscale if axis == "x" else ax.set_yscale)("log")


def log_ticks(ax, which: str) -> None:
    """Tick labels on a log axis written as the ledger writes numbers ('10,000', '0.052', never '2e+04'),
    with as many digits as it takes for no two labels to read the same."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    from perfkit import units

    axis = ax.xaxis if which == "x" else ax.yaxis
    low, high = sorted(ax.get_xlim() if which == "x" else ax.get_ylim())
    for digits in (2, 3, 4, 5, 6):
        ticks = [t for t in axis.get_majorticklocs() if low <= t <= high]
        minor = [t for t in axis.get_minorticklocs() if low <= t <= high] if high / low < 10 else []
        words = [units.format_number(t, digits) for t in ticks + minor]
        if len(set(words)) == len(words):
            break
    axis.set_major_formatter(FuncFormatter(lambda v, _pos, d=digits: units.format_number(v, d)))
    if high / low < 10:  # less than a decade: the minor ticks carry the labels
        axis.set_minor_formatter(FuncFormatter(lambda v, _pos, d=digits: units.format_number(v, d)))
    else:
        axis.set_minor_formatter(NullFormatter())


def _title(fig, title: str, j: Judgement) -> None:
    fig.suptitle(
        f"{title}: {j.verdict.value}", color=COLORS[j.verdict], fontsize=11, fontweight="bold", x=0.02, ha="left"
    )
    text = j.line() if j.measured is not None else (j.reason or "")
    fig.text(0.02, 0.885, wrap(text, 110), fontsize=7.5, ha="left", va="top", color="#333333")


def _text_plot(fig, j: Judgement) -> None:
    ax = fig.add_axes((0.05, 0.1, 0.9, 0.6))
    ax.axis("off")
    ax.text(0.0, 0.6, wrap(f"no measurement to plot: {j.reason}", 90), fontsize=9, color=COLORS[j.verdict], va="top")


#: How an expectation kind draws its evidence against its claim: (figure, judgement, points).
Draw = Callable[[Any, Judgement, list[Point]], None]
DPI = 150  # the plot under runs/<run-id>/plots/; the ledger's copy is scaled from it (LEDGER_DPI)
LEDGER_DPI = 100


STAMP_KEY = "perfkit-result"  # the PNG text chunk naming the result a plot was drawn from (results.stamp)


def render(
    title: str, j: Judgement, points: list[Point], draw: Draw, *, dpi: int = DPI, stamp: str | None = None
) -> bytes:
    """The verdict's plot as PNG bytes: the title and the verdict's line, then `draw` (the kind's plot).
    `stamp` goes into the PNG, so a plot can be told apart from its row after a merge took one side's."""
    fig = figure()
    _title(fig, title, j)
    if j.measured is None or not j.used:
        _text_plot(fig, j)
    else:
        draw(fig, j, points)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, metadata={"Software": None, **({STAMP_KEY: stamp} if stamp else {})})
    return buffer.getvalue()


def stamp_of(png_path: Path) -> str | None:
    """The stamp a plot carries (None: none, or not a PNG perfkit can read)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(png_path) as image:
            return getattr(image, "text", {}).get(STAMP_KEY)
    except (OSError, UnidentifiedImageError, ValueError):
        return None


def scaled(png: bytes, factor: float) -> bytes:
    """The same plot, `factor` times the size, in 256 colours: the ledger's copy, small to commit, not drawn again."""
    from PIL import Image
    from PIL.PngImagePlugin import PngInfo

    with Image.open(io.BytesIO(png)) as image:
        size = (max(1, round(image.width * factor)), max(1, round(image.height * factor)))
        small = image.convert("RGB").resize(size, Image.Resampling.LANCZOS)
        info = PngInfo()
        if STAMP_KEY in getattr(image, "text", {}):
            info.add_text(STAMP_KEY, image.text[STAMP_KEY])  # the copy says what it was drawn from too
    buffer = io.BytesIO()
    small.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(buffer, format="PNG", optimize=True, pnginfo=info)
    return buffer.getvalue()


def write_plot(path: Path, png: bytes) -> Path:
    """Write a rendered plot to `path` (atomically)."""
    write_atomic(Path(path), png)
    return Path(path)
