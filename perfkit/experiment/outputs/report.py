"""`perfkit report`: the ledger as one static HTML page to look at, with every plot and history.

The page (index.html, with the plots copied beside it under plots/, or inside it as data: URIs
with `--single-file`) is made from the committed results alone, like LEDGER.md, so the same
results give the same bytes. It opens with a table of contents and holds the table of standing
verdicts with thumbnails, what changed against a base (`perfkit diff`), and per
hypothesis its plot, its measurements over time (an SVG of each interval, run by run) and its
history. No script or style is fetched from anywhere: it opens from a file, offline.
"""

from __future__ import annotations

import base64
import functools
import html
import shutil
from collections.abc import Callable
from pathlib import Path

from perfkit import units
from perfkit.experiment.outputs.changes import change_line
from perfkit.experiment.outputs.words import evidence_text, measured_text, off_by_text, other_levels, run_words, url
from perfkit.experiment.records import compare as diffs
from perfkit.experiment.records.history import Entry, history, standing
from perfkit.experiment.records.results import RunResults
from perfkit.experiment.records.series import changes as series_changes
from perfkit.experiment.records.series import series_of_history
from perfkit.files import write_atomic
from perfkit.paths import Project

_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #ccc; padding: 4px 8px; vertical-align: top; text-align: left; }
th { background: #f4f4f4; }
.confirmed { color: #176b2c; font-weight: bold; } .refuted { color: #a11; font-weight: bold; }
.inconclusive { color: #8a6d00; font-weight: bold; } .error { color: #fff; background: #a11; font-weight: bold; }
section { border-top: 1px solid #ddd; margin-top: 2em; }
code { background: #f4f4f4; padding: 0 3px; }
"""

# Counts the images that loaded and those that did not, once the page has loaded: a browser test
# (and a person wondering why a plot is missing) reads it from <body data-images="...">.
_SCRIPT = """
window.addEventListener("load", function () {
  var ok = 0, broken = 0;
  for (var img of document.images) { if (img.complete && img.naturalWidth > 0) ok++; else broken++; }
  document.body.dataset.images = "ok " + ok + " broken " + broken;
});
"""


def _e(text: object) -> str:
    return html.escape("—" if text is None or text == "" else str(text))


def _verdict(verdict: str) -> str:
    return f'<span class="{_e(verdict)}">{_e(verdict)}</span>'


def _when(run_id: str) -> tuple[str, str]:
    """('2026-12-01', '13:58') from a run id '20261201-135845': two runs of one day told apart."""
    if len(run_id) >= 13 and run_id[:8].isdigit() and run_id[8] == "-" and run_id[9:13].isdigit():
        return f"{run_id[:4]}-{run_id[4:6]}-{run_id[6:8]}", f"{run_id[9:11]}:{run_id[11:13]}"
    return run_id[:10], run_id[10:16]


def _chart(runs: list[Entry]) -> str:
    """Each measurement's interval and point, run by run, as a small SVG (empty without two)."""
    shown = [e for e in runs if e.result.measured is not None]
    if len(shown) < 2:
        return ""
    lows = [e.result.measured.low for e in shown]
    highs = [e.result.measured.high for e in shown]
    bottom, top = min(lows), max(highs)
    span = (top - bottom) or 1.0
    width, height, pad = 60 * len(shown) + 40, 150, 30

    def y(v: float) -> float:
        return round(height - pad - (v - bottom) / span * (height - 2 * pad), 1)

    parts = [f'<svg width="{width}" height="{height}" role="img" aria-label="measurements over runs">']
    for i, e in enumerate(shown):
        x = 40 + 60 * i
        m = e.result.measured
        parts.append(f'<line x1="{x}" x2="{x}" y1="{y(m.low)}" y2="{y(m.high)}" stroke="#555" stroke-width="2"/>')
        parts.append(f'<circle cx="{x}" cy="{y(m.value)}" r="4" class="{_e(e.result.verdict)}" fill="currentColor"/>')
        day, clock = _when(e.run_id)
        parts.append(
            f'<text x="{x}" y="{height - 14}" font-size="9" text-anchor="middle"><title>run {_e(e.run_id)}</title>'
            f'{_e(day)}<tspan x="{x}" dy="10">{_e(clock)}</tspan></text>'
        )
    unit = shown[-1].result.measured.unit
    parts.append(f'<text x="2" y="12" font-size="10">{_e(units.format_quantity(top, unit))}</text>')
    parts.append(f'<text x="2" y="{height - pad}" font-size="10">{_e(units.format_quantity(bottom, unit))}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _contents(entries: dict, changes: list[diffs.Change] | None, base_name: str | None) -> str:
    """The table of contents: the changes, the standing verdicts, then every hypothesis with its verdict."""
    items = ['<li><a href="#changes">Changes</a></li>'] if changes is not None or base_name else []
    items.append('<li><a href="#verdicts">Standing verdicts</a><ul>')
    for hid, runs in entries.items():
        items.append(
            f'<li><a href="#{_e(hid)}"><code>{_e(hid)}</code></a> {_verdict(standing(runs).result.verdict)}</li>'
        )
    items.append("</ul></li>")
    return '<nav id="contents"><h2>Contents</h2><ul>' + "".join(items) + "</ul></nav>"


def _section(hid: str, runs: list[Entry], found: list, image: Callable[[str], str]) -> list[str]:
    """A hypothesis's section: its verdict, plot, measurements over runs, change points and history."""
    r = standing(runs).result
    out = [
        f'<section id="{_e(hid)}"><h2><code>{_e(hid)}</code> {_verdict(r.verdict)}</h2>',
        f"<p>{_e(r.claim)}</p>",
    ]
    if r.plot:
        out.append(f'<img src="{_e(image(r.plot))}" alt="plot of {_e(hid)}" style="max-width: 100%">')
    out.append(_chart(runs))
    said = [change_line(c) for s in found for c in series_changes(s) if c.status != "not confirmed"]
    if said:  # as `perfkit changes` says them, one a line
        out.append("<p><b>Change points</b> (<code>perfkit history</code>):</p><ul>")
        out += [f"<li>{_e(line)}</li>" for line in said]
        out.append("</ul>")
    out.append("<table><tr><th>run</th><th>how</th><th>verdict</th><th>measured [95% interval]</th></tr>")
    for e in runs:
        out.append(
            f"<tr><td>{_e(e.run_id)}</td><td>{_e(run_words(e.run))}</td><td>{_verdict(e.result.verdict)}</td>"
            f"<td>{_e(measured_text(e.result))}</td></tr>"
        )
    out.append("</table></section>")
    return out


def render(
    all_results: list[RunResults],
    changes: list[diffs.Change] | None,
    base_name: str | None,
    image: Callable[[str], str] | None = None,
) -> str:
    """The page; `image(plot)` gives each plot's src (default: its path beside the page, plots/ID.png)."""
    image = image or url
    entries = history(all_results)
    found: dict[str, list] = {}
    for s in series_of_history(entries):
        found.setdefault(s.hypothesis, []).append(s)
    out = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8"><title>perfkit report</title>',
        f"<style>{_STYLE}</style><script>{_SCRIPT}</script></head><body>",
        "<h1>perfkit report</h1>",
        "<p>Generated from hypotheses/ledger/results/. Intervals are "
        + ("95% unless marked" if other_levels([e.result for runs in entries.values() for e in runs]) else "95%")
        + "; a verdict is confirmed when the whole interval satisfies the claim, refuted when the whole interval "
        "violates it.</p>",
        _contents(entries, changes, base_name),
    ]
    if changes is None and base_name:
        out.append(f'<h2 id="changes">Changes</h2><p>Not compared: {_e(base_name)}.</p>')
    if changes is not None:
        changed = [c for c in changes if c.kind != "unchanged"]
        out.append(f'<h2 id="changes">Changes against <code>{_e(base_name)}</code></h2>')
        if changed:
            out.append(
                "<table><tr><th>change</th><th>hypothesis</th><th>verdict</th><th>before</th><th>after</th></tr>"
            )
            for c in changed:
                out.append(
                    f'<tr><td>{_e(c.kind)}</td><td><a href="#{_e(c.id)}"><code>{_e(c.id)}</code></a></td>'
                    f"<td>{_e(c.verdict_words)}</td><td>{_e(measured_text(c.base) if c.base else None)}</td>"
                    f"<td>{_e(measured_text(c.current) if c.current else None)}</td></tr>"
                )
            out.append("</table>")
        else:
            out.append(f"<p>No verdict or measurement changed ({len(changes)} unchanged).</p>")
    out += [
        "<h2>Standing verdicts</h2>",
        '<table id="verdicts"><thead><tr><th>hypothesis</th><th>claim</th><th>expected</th>'
        "<th>measured [95% interval]</th><th>evidence</th><th>verdict</th><th>off by</th><th>run</th>"
        "<th>plot</th></tr></thead><tbody>",
    ]
    for hid, runs in entries.items():
        e = standing(runs)
        r = e.result
        thumb = (
            f'<a href="#{_e(hid)}"><img src="{_e(image(r.plot))}" width="120" alt="{_e(hid)}"></a>' if r.plot else "—"
        )
        out.append(
            f'<tr><td><a href="#{_e(hid)}"><code>{_e(hid)}</code></a></td><td>{_e(r.claim)}</td>'
            f"<td>{_e(r.expected)}</td><td>{_e(measured_text(r))}</td><td>{_e(evidence_text(r))}</td>"
            f"<td>{_verdict(r.verdict)}</td><td>{_e(off_by_text(r))}</td>"
            f"<td>{_e(e.run_id)}<br><small>{_e(run_words(e.run))}</small></td><td>{thumb}</td></tr>"
        )
    out.append("</tbody></table>")
    for hid, runs in entries.items():
        out += _section(hid, runs, found.get(hid, []), image)
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def inlined(project: Project) -> Callable[[str], str]:
    """A plot as a data: URI of its bytes (a missing plot: its path, which shows as a broken image);
    each plot is read and encoded once, though the page shows it twice (thumbnail and section)."""

    @functools.cache
    def image(plot: str) -> str:
        path = project.ledger_dir / plot
        if not path.is_file():
            return url(plot)
        return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")

    return image


def write(
    project: Project,
    out_dir: Path,
    all_results: list[RunResults],
    base: str | None = "auto",
    *,
    single_file: bool = False,
) -> Path:
    """index.html and its plots under out_dir; against `base` ("auto": the merge base, None: no diff).
    `single_file`: the plots inside the page (data: URIs), one file to attach or mail."""
    changes, base_name = None, None
    if base is not None:
        try:
            base_name, before = diffs.load_base(project, None if base == "auto" else base)
            changes = diffs.compare(before, all_results)
        except Exception as exc:  # no git, no base: the page says so and shows the rest
            if base != "auto":
                raise
            base_name, changes = f"no base ({exc})", None
    out_dir.mkdir(parents=True, exist_ok=True)
    if project.plots_dir.is_dir() and not single_file:
        (out_dir / "plots").mkdir(exist_ok=True)
        for plot in sorted(project.plots_dir.glob("*.png")):
            shutil.copyfile(plot, out_dir / "plots" / plot.name)
    page = out_dir / "index.html"
    write_atomic(page, render(all_results, changes, base_name, inlined(project) if single_file else None))
    return page
