"""`perfkit diff` written out: a terminal summary, and markdown for a pull-request comment."""

from __future__ import annotations

import html

from perfkit.experiment.outputs.words import cell, code, measured_or_why, other_levels, url
from perfkit.experiment.records.compare import KINDS, Change, move_words


def _move_text(change: Change) -> str:
    return move_words(change.factor, change.shift)


def text(changes: list[Change], base_name: str) -> str:
    counts = {k: sum(1 for c in changes if c.kind == k) for k in KINDS}
    lines = [f"perfkit diff {base_name} -> working tree: " + counted(counts)]
    for c in changes:
        if c.kind == "unchanged":
            continue
        moved = f" ({_move_text(c)})" if _move_text(c) else ""
        was, now = measured_or_why(c.base), measured_or_why(c.current)
        lines.append(f"  {c.kind:<17} {c.id:<34} {c.verdict_words:<26} {was} -> {now}{moved}")
        for said in (f"the expectation moved: {c.expectation}" if c.expectation else None, c.attempt):
            if said:
                lines.append(f"  {'':<17} {'':<34} {said}")
    return "\n".join(lines) + "\n"


PLOT_WIDTH = 380  # px: before and after side by side in a pull-request comment's ~800-px column


def counted(counts: dict[str, int]) -> str:
    """'1 flip, 2 flips, 3 unchanged': the kinds of change with their counts, 'flip' the one noun among them."""
    return ", ".join(f"{n} {k}{'s' if k == 'flip' and n != 1 else ''}" for k, n in counts.items() if n)


def _plots(c: Change, plots_url: str, base_plots_url: str | None, base_name: str) -> list[str]:
    """Before and after plots side by side at a readable width, each captioned; [] when neither has one."""
    shown = {}
    if base_plots_url is not None and c.base is not None and c.base.plot:
        src = html.escape(base_plots_url) + url(c.base.plot)
        shown["before"] = f'<img src="{src}" width="{PLOT_WIDTH}" alt="before ({html.escape(base_name)})">'
    if c.current is not None and c.current.plot:
        src = html.escape(plots_url) + url(c.current.plot)
        shown["after"] = f'<img src="{src}" width="{PLOT_WIDTH}" alt="after">'
    return [f"{' and '.join(shown)}:", "", " ".join(shown.values()), ""] if shown else []


def markdown(
    changes: list[Change],
    base_name: str,
    *,
    plots_url: str = "hypotheses/ledger/",
    base_plots_url: str | None = None,
) -> str:
    """A pull-request comment: the changes as a short table, then each change with its before and after
    plots side by side (the base's from `base_plots_url`, when given); the unchanged collapsed."""
    counts = {k: sum(1 for c in changes if c.kind == k) for k in KINDS}
    summary = counted(counts) or "no hypotheses"
    shown = [r for c in changes for r in (c.base, c.current) if r is not None]
    levels = "95% unless marked" if other_levels(shown) else "95%"
    lines = [f"### perfkit: {summary}", "", f"Against {code(base_name)}; intervals are {levels}.", ""]
    changed = [c for c in changes if c.kind != "unchanged"]
    if changed:
        lines += ["| change | hypothesis | verdict | before → after | moved |", "|---|---|---|---|---|"]
        sections = []
        for c in changed:
            after = measured_or_why(c.current) + (f"; {c.attempt}" if c.attempt else "")
            if c.expectation:
                after += f"; the expectation moved: {c.expectation}"
            lines.append(
                f"| {c.kind} | {code(c.id)} | {cell(c.verdict_words)} | {cell(measured_or_why(c.base))} → "
                f"{cell(after)} | {_move_text(c) or '—'} |"
            )
            sections += [f"#### {code(c.id)}: {cell(c.verdict_words)}", ""]
            claim = (c.current or c.base).claim if (c.current or c.base) else ""
            sections += [cell(claim), ""] if claim else []
            sections += _plots(c, plots_url, base_plots_url, base_name)
        lines += ["", *sections]
    else:
        lines.append("No verdict or measurement changed.")
    unchanged = [c for c in changes if c.kind == "unchanged"]
    if unchanged:
        lines += ["", f"<details><summary>{len(unchanged)} unchanged</summary>", ""]
        lines += [f"- {code(c.id)}: " + cell(f"{c.verdict_words}, {measured_or_why(c.current)}") for c in unchanged]
        lines += ["", "</details>"]
    return "\n".join(lines).rstrip("\n") + "\n"
