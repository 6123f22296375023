"""One PNG per verdict that explains it at a glance.

This module draws what every verdict plot shares (the title, the verdict's colour, the reason
when there is nothing to plot) and calls the expectation kind's `plot` to draw the evidence
against its claim (see perfkit/experiment/records/kinds/); it is handed what it draws, never a
hypothesis. Each plot is rendered once; the ledger's smaller copy is scaled from it. The bytes
depend on the inputs only.

What every kind's plot shows, with the pieces here:
- The process is the unit of replication, so each process is drawn: its own estimate as a marker in
  its colour (the same in every panel of a plot) and its samples as a strip of dots beside it, with the
  pooled estimate and its interval above them (`rows`, `strip`, `own`, `pooled`). A process that stands
  apart is seen where it stands.
- No scale hides data (`scale_for`): every sample and estimate lies inside the axis; a log axis only when
  every value drawn is positive and they span more than a decade (or a power law is fitted); otherwise
  linear, and the label says which. An interval's end or a claim far beyond the data is drawn at the
  axis's edge with an arrow and its number (`Scale.off_axis`), so the data keeps the axis. Never a bar on
  a log axis: estimates are points with whiskers.
- Every axis of a quantity has at least three labelled ticks in plain numbers and a label with its unit
  (`readable_ticks`).
"""

from __future__ import annotations

import functools
import hashlib
import io
import math
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfkit import units
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


# ---------------------------------------------------------------- processes

#: One colour and marker per process, in replicate order, the same in every panel of a plot: none of
#: them a verdict's colour or the claim's blue.
PROCESS_COLORS = ("#7b1fa2", "#00897b", "#d81b60", "#8d6e63", "#9e9d24", "#546e7a", "#283593", "#00acc1")
PROCESS_MARKERS = ("o", "s", "^", "v", "P", "X", "h", "<")  # a pooled estimate is a diamond
POOLED = "#212121"  # a pooled estimate that is not the verdict's own (a sweep point's mean)
GOLDEN = 0.6180339887498949  # spreads a strip's samples evenly across its width, the same way every time


def process_style(i: int) -> dict[str, str]:
    """Process `i`'s colour and marker (colour and marker cycle at different rates past eight)."""
    return {
        "color": PROCESS_COLORS[i % len(PROCESS_COLORS)],
        "marker": PROCESS_MARKERS[(i + i // len(PROCESS_MARKERS)) % len(PROCESS_MARKERS)],
    }


def process_label(i: int) -> str:
    """'process 3': the fourth process the verdict rests on, in replicate order (replicate 3, under
    runs/<run-id>/executions/<key>/r3/, unless a replicate before it was left out as unfit)."""
    return f"process {i}"


@dataclass(frozen=True)
class Evidence:
    """One quantity as a plot draws it: each process's samples and own estimate, then the pooled estimate.

    All in the unit of the axis they are drawn on; `value`, `low` and `high` are the pooled estimate and its
    interval (the verdict's, or a sweep point's)."""

    samples: tuple[tuple[float, ...], ...]  # per process, in replicate order
    estimates: tuple[float, ...]  # each process's own estimate of the quantity
    value: float
    low: float
    high: float

    def shown(self) -> list[float]:
        """What an axis must hold: every sample, every process's estimate and the pooled one."""
        return [v for s in self.samples for v in s] + list(self.estimates) + [self.value]

    def reach(self) -> list[float]:
        """What an axis holds when it is near: the interval's ends (else drawn at the edge, with the number)."""
        return [self.low, self.high]


def evidence_of(samples: list[list[float]], estimates: list[float], pooled) -> Evidence:
    """Evidence from samples per process, their estimates and a pooled estimate (a Measured or stats.Estimate)."""
    return Evidence(
        samples=tuple(tuple(s) for s in samples),
        estimates=tuple(estimates),
        value=pooled.value,
        low=pooled.low,
        high=pooled.high,
    )


# ---------------------------------------------------------------- scales that cannot hide data

#: an interval's end or a claim within this many times the data's own span of it (in decades on a log axis) is
#: drawn in place; one farther is drawn at the axis's edge, with its number
REACH = 2.0
LOG_SUBS = ((1,), (1, 3), (1, 2, 5), (1, 2, 3, 5), (1, 2, 3, 4, 5, 6, 7, 8, 9))  # labelled per decade, fewest first


@dataclass(frozen=True)
class Scale:
    """One axis of a quantity: its scale and limits. Log only when every value drawn on it is positive."""

    which: str  # "x" or "y"
    log: bool
    low: float
    high: float

    def words(self) -> str:
        return "log scale" if self.log else "linear scale"

    def clip(self, value: float) -> float:
        return min(max(value, self.low), self.high)

    def inside(self, value: float) -> bool:
        return self.low <= value <= self.high

    def apply(self, ax, label: str) -> None:
        """Scale, limits, readable ticks, and the label with its unit and the scale in words."""
        (ax.set_xscale if self.which == "x" else ax.set_yscale)("log" if self.log else "linear")
        (ax.set_xlim if self.which == "x" else ax.set_ylim)(self.low, self.high)
        readable_ticks(ax, self)
        (ax.set_xlabel if self.which == "x" else ax.set_ylabel)(f"{label}, {self.words()}", fontsize=8)

    def off_axis(self, ax, value: float, at: float, text: str, color: str) -> None:
        """`value`, beyond this axis, drawn at its edge at `at` across: an arrow pointing out, and `text`
        (which says the number)."""
        out = 1 if value > self.high else -1
        edge = self.high if out > 0 else self.low
        x = self.which == "x"
        ax.annotate(
            text,
            xy=(edge, at) if x else (at, edge),
            xytext=(-out * 14, 0) if x else (0, -out * 14),
            textcoords="offset points",
            arrowprops={"arrowstyle": "->", "color": color, "lw": 1.0},
            fontsize=6.5,
            color=color,
            ha=("right" if out > 0 else "left") if x else "center",
            va="center" if x else ("top" if out > 0 else "bottom"),
            annotation_clip=False,
            gid="off-axis",
        )


def _limits(shown: list[float], reach: list[float], least: float) -> tuple[float, float]:
    """Limits around `shown`, widened to each of `reach` within REACH spans (at least `least`), padded."""
    low, high = min(shown), max(shown)
    span = max(high - low, least)
    near = [r for r in reach if low - REACH * span <= r <= high + REACH * span]
    low, high = min([low, *near]), max([high, *near])
    pad = 0.05 * max(high - low, least)
    return low - pad, high + pad


def scale_for(which: str, shown: list[float], reach: list[float] = (), *, power: bool = False) -> Scale:
    """The axis for `shown` (every sample and estimate: always inside) and `reach` (interval ends, claims:
    inside when near). Log when every value is positive and they span more than a decade (or, with
    `power`, a power law's axis, whatever the span); linear otherwise."""
    shown = [v for v in shown if math.isfinite(v)]
    reach = [v for v in reach if math.isfinite(v)]
    if all(v > 0 for v in shown + reach):
        low, high = _limits([math.log10(v) for v in shown], [math.log10(v) for v in reach], 0.1)
        if power or high - low > 1:
            return Scale(which, True, 10**low, 10**high)
    least = 0.1 * max(abs(v) for v in shown) or 1.0  # every value the same: a tenth of it either side
    low, high = _limits(shown, reach, least)
    return Scale(which, False, low, high)


def _tick_values(scale: Scale, most: int) -> list[float]:
    """Three to `most` values to label, in plain numbers: decades, then 1-3, 1-2-5 and finer on a log axis
    (a log axis of many decades labels every second or third of them)."""
    from matplotlib.ticker import MaxNLocator

    low, high = scale.low, scale.high
    if scale.log:
        decades = range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)
        options = [[s * 10.0**d for d in decades for s in subs if low <= s * 10.0**d <= high] for subs in LOG_SUBS]
        for ticks in options[:-1]:  # four or more, while every label still has room (2, 3 and 5 in a decade)
            if 4 <= len(ticks) <= most:
                return ticks
        for ticks in options:
            if 3 <= len(ticks) <= most:
                return ticks
        dense = next((ticks for ticks in options if len(ticks) >= 3), None)
        if dense is not None:  # more than there is room for: every second (third, ...) of them
            return dense[:: math.ceil(len(dense) / most)]
    found = MaxNLocator(nbins=max(2, min(5, most - 1)), steps=[1, 2, 2.5, 5, 10], min_n_ticks=3).tick_values(low, high)
    span = high - low
    return [0.0 if abs(t) < span * 1e-9 else float(t) for t in found if low - span * 1e-9 <= t <= high + span * 1e-9]


#: room a tick label needs along its axis, in inches ('1,000' at 7 points, and a gap)
LABEL_ROOM = {"x": 0.42, "y": 0.22}


def readable_ticks(ax, scale: Scale, ticks: list[float] | None = None) -> None:
    """Labelled ticks on a quantity's axis written as the ledger writes numbers ('10,000', '0.052', never
    '2e+04' or an offset), with as many digits as it takes for each label to say its tick's value and no two
    to read the same ('8.25', not '8.2'), as many as the axis has room for. `ticks`: where they go, when not
    where the scale puts them."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter, NullLocator

    axis = ax.xaxis if scale.which == "x" else ax.yaxis
    box = ax.get_position()
    length = box.width * ax.figure.get_figwidth() if scale.which == "x" else box.height * ax.figure.get_figheight()
    ticks = _tick_values(scale, max(3, int(length / LABEL_ROOM[scale.which]))) if ticks is None else ticks
    span = scale.high - scale.low
    for digits in (2, 3, 4, 5, 6, 7):
        words = [units.format_number(t, digits) for t in ticks]
        faithful = all(abs(float(w.replace(",", "")) - t) <= span * 1e-6 for w, t in zip(words, ticks))
        if faithful and len(set(words)) == len(words):
            break
    axis.set_major_locator(FixedLocator(ticks))
    axis.set_major_formatter(FuncFormatter(lambda v, _pos, d=digits: units.format_number(v, d)))
    axis.set_minor_locator(LogLocator(subs="auto") if scale.log and len(ticks) < 4 else NullLocator())
    axis.set_minor_formatter(NullFormatter())
    ax.tick_params(axis=scale.which, which="both", labelsize=7)


# ---------------------------------------------------------------- drawing the evidence


def strip(ax, scale: Scale, samples: list[float], across: list[float], i: int) -> None:
    """Process `i`'s samples as dots at `across` on the other axis (a strip, evenly spread): larger and
    stronger when there are few, so five samples are seen and two thousand do not blot out the rest."""
    values = [scale.clip(v) for v in samples]
    xy = (values, across) if scale.which == "x" else (across, values)
    size = min(9.0, max(1.5, 25.0 / math.sqrt(max(len(values), 1))))
    alpha = 0.75 if len(values) <= 50 else 0.4
    color = process_style(i)["color"]
    ax.scatter(*xy, s=size, marker="o", linewidths=0, alpha=alpha, color=color, zorder=2, gid=f"samples {i}")


def spread(count: int, width: float) -> list[float]:
    """`count` offsets within ±width/2, evenly spread (the same for the same count)."""
    return [((k * GOLDEN) % 1.0 - 0.5) * width for k in range(count)]


def own(ax, scale: Scale, value: float, at: float, i: int) -> None:
    """Process `i`'s own estimate: its marker, in its colour."""
    xy = ([scale.clip(value)], [at]) if scale.which == "x" else ([at], [scale.clip(value)])
    style = process_style(i)
    ax.plot(
        *xy,
        linestyle="none",
        markersize=6.5,
        markeredgecolor="#212121",
        markeredgewidth=0.6,
        zorder=4,
        gid=f"process {i}",
        **style,
    )


def pooled(ax, scale: Scale, estimate, at: float, color: str, label: str) -> None:
    """A pooled estimate and its interval at `at`; an end beyond the axis drawn at its edge, with its number."""
    value, low, high = scale.clip(estimate.value), scale.clip(estimate.low), scale.clip(estimate.high)
    err = [[max(value - low, 0.0)], [max(high - value, 0.0)]]
    xy = ([value], [at]) if scale.which == "x" else ([at], [value])
    bars = {"xerr": err} if scale.which == "x" else {"yerr": err}
    ax.errorbar(*xy, **bars, fmt="D", color=color, markersize=6, capsize=5, zorder=5, label=label, gid="pooled")
    for end in (estimate.low, estimate.high, estimate.value):
        if not scale.inside(end):
            scale.off_axis(ax, end, at, units.format_number(end), color)


def rows(ax, scale: Scale, evidence: Evidence, top: float = 0.0) -> list[float]:
    """Each process on a row below `top` (where its pooled estimate goes): its samples in a strip around
    its own estimate. The rows' positions, `top` first; the axis across is read downwards."""
    for i, (samples, estimate) in enumerate(zip(evidence.samples, evidence.estimates)):
        strip(ax, scale, list(samples), [top + i + 1 + o for o in spread(len(samples), 0.55)], i)
        own(ax, scale, estimate, top + i + 1, i)
    return [top] + [top + i + 1.0 for i in range(len(evidence.estimates))]


def row_labels(ax, positions: list[float], first: str) -> None:
    """Name the rows: the pooled one `first`, then 'process 0', 'process 1', ..., read from the top."""
    ax.set_yticks(positions, [first] + [process_label(i) for i in range(len(positions) - 1)], fontsize=7)
    ax.set_ylim(positions[-1] + 0.7, positions[0] - 0.7)


@dataclass(frozen=True)
class Claim:
    """What the claim says on an axis: a value (a bound, an expected value) or a band, and its words."""

    value: float
    text: str
    band: tuple[float, float] | None = None
    style: str = "--"


def claim(ax, scale: Scale, c: Claim, at: float) -> None:
    """The claim across the axes; one beyond the axis at its edge (at `at`), with its number."""
    line = ax.axvline if scale.which == "x" else ax.axhline
    span = ax.axvspan if scale.which == "x" else ax.axhspan
    if c.band is not None and c.band[0] <= scale.high and c.band[1] >= scale.low:
        span(scale.clip(c.band[0]), scale.clip(c.band[1]), color="#bbdefb", alpha=0.6, zorder=0)
    if scale.inside(c.value):
        line(c.value, color=CLAIMED, linestyle=c.style, linewidth=1.2, label=c.text, zorder=1)
    else:
        scale.off_axis(ax, c.value, at, c.text, CLAIMED)


ABOVE = -0.45  # where a claim beyond the axis is said: above the pooled estimate's row, at the top


def legend(fig, axes: list, ncol: int = 4) -> None:
    """One legend under the axes, inside the figure: what the axes labelled (each once), then what every
    plot draws (a process's samples and its own estimate, in its colour)."""
    from matplotlib.lines import Line2D

    said: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            said.setdefault(label, handle)
    said["samples (a dot each)"] = Line2D([], [], linestyle="none", marker="o", color="#78909c", markersize=3)
    said["a process's own estimate"] = Line2D(
        [], [], linestyle="none", marker="o", color="#b0bec5", markeredgecolor="#212121", markersize=6
    )
    handles, labels = list(said.values()), list(said)
    fig.legend(handles, labels, fontsize=6.5, loc="lower center", bbox_to_anchor=(0.5, 0.0), ncol=ncol, frameon=False)


def _title(fig, title: str, j: Judgement, source: str | None) -> None:
    fig.suptitle(
        f"{title}: {j.verdict.value}", color=COLORS[j.verdict], fontsize=11, fontweight="bold", x=0.02, ha="left"
    )
    if source:  # the run and machine the measurement stands on: a ledger's rows may stand on several
        fig.text(0.98, 0.975, source, fontsize=6.5, ha="right", va="top", color="#616161")
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
DRAWING_KEY = "perfkit-drawing"  # ... and the one naming the drawing code that drew it (`drawing`)


@functools.lru_cache(maxsize=1)
def drawing() -> str:
    """The drawing code's version, in 12 hex digits: a hash of this module and the kinds' (which draw each
    kind's evidence). A plot drawn by other code is redrawn by `perfkit ledger` from its run's samples."""
    here = Path(__file__).resolve()
    sources = [here, *sorted((here.parent / "kinds").glob("*.py"))]
    digest = hashlib.sha256()
    for path in sources:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def render(
    title: str,
    j: Judgement,
    points: list[Point],
    draw: Draw,
    *,
    stamp: str | None = None,
    source: str | None = None,
) -> bytes:
    """The verdict's plot as PNG bytes: the title and the verdict's line, then `draw` (the kind's plot).
    `stamp` goes into the PNG, so a plot can be told apart from its row after a merge took one side's;
    `source` ("run 20261207-153150 on host") is written in the corner."""
    fig = figure()
    _title(fig, title, j, source)
    if j.measured is None or not j.used:
        _text_plot(fig, j)
    else:
        draw(fig, j, points)
    buffer = io.BytesIO()
    metadata = {"Software": None, DRAWING_KEY: drawing(), **({STAMP_KEY: stamp} if stamp else {})}
    fig.savefig(buffer, format="png", dpi=DPI, metadata=metadata)
    return buffer.getvalue()


def stamp_of(png_path: Path) -> str | None:
    """The stamp a plot carries (None: none, or not a PNG perfkit can read)."""
    return _text_of(png_path).get(STAMP_KEY)


def drawn_with(png_path: Path) -> str | None:
    """The drawing code's version a plot was drawn by (None: drawn before plots said, or unreadable)."""
    return _text_of(png_path).get(DRAWING_KEY)


def _text_of(png_path: Path) -> dict[str, str]:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(png_path) as image:
            return dict(getattr(image, "text", {}))
    except (OSError, UnidentifiedImageError, ValueError):
        return {}


def scaled(png: bytes, factor: float) -> bytes:
    """The same plot, `factor` times the size, in 256 colours: the ledger's copy, small to commit, not drawn again."""
    from PIL import Image
    from PIL.PngImagePlugin import PngInfo

    with Image.open(io.BytesIO(png)) as image:
        size = (max(1, round(image.width * factor)), max(1, round(image.height * factor)))
        small = image.convert("RGB").resize(size, Image.Resampling.LANCZOS)
        info = PngInfo()
        for key in (DRAWING_KEY, STAMP_KEY):  # the copy says what it was drawn from, and by what, too
            if key in getattr(image, "text", {}):
                info.add_text(key, image.text[key])
    buffer = io.BytesIO()
    small.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(buffer, format="PNG", optimize=True, pnginfo=info)
    return buffer.getvalue()


def write_plot(path: Path, png: bytes) -> Path:
    """Write a rendered plot to `path` (atomically)."""
    write_atomic(Path(path), png)
    return Path(path)
