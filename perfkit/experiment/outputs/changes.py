"""`perfkit history ID` (a hypothesis's series per machine kind, printed and drawn) and `perfkit changes`
(the change points across the ledger, one line each, the most severe first)."""

from __future__ import annotations

import io
import itertools
from pathlib import Path

from perfkit import stats
from perfkit.errors import UserError
from perfkit.experiment.records import plots
from perfkit.experiment.records.hypothesis import load_hypotheses
from perfkit.experiment.records.results import RunResults
from perfkit.experiment.records.series import Change, Series, all_changes, changes, series_of
from perfkit.paths import Project
from perfkit.text import one_line

SHOWN_CHANGED = 160  # characters of a run's "what changed" shown beside a change


def _commit(commit: str | None, dirty: bool | None) -> str:
    return "no commit" if not commit else commit[:10] + ("+" if dirty else "")


def change_line(c: Change) -> str:
    """One line: where, how far, the first run after it, its commit, whether the verdict flipped, and
    what that run said had changed."""
    s, first = c.series, c.first
    parts = [
        f"{s.hypothesis}: {s.quantity} {c.words()} at run {first.run_id} ({_commit(first.commit, first.dirty)})",
        f"on {s.machine}",
        c.status if c.status == "confirmed" else f"{c.status}: {c.why}",
    ]
    if c.flipped():
        parts.append(f"verdict {c.flipped()}")
    if first.changed:
        said = one_line(first.changed)
        parts.append("with: " + (said[:SHOWN_CHANGED] + "..." if len(said) > SHOWN_CHANGED else said))
    return "; ".join(parts)


def changes_text(all_results: list[RunResults], since: str | None) -> tuple[str, int]:
    """`perfkit changes`: the text and how many confirmed changes it names."""
    found = all_changes(all_results, since=since)
    if not found:
        return f"no change points{' since run ' + since if since else ''} in {len(all_results)} runs\n", 0
    return "\n".join(change_line(c) for c in found) + "\n", sum(c.status == "confirmed" for c in found)


def _series_for(project: Project, all_results: list[RunResults], hid: str) -> list[Series]:
    found = series_of(all_results, hid)
    if not found:
        known = {s.hypothesis for s in series_of(all_results)}
        if hid not in known and hid not in {h.id for h in load_hypotheses(project)}:
            raise UserError(f"no such hypothesis: {hid} (known: {', '.join(sorted(known)) or 'none'})")
        raise UserError(f"{hid} has no measurement in the stored results yet: run `perfkit run {hid}`")
    return found


def history_text(project: Project, all_results: list[RunResults], hid: str) -> str:
    """Each series of `hid`: a row per run (its commit, verdict and measured interval), its change points
    marked; then, measured on several machine kinds, whether their latest segments agree."""
    lines = []
    found = _series_for(project, all_results, hid)
    for s in found:
        at = {c.index: c for c in changes(s)}
        lines += [f"{s.hypothesis}: {s.quantity} on {s.machine}, {len(s.points)} runs", ""]
        lines.append(f"  {'run':<15}  {'commit':<11}  {'verdict':<12}  measured [interval]")
        for i, p in enumerate(s.points):
            if i in at:
                lines.append(f"  --- change: {at[i].words()}, {at[i].status} ({at[i].why}) ---")
            lines.append(
                f"  {p.run_id:<15}  {_commit(p.commit, p.dirty):<11}  {p.verdict:<12}  {p.measured.text(level=True)}"
            )
        lines.append("")
    lines += machines_disagree(found)
    return "\n".join(lines).rstrip("\n") + "\n"


def machines_disagree(found: list[Series]) -> list[str]:
    """For a quantity measured on several machine kinds: each pair whose latest segments (the runs after
    their last change point) differ beyond the runs' interval, in words; one line saying they agree else."""
    by_quantity: dict[str, list[tuple[Series, list[float]]]] = {}
    for s in found:
        cut = max([0, *(c.index for c in changes(s) if c.status == "confirmed")])
        latest = [p.measured.value for p in s.points[cut:]]
        if len(latest) >= 2:
            by_quantity.setdefault(s.quantity, []).append((s, latest))
    said = []
    for quantity, measured in sorted(by_quantity.items()):
        if len(measured) < 2:
            continue
        apart = []
        for (a, va), (b, vb) in itertools.combinations(measured, 2):
            log = a.log and b.log
            moved = stats.between_groups(va, vb, log=log)
            nothing = 1.0 if log else 0.0
            if not moved.low <= nothing <= moved.high:
                if log:
                    far = f"{(moved.value - 1) * 100:+.1f}% [{(moved.low - 1) * 100:.1f}, {(moved.high - 1) * 100:.1f}]"
                else:
                    far = f"{moved.value:+.3g} [{moved.low:.3g}, {moved.high:.3g}]"
                apart.append(f"{b.machine} is {far} against {a.machine}")
        what = f"{quantity} on {len(measured)} machine kinds (each one's runs since its last change)"
        said.append(f"{what}: " + ("; ".join(apart) if apart else "they agree within the runs' intervals"))
    return said


def _edges(project: Project, hid: str) -> tuple[float | None, float | None]:
    try:
        (h,) = [h for h in load_hypotheses(project, [hid])]
    except (UserError, ValueError):  # the record is gone or malformed: the series is drawn without its bound
        return None, None
    return h.expect.edges()


def history_png(project: Project, all_results: list[RunResults], hid: str) -> bytes:
    """The series of `hid` drawn: each run's estimate and interval in run order, the claim's bound, the
    change points marked; one panel per machine kind."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FormatStrFormatter

    found = _series_for(project, all_results, hid)
    low_edge, high_edge = _edges(project, hid)
    fig, axes = plt.subplots(len(found), 1, figsize=(7.2, 2.4 * len(found) + 0.6), squeeze=False, sharex=False)
    for ax, s in zip(axes[:, 0], found):
        xs = list(range(len(s.points)))
        values = [p.measured.value for p in s.points]
        below = [p.measured.value - p.measured.low for p in s.points]
        above = [p.measured.high - p.measured.value for p in s.points]
        colors = ["#2e7d32" if p.verdict == "confirmed" else "#c62828" if p.verdict == "refuted" else "#757575"
                  for p in s.points]  # fmt: skip
        ax.errorbar(xs, values, yerr=[below, above], fmt="none", ecolor="#9e9e9e", elinewidth=1, capsize=2)
        ax.scatter(xs, values, c=colors, s=14, zorder=3)
        for edge, word in ((low_edge, "at least"), (high_edge, "at most")):
            if edge is not None and s.quantity.startswith(("mean", "speedup", "share", "exponent", "ratio")):
                ax.axhline(edge, color="#1565c0", linestyle="--", linewidth=1, label=f"claim: {word} {edge:g}")
        for c in changes(s):
            if c.status == "not confirmed":
                continue
            ax.axvline(c.index - 0.5, color="#ef6c00", linewidth=1.5, linestyle="-" if c.status == "confirmed" else ":")
            ax.annotate(f"{c.words().split(' [')[0]} ({c.status})", (c.index - 0.5, 1.0),
                        xycoords=("data", "axes fraction"), fontsize=7, color="#ef6c00",
                        ha="left", va="top", xytext=(3, -2), textcoords="offset points")  # fmt: skip
        if s.log:
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
            ax.yaxis.set_minor_formatter(FormatStrFormatter("%g"))
        step = max(1, -(-len(xs) // 4))  # four run ids at most: they are long
        ax.set_xticks(xs[::step], [s.points[i].run_id for i in xs[::step]], fontsize=7)
        ax.set_xlim(-0.7, len(xs) - 0.3)
        ax.set_ylabel(s.points[0].measured.unit or s.quantity.split(" (")[0], fontsize=8)
        ax.set_title(plots.wrap(f"{s.quantity} on {s.machine}", 90), fontsize=8, loc="left")
        ax.tick_params(axis="y", which="both", labelsize=7)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="best", framealpha=0.6)
    fig.suptitle(f"{hid}: every run's estimate and interval (green confirmed, red refuted, grey neither)",
                 fontsize=9)  # fmt: skip
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=plots.DPI, metadata={"Software": None})
    plt.close(fig)
    return buffer.getvalue()


def write_history_plot(project: Project, all_results: list[RunResults], hid: str, out: Path) -> Path:
    return plots.write_plot(out, history_png(project, all_results, hid))
