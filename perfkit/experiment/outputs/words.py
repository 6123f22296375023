"""The phrases every output writes the same way: a measurement, its evidence, how far off, a flip, a run."""

from __future__ import annotations

import re
from urllib.parse import quote

from perfkit.experiment.records.results import HypothesisResult, RunResults
from perfkit.text import printable

# What a results file could use to end a table cell, a code span or open raw HTML, written as itself.
_MARKDOWN = str.maketrans({"\\": "\\\\", "|": "\\|", "`": "\\`", "&": "&amp;", "<": "&lt;", ">": "&gt;"})
_LINK = re.compile(r"\]\(|!\[")  # what makes a link or an image of text: `[text](url)`, `![alt](url)`
_PLAIN = re.compile(r"[A-Za-z0-9_.:/=+-]+")  # nothing here can end a code span or a cell


def cell(text: str | None) -> str:
    """Text from a results file as one Markdown table cell (or list item): one line, shown as written
    (controls written out by `perfkit.text.printable`: LEDGER.md stays a text file whatever a probe said)."""
    if not text:
        return "—"
    shown = _LINK.sub(lambda m: m.group()[0] + "\\" + m.group()[1], text.translate(_MARKDOWN))
    return " ".join(printable(shown.replace("\t", " ")).splitlines()).strip()


def code(text: str) -> str:
    """An id as a code span; anything a span could not hold safely is written as a `cell` instead."""
    return f"`{text}`" if _PLAIN.fullmatch(text) else cell(text)


def url(path: str) -> str:
    """A relative path as it may stand in an HTML attribute or a Markdown link: no quote, space or bracket raw."""
    return quote(path, safe="/")


DEFAULT_LEVEL = "95%"  # what the headers of every view say; a measurement judged at another level says its own
LEVEL_NOTE = (
    "A measurement marked with another level (95.5%, 99.6%) comes from a run that could look at the evidence\n"
    "more than once: each look is judged at the share of the 5% it spends, and the verdict with it.\n"
)


def measured_text(result: HypothesisResult) -> str | None:
    """'0.18 ms [0.16, 0.21]', or '... (98.3% interval)' when the verdict was judged at another level than 95%."""
    if result.measured is None:
        return None
    level = result.measured.level()
    return result.measured.text() + ("" if level == DEFAULT_LEVEL else f" ({level} interval)")


def measured_or_why(result: HypothesisResult | None) -> str:
    """What a side of a comparison measured, in words: the interval, 'not measured: why', or '—' (absent)."""
    if result is None:
        return "—"
    return measured_text(result) or f"not measured: {result.reason or result.verdict}"


def other_levels(results: list[HypothesisResult]) -> bool:
    """Whether any of these was judged at another level than the headers' 95%."""
    return any(r.measured is not None and r.measured.level() != DEFAULT_LEVEL for r in results)


def evidence_text(result: HypothesisResult) -> str | None:
    """What the interval rests on and why the run stopped adding replicates."""
    parts = [p for p in (result.measured.evidence() if result.measured else None, result.stopped) if p]
    return "; ".join(parts) or None


def flip_note(previous: str | None, current: str, *, mark: str = "") -> str | None:
    """'flip (was refuted)' when a verdict changed from the previous run's; `mark` emphasizes the word."""
    if previous is None or previous == current:
        return None
    return f"{mark}flip{mark} (was {previous})"


def off_by_text(result: HypothesisResult) -> str | None:
    if result.measured is None:
        return result.reason
    if result.reason:
        return f"{result.off_by} ({result.reason})" if result.off_by else result.reason
    return result.off_by


def run_words(run: RunResults | None) -> str:
    """How a run measured, in a few words: mode, commit, profiler."""
    if run is None:
        return ""
    commit = (run.git_commit or "")[:8]
    parts = ["quick" if run.quick else "full"]
    if commit:
        parts.append(commit + (" dirty" if run.git_dirty else ""))
    if run.profile:
        parts.append(f"profiled: {run.profile}")
    return ", ".join(parts)
