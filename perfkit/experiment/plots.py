"""One PNG per verdict that explains it at a glance.

Value claims show the measured interval (and the samples) against the expected value or bound,
on a log axis when they are more than 10x apart; scaling claims show the sweep with the fitted
and the expected slopes; share claims stack the step breakdown in phase order with the claimed
phase highlighted and the unattributed remainder as its own bar, never folded into a phase.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

from perfkit import stats, units
from perfkit.experiment.hypothesis import Hypothesis
from perfkit.files import write_atomic
from perfkit.phases import BREAKDOWN, STEP, UNATTRIBUTED
from perfkit.experiment.verdict import Judgement, Point, Verdict

COLORS = {
    Verdict.CONFIRMED: "#2e7d32",
    Verdict.REFUTED: "#c62828",
    Verdict.INCONCLUSIVE: "#ef6c00",
    Verdict.ERROR: "#616161",
}
_PHASE_COLORS = ("#9ecae1", "#a1d99b", "#fdae6b", "#bcbddc", "#fdd0a2", "#c7e9c0")
_CLAIMED = "#1565c0"


def _figure(width: float = 6.4, height: float = 3.6):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def _title(fig, h: Hypothesis, j: Judgement) -> None:
    fig.suptitle(f"{h.id}: {j.verdict.value}", color=COLORS[j.verdict], fontsize=11, fontweight="bold", x=0.02, ha="left")
    text = j.line() if j.measured is not None else (j.reason or "")
    fig.text(0.02, 0.885, _wrap(text, 110), fontsize=7.5, ha="left", va="top", color="#333333")


def _wrap(text: str, width: int) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width)[:3])


def _log_if_spread(ax, values: list[float], axis: str) -> None:
    positive = [v for v in values if v > 0 and math.isfinite(v)]
    if len(positive) >= 2 and max(positive) / min(positive) > 10:
        (ax.set_xscale if axis == "x" else ax.set_yscale)("log")


def _value_plot(fig, h: Hypothesis, j: Judgement) -> None:
    e, m = h.expect, j.measured
    ax = fig.add_axes((0.08, 0.2, 0.88, 0.5))
    samples = units.convert(list(j.used[0].record.samples), j.used[0].record.unit, e.unit)
    ax.plot(samples, [0.0] * len(samples), "|", color="#90a4ae", markersize=14, label="samples")
    ax.errorbar([m.value], [0.0], xerr=[[m.value - m.low], [m.high - m.value]], fmt="o",
                color=COLORS[j.verdict], capsize=6, label="mean, 95% interval")
    reference = j.floor.value if j.floor else e.value
    marks = [m.low, m.high, reference] + samples
    if e.kind == "cost":
        low, high = reference / e.factor, reference * e.factor
        ax.axvspan(low, high, color="#bbdefb", alpha=0.6, label=f"expected ±×{units.format_number(e.factor)}")
        ax.axvline(reference, color=_CLAIMED, linestyle="--", label=f"expected {units.format_quantity(reference, e.unit)}")
        marks += [low, high]
    else:
        bound = reference * (e.factor or 1.0)
        ax.axvline(bound, color=_CLAIMED, linestyle="--",
                   label=f"bound {'≤' if e.kind == 'at_most' else '≥'} {units.format_quantity(bound, e.unit)}")
        marks.append(bound)
    _log_if_spread(ax, marks, "x")
    ax.set_yticks([])
    ax.set_ylim(-1, 1)
    ax.set_xlabel(f"{e.metric} [{e.unit}]")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=4, frameon=False)


def _breakdown_points(j: Judgement, points: list[Point]) -> list[tuple[str, float]]:
    part = j.used[0]
    if part.record.breakdown is None:
        whole = j.used[1]
        part_mean = sum(part.record.samples) / len(part.record.samples)
        scale = units.factor(whole.record.unit, part.record.unit)
        whole_mean = sum(whole.record.samples) / len(whole.record.samples) * scale
        return [(part.record.name, part_mean), (f"rest of {whole.record.name}", max(whole_mean - part_mean, 0.0))]
    same = {p.record.name: p.record for p in points if p.at == part.at and p.record.breakdown == part.record.breakdown}
    out = []
    for name in BREAKDOWN:
        if name in same and same[name].samples:
            values = units.convert(list(same[name].samples), same[name].unit, part.record.unit)
            out.append((name, sum(values) / len(values)))
    return out


def _share_plot(fig, h: Hypothesis, j: Judgement, points: list[Point]) -> None:
    e = h.expect
    parts = _breakdown_points(j, points)
    total = sum(v for _, v in parts) or 1.0
    ax = fig.add_axes((0.08, 0.3, 0.88, 0.36))
    left = 0.0
    for i, (name, value) in enumerate(parts):
        share = value / total
        claimed = name == e.metric
        color = _CLAIMED if claimed else ("#ffffff" if name == UNATTRIBUTED else _PHASE_COLORS[i % len(_PHASE_COLORS)])
        ax.barh([0], [share], left=left, color=color, edgecolor="#37474f", linewidth=1.5 if claimed else 0.6,
                hatch="//" if name == UNATTRIBUTED else None, label=f"{name} {share:.1%}")
        left += share
    for bound, style in ((e.at_least, "--"), (e.at_most, ":")):
        if bound is not None:
            ax.axvline(bound, color=COLORS[j.verdict], linestyle=style, linewidth=1.5)
            ax.text(bound, 0.55, f" claimed {'≥' if style == '--' else '≤'} {bound:.0%}", fontsize=7, color=COLORS[j.verdict])
    ax.set_xlim(0, 1)
    ax.set_yticks([])
    unit = j.used[0].record.unit
    of = e.of if e.of != STEP else "step"
    ax.set_xlabel(f"share of {of} (mean {units.format_quantity(total, unit)}); claimed part: {e.metric}")
    ax.legend(fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=4, frameon=False)


def _scaling_plot(fig, h: Hypothesis, j: Judgement) -> None:
    e = h.expect
    from matplotlib.ticker import LogFormatter

    ax = fig.add_axes((0.13, 0.16, 0.55, 0.62))
    xs, means, lows, highs = [], [], [], []
    for p in j.used:
        est = stats.mean_interval(list(p.record.samples), seed=stats.seed_for(p.record.name))
        xs.append(float(p.at[e.over]))
        means.append(est.value)
        lows.append(est.value - est.low)
        highs.append(est.high - est.value)
    unit = j.used[0].record.unit
    ax.errorbar(xs, means, yerr=[lows, highs], fmt="o", color="#37474f", capsize=3, label="measured (95%)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    anchor_x = math.exp(sum(math.log(x) for x in xs) / len(xs))
    anchor_y = math.exp(sum(math.log(y) for y in means) / len(means))
    span = [min(xs), max(xs)]
    fitted = j.measured.value
    ax.plot(span, [anchor_y * (x / anchor_x) ** fitted for x in span], color=COLORS[j.verdict],
            label=f"fitted k = {units.format_number(fitted)} [{units.format_number(j.measured.low)}, {units.format_number(j.measured.high)}]")
    ax.plot(span, [anchor_y * (x / anchor_x) ** e.exponent for x in span], color=_CLAIMED, linestyle="--",
            label=f"expected k = {units.format_number(e.exponent)} ± {units.format_number(e.tolerance)}")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(LogFormatter(labelOnlyBase=False))
        axis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))
    ax.tick_params(labelsize=7, which="both")
    ax.set_xlabel(e.over)
    ax.set_ylabel(f"{e.metric} [{unit}]", fontsize=8)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)


def _speedup_plot(fig, h: Hypothesis, j: Judgement) -> None:
    e = h.expect
    ax = fig.add_axes((0.25, 0.2, 0.5, 0.55))
    base, cand = j.used
    unit = base.record.unit
    names, values, errs = [], [], [[], []]
    for p in (base, cand):
        samples = units.convert(list(p.record.samples), p.record.unit, unit)
        est = stats.mean_interval(samples, seed=stats.seed_for(p.record.name))
        names.append(p.record.name)
        values.append(est.value)
        errs[0].append(est.value - est.low)
        errs[1].append(est.high - est.value)
    ax.barh(names, values, xerr=errs, color=["#b0bec5", COLORS[j.verdict]], capsize=4)
    _log_if_spread(ax, values, "x")
    ax.set_xlabel(f"mean [{unit}]")
    claim = " and ".join(f"{s} {units.format_factor(v)}" for s, v in (("≥", e.at_least), ("≤", e.at_most)) if v is not None)
    ax.set_title(f"speedup {units.format_factor(j.measured.value)}; claimed {claim}", fontsize=8)


def _text_plot(fig, j: Judgement) -> None:
    ax = fig.add_axes((0.05, 0.1, 0.9, 0.6))
    ax.axis("off")
    ax.text(0.0, 0.6, _wrap(f"no measurement to plot: {j.reason}", 90), fontsize=9, color=COLORS[j.verdict], va="top")


def plot_verdict(h: Hypothesis, j: Judgement, points: list[Point], path: Path, *, dpi: int = 100) -> Path:
    """Draw the verdict's plot and write it to `path` (atomically)."""
    fig = _figure()
    _title(fig, h, j)
    if j.measured is None or not j.used:
        _text_plot(fig, j)
    elif h.expect.kind in ("cost", "at_most", "at_least"):
        _value_plot(fig, h, j)
    elif h.expect.kind == "share":
        _share_plot(fig, h, j, points)
    elif h.expect.kind == "scaling":
        _scaling_plot(fig, h, j)
    else:
        _speedup_plot(fig, h, j)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, metadata={"Software": None})
    write_atomic(Path(path), buffer.getvalue())
    return Path(path)
