"""A bisect written out: the commits measured as a table, the culprits, markdown for a pull request, a plot."""

from __future__ import annotations

import io

from perfkit.experiment.bisect.measure import Bisected
from perfkit.experiment.outputs.words import cell, code

VERDICT_WORDS = {
    "found": "found where it changed",
    "no change": "no change found",
    "undecided": "undecided",
    "unmeasured": "could not measure an end",
    "interrupted": "interrupted",
}
HEADERS = ("commit", "subject", "verdict", "measured [interval]", "replicates")


def rows(b: Bisected) -> list[tuple[str, str, str, str, str]]:
    """(short sha, subject, verdict, measured [interval] or why not, replicates) of each commit measured."""
    out = []
    for i, commit in enumerate(b.commits):
        p = b.outcome.points.get(i)
        if p is None:
            continue
        r = p.result
        verdict = "skipped" if p.skipped else r.verdict
        shown = p.skipped if p.skipped else r.measured.text(level=True)
        out.append((commit.short, commit.subject, verdict, shown, str(p.replicates)))
    return out


def change_lines(b: Bisected) -> list[tuple[bool, str]]:
    """(named to one commit, its line) per change: 'abc1234 "subject" (after def5678): 3.0x higher, ...'."""
    lines = []
    for c in b.outcome.changes:
        before, after = b.commits[c.before], b.commits[c.after]
        pb, pa = b.outcome.points.get(c.before), b.outcome.points.get(c.after)
        span = ""
        if pb is not None and pa is not None and pb.usable and pa.usable:
            span = f", {pb.result.measured.text(level=True)} -> {pa.result.measured.text(level=True)}"
        if c.decided:
            lines.append((True, f"{after.short} {after.subject!r} (after {before.short}): {c.moved}{span}"))
        else:
            lines.append((False, f"undecided between {before.short} and {after.short}: {c.moved}"))
    return lines


def text(b: Bisected) -> str:
    table = rows(b)
    widths = [max([len(h)] + [len(r[k][:50]) for r in table]) for k, h in enumerate(HEADERS)]
    lines = [f"perfkit bisect {b.options.id}: {VERDICT_WORDS[b.outcome.verdict]}: {b.outcome.words}"]
    lines.append("  " + "  ".join(h.ljust(w) for h, w in zip(HEADERS, widths)))
    for r in table:
        lines.append("  " + "  ".join(v[:50].ljust(w) for v, w in zip(r, widths)).rstrip())
    for decided, line in change_lines(b):
        lines.append(f"culprit: {line}" if decided else line)
    lines.append(f"the record and plot: {b.folder}/bisect.json, bisect.png")
    return "\n".join(lines) + "\n"


def markdown(b: Bisected) -> str:
    """A pull-request comment: what was bisected, the culprits, and the commits measured."""
    lines = [
        f"### perfkit bisect {code(b.options.id)}: {VERDICT_WORDS[b.outcome.verdict]}",
        "",
        f"From {code(b.commits[0].short)} (good) to {code(b.commits[-1].short)} (bad), {len(b.commits)} commits; "
        f"{cell(b.outcome.words)}. Two commits are told apart only when their between-process intervals "
        "(95%) do not overlap.",
        "",
    ]
    for _, line in change_lines(b):
        lines.append(f"- {cell(line)}")
    lines += ["", "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    for short, subject, verdict, shown, replicates in rows(b):
        lines.append(f"| {code(short)} | {cell(subject)} | {verdict} | {cell(shown)} | {replicates} |")
    return "\n".join(lines) + "\n"


def plot(b: Bisected) -> bytes:
    """The measurement with its interval against commit order, each change marked between its two commits."""
    from perfkit.experiment.records.plots import COLORS, figure
    from perfkit.experiment.records.verdict import Verdict

    fig = figure(7.2, 3.8)
    ax = fig.add_axes((0.1, 0.22, 0.86, 0.62))
    measured = [(i, p) for i, p in sorted(b.outcome.points.items()) if p.usable]
    for i, p in measured:
        m = p.result.measured
        color = COLORS.get(Verdict(p.result.verdict), "#333333")
        ax.errorbar([i], [m.value], yerr=[[m.value - m.low], [m.high - m.value]], fmt="o", color=color, capsize=3)
    for c in b.outcome.changes:
        ax.axvspan(c.before + 0.1, c.after - 0.1, color="#c62828" if c.decided else "#ef6c00", alpha=0.15, lw=0)
    skipped = [i for i, p in b.outcome.points.items() if not p.usable]
    for i in skipped:
        ax.axvline(i, color="#9e9e9e", ls=":", lw=1)
    ax.set_xticks(range(len(b.commits)), [c.short[:7] for c in b.commits], rotation=60, fontsize=7, ha="right")
    ax.set_xlim(-0.5, len(b.commits) - 0.5)
    if measured:
        m = measured[0][1].result.measured
        label = m.label if m.label != "mean" else "measured"
        ax.set_ylabel(f"{label} ({m.unit})" if m.unit else label, fontsize=8)
    ax.tick_params(axis="y", labelsize=8)
    ax.set_xlabel("commit, oldest first (shaded: where it changed; dotted: not measurable)", fontsize=8)
    fig.suptitle(
        f"bisect {b.options.id}: {VERDICT_WORDS[b.outcome.verdict]}", fontsize=10, fontweight="bold", x=0.02, ha="left"
    )
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120, metadata={"Software": None})
    return buffer.getvalue()
