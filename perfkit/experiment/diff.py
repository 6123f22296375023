"""`perfkit diff`: what a change did to the ledger, for a reviewer, as `asv compare` does for benchmarks.

Compares the standing verdict of every hypothesis (the latest unprofiled measurement, as the
ledger's table shows it) in the working tree's results with those at a git revision (default:
the merge base with the main branch) or in another results folder. Changes come first, in this
order: verdict flips, measurements that could not be reproduced, hypotheses added, removed or
edited, then measurements that moved beyond both intervals (with the factor); the unchanged come
last, collapsed. A measurement "moved" only when the two 95% intervals are disjoint: a move inside
the noise is not news.

The exit status is a CI gate: 1 when a change of a kind named in `fail_on` is present.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfkit import units
from perfkit.errors import UserError
from perfkit.experiment.ledger import history, measured_text, standing
from perfkit.experiment.results import HypothesisResult, RunResults, load_all_results
from perfkit.files import read_json
from perfkit.paths import Project, git

#: Kinds of change, in the order a reviewer reads them.
KINDS = ("flip", "not-reproduced", "added", "removed", "edited", "moved", "unchanged")
#: What `--fail-on` can name: a kind of change, or `refuted` / `error` for a flip to that verdict.
FAIL_ON = ("flip", "refuted", "error", "not-reproduced", "added", "removed", "edited", "moved")
DEFAULT_FAIL_ON = ("refuted", "error", "not-reproduced")
MAIN_BRANCHES = ("main", "master")


@dataclass(frozen=True)
class Change:
    id: str
    kind: str  # one of KINDS
    base: HypothesisResult | None
    current: HypothesisResult | None
    base_run: str | None
    current_run: str | None
    factor: float | None = None  # current / base value when the intervals are disjoint (positive quantities)
    shift: float | None = None  # current - base when disjoint and a ratio means nothing (exponents, signs)

    @property
    def verdict_words(self) -> str:
        before = self.base.verdict if self.base else "—"
        after = self.current.verdict if self.current else "—"
        return after if before == after else f"{before} → {after}"

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "verdict": {
                "base": self.base.verdict if self.base else None,
                "current": self.current.verdict if self.current else None,
            },
            "measured": {
                "base": measured_text(self.base) if self.base else None,
                "current": measured_text(self.current) if self.current else None,
            },
            "runs": {"base": self.base_run, "current": self.current_run},
            "factor": self.factor,
            "shift": self.shift,
        }


# ---------------------------------------------------------------- reading the base


def default_base(project: Project) -> str:
    """The merge base with the main branch; on the main branch itself, HEAD (the last commit)."""
    head = git(project.root, "rev-parse", "HEAD").strip()
    for branch in MAIN_BRANCHES:
        for ref in (f"origin/{branch}", branch):
            try:
                base = git(project.root, "merge-base", "HEAD", ref).strip()
            except UserError:
                continue
            return "HEAD" if base == head else base
    return "HEAD"


def results_at(project: Project, revision: str, *, skip: set[str] = frozenset()) -> list[RunResults]:
    """Every results file as committed at `revision` (but those of the run ids in `skip`)."""
    folder = project.relative(project.results_dir)
    prefix = git(project.root, "rev-parse", "--show-prefix").strip()
    git(
        project.root, "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}"
    )  # a bad revision is the user's error
    try:
        listing = git(project.root, "ls-tree", "--name-only", f"{revision}:{prefix}{folder}")
    except UserError:
        return []  # the revision has no results yet
    out = []
    for name in sorted(n for n in listing.splitlines() if n.endswith(".json") and n[: -len(".json")] not in skip):
        shown = f"{revision}:{folder}/{name}"
        try:
            data = json.loads(git(project.root, "show", f"{revision}:{prefix}{folder}/{name}"))
        except ValueError:
            raise UserError(f"{shown}: not JSON") from None
        out.append(RunResults.from_json(data, shown))
    return out


def results_in(folder: Path) -> list[RunResults]:
    """Every results file in a folder (another checkout's hypotheses/ledger/results)."""
    if not folder.is_dir():
        raise UserError(f"{folder}: no such folder of results")
    return [RunResults.from_json(read_json(p, str(p)), str(p)) for p in sorted(folder.glob("*.json"))]


def load_base(project: Project, base: str | None) -> tuple[str, list[RunResults]]:
    """(how the base is named, its results): a folder path, or a git revision (default: the merge base)."""
    if base is not None and Path(base).is_dir():
        return base, results_in(Path(base))
    revision = base or default_base(project)
    return revision, results_at(project, revision)


# ---------------------------------------------------------------- comparing


def _move(base: HypothesisResult, current: HypothesisResult) -> tuple[float | None, float | None]:
    """(factor, shift) of current against base when both intervals exist and do not overlap, else (None, None).

    A factor (current / base) for positive quantities in compatible units; a shift (current - base)
    for exponents and values that can be zero or negative, where a ratio means nothing.
    """
    a, b = base.measured, current.measured
    if a is None or b is None:
        return None, None
    scale = 1.0
    if a.unit != b.unit:
        if not (a.unit and b.unit and units.dimension(a.unit) == units.dimension(b.unit)):
            return None, None
        scale = units.factor(b.unit, a.unit)
    low, high, value = b.low * scale, b.high * scale, b.value * scale
    if low <= a.high and high >= a.low:
        return None, None  # the intervals overlap: no move beyond the noise
    if a.label == "exponent" or a.value <= 0 or value <= 0:
        return None, value - a.value
    return value / a.value, None


def compare(base: list[RunResults], current: list[RunResults]) -> list[Change]:
    """Every hypothesis in either, as one Change each, in reading order (KINDS, then id)."""
    before = {hid: standing(runs) for hid, runs in history(base).items()}
    after = {hid: standing(runs) for hid, runs in history(current).items()}
    changes = []
    for hid in sorted(set(before) | set(after)):
        b, a = before.get(hid), after.get(hid)
        br, ar = (b.result if b else None), (a.result if a else None)
        move: tuple[float | None, float | None] = (None, None)
        if br is None:
            kind = "added"
        elif ar is None:
            kind = "removed"
        elif br.verdict != ar.verdict:
            kind = "flip"
        elif ar.not_reproduced and a.run_id != b.run_id:
            kind = "not-reproduced"
        elif br.hash != ar.hash:
            kind = "edited"
        elif a.run_id != b.run_id and _move(br, ar) != (None, None):
            kind = "moved"
        else:
            kind = "unchanged"
        if br is not None and ar is not None and kind != "unchanged":
            move = _move(br, ar)
        changes.append(Change(hid, kind, br, ar, b.run_id if b else None, a.run_id if a else None, *move))
    return sorted(changes, key=lambda c: (KINDS.index(c.kind), c.id))


def failing(changes: list[Change], fail_on: tuple[str, ...]) -> list[Change]:
    """The changes that make the gate fail."""
    out = []
    for c in changes:
        to = c.current.verdict if c.current else None
        if c.kind in fail_on or (c.kind in ("flip", "added") and to in ("refuted", "error") and to in fail_on):
            out.append(c)
    return out


def parse_fail_on(text: str) -> tuple[str, ...]:
    if text.strip() in ("", "none"):
        return ()
    words = tuple(w.strip() for w in text.split(",") if w.strip())
    unknown = [w for w in words if w not in FAIL_ON]
    if unknown:
        raise UserError(f"--fail-on: unknown {', '.join(unknown)}; choose from {', '.join(FAIL_ON)} or none")
    return words


# ---------------------------------------------------------------- showing


def _move_text(change: Change) -> str:
    if change.factor is not None:
        f = change.factor
        if 0.5 < f < 2:
            return f"{units.format_number(abs(f - 1) * 100)}% {'higher' if f >= 1 else 'lower'}"
        return f"{units.format_factor(f)} higher" if f >= 1 else f"{units.format_factor(1 / f)} lower"
    if change.shift is not None:
        return f"{'+' if change.shift >= 0 else '-'}{units.format_number(abs(change.shift))}"
    return ""


def text(changes: list[Change], base_name: str) -> str:
    counts = {k: sum(1 for c in changes if c.kind == k) for k in KINDS}
    lines = [f"perfkit diff {base_name} -> working tree: " + ", ".join(f"{n} {k}" for k, n in counts.items() if n)]
    for c in changes:
        if c.kind == "unchanged":
            continue
        was = measured_text(c.base) if c.base else "—"
        now = measured_text(c.current) if c.current else "—"
        moved = f" ({_move_text(c)})" if _move_text(c) else ""
        lines.append(f"  {c.kind:<15} {c.id:<34} {c.verdict_words:<26} {was} -> {now}{moved}")
    return "\n".join(lines) + "\n"


def markdown(changes: list[Change], base_name: str, *, plots_url: str = "hypotheses/ledger/") -> str:
    """A pull-request comment: the changes as a short table with plot thumbnails, the unchanged collapsed."""
    counts = {k: sum(1 for c in changes if c.kind == k) for k in KINDS}
    summary = ", ".join(f"{n} {k}" for k, n in counts.items() if n) or "no hypotheses"
    lines = [f"### perfkit: {summary}", "", f"Against `{base_name}`; intervals are 95%.", ""]
    changed = [c for c in changes if c.kind != "unchanged"]
    if changed:
        lines += [
            "| change | hypothesis | verdict | before | after | moved | plot |",
            "|---|---|---|---|---|---|---|",
        ]
        for c in changed:
            plot = c.current.plot if c.current and c.current.plot else None
            thumb = f'<img src="{plots_url}{plot}" width="120">' if plot else ""
            lines.append(
                f"| {c.kind} | `{c.id}` | {c.verdict_words} | {measured_text(c.base) if c.base else '—'} "
                f"| {measured_text(c.current) if c.current else '—'} | {_move_text(c)} | {thumb} |"
            )
    else:
        lines.append("No verdict or measurement changed.")
    unchanged = [c for c in changes if c.kind == "unchanged"]
    if unchanged:
        lines += ["", f"<details><summary>{len(unchanged)} unchanged</summary>", ""]
        lines += [f"- `{c.id}`: {c.verdict_words}, {measured_text(c.current) or '—'}" for c in unchanged]
        lines += ["", "</details>"]
    return "\n".join(lines) + "\n"


def diff(project: Project, base: str | None) -> tuple[str, list[Change]]:
    """(the base's name, the changes from it to the working tree's results)."""
    name, before = load_base(project, base)
    return name, compare(before, load_all_results(project))
