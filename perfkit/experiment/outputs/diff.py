"""`perfkit diff` written out: a terminal summary, and markdown for a pull-request comment."""

from __future__ import annotations

import html

from perfkit.experiment.compare import KINDS, Change, move_words
from perfkit.experiment.outputs.words import cell, code, measured_or_why, other_levels, url


def _move_text(change: Change) -> str:
    return move_words(change.factor, change.shift)


def text(changes: list[Change], base_name: str) -> str:
    counts = {k: sum(1 for c in changes if c.kind == k) for k in KINDS}
    lines = [f"perfkit diff {base_name} -> working tree: " + ", ".join(f"{n} {k}" for k, n in counts.items() if n)]
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


def markdown(changes: list[Change], base_name: str, *, plots_url: str = "hypotheses/ledger/") -> str:
    """A pull-request comment: the changes as a short table with plot thumbnails, the unchanged collapsed."""
    counts = {k: sum(1 for c in changes if c.kind == k) for k in KINDS}
    summary = ", ".join(f"{n} {k}" for k, n in counts.items() if n) or "no hypotheses"
    shown = [r for c in changes for r in (c.base, c.current) if r is not None]
    levels = "95% unless marked" if other_levels(shown) else "95%"
    lines = [f"### perfkit: {summary}", "", f"Against {code(base_name)}; intervals are {levels}.", ""]
    changed = [c for c in changes if c.kind != "unchanged"]
    if changed:
        lines += [
            "| change | hypothesis | verdict | before | after | moved | plot |",
            "|---|---|---|---|---|---|---|",
        ]
        for c in changed:
            plot = c.current.plot if c.current and c.current.plot else None
            thumb = f'<img src="{html.escape(plots_url)}{url(plot)}" width="120">' if plot else ""
            after = measured_or_why(c.current) + (f"; {c.attempt}" if c.attempt else "")
            if c.expectation:
                after += f"; the expectation moved: {c.expectation}"
            lines.append(
                f"| {c.kind} | {code(c.id)} | {cell(c.verdict_words)} | {cell(measured_or_why(c.base))} "
                f"| {cell(after)} | {_move_text(c)} | {thumb} |"
            )
    else:
        lines.append("No verdict or measurement changed.")
    unchanged = [c for c in changes if c.kind == "unchanged"]
    if unchanged:
        lines += ["", f"<details><summary>{len(unchanged)} unchanged</summary>", ""]
        lines += [f"- {code(c.id)}: " + cell(f"{c.verdict_words}, {measured_or_why(c.current)}") for c in unchanged]
        lines += ["", "</details>"]
    return "\n".join(lines) + "\n"
